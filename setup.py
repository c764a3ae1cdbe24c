"""The compiled parts, both optional: agentrt._jsonlpage (see agentrt/trace.py)
and agentrt._eventrows (see agentrt/store/pages.py)."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("agentrt._jsonlpage", ["agentrt/_jsonlpage.c"], optional=True),
    Extension("agentrt._eventrows", ["agentrt/_eventrows.c"], optional=True),
])

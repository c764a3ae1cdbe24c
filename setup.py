"""The one compiled part: agentrt._jsonlpage, optional (see agentrt/trace.py)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("agentrt._jsonlpage", ["agentrt/_jsonlpage.c"], optional=True)])

"""The install that `make test` and CI make: every dependency pinned, each pin
inside pyproject.toml's range, the running environment built from them, and
the two C modules built where a compiler is."""

from __future__ import annotations

import importlib
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from agentrt import trace
from agentrt.store import pages

ROOT = Path(__file__).resolve().parent.parent


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = Version(version)
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    named = project["dependencies"] + project["optional-dependencies"]["dev"]
    return [Requirement(r) for r in named]


def test_every_dependency_is_pinned_within_its_range() -> None:
    pins = _pins()
    for req in _requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in constraints.txt: run make constraints"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {req.name} {pins[name]}, outside pyproject's {req.specifier}")


def test_the_test_environment_has_the_pinned_versions() -> None:
    for name, version in _pins().items():
        installed = Version(metadata.version(name))
        assert installed == version, (
            f"{name} {installed} is installed, constraints.txt pins {version}: run make install")


def test_the_license_is_declared_as_spdx_with_its_text() -> None:
    """A license table is deprecated by setuptools (builds stop working in 2027)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"
    assert all((ROOT / f).is_file() for f in project["license-files"])


def _built_where_a_compiler_is(module: str, function: str, user: object, attr: str) -> None:
    """An optional C module is built wherever a compiler is (a missing one is a
    failed build), and ``user.attr`` is its function, or None without it."""
    try:
        built = getattr(importlib.import_module(module), function)
    except ImportError:
        compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
        assert shutil.which(compiler) is None, (
            f"{module} was not built although a C compiler is here: see pip's output")
        assert getattr(user, attr) is None
    else:
        assert getattr(user, attr) is built


def test_the_c_record_writer_is_built_where_a_compiler_is() -> None:
    """Without agentrt._jsonlpage the JSONL export would be 2.5x slower."""
    _built_where_a_compiler_is("agentrt._jsonlpage", "join_records", trace, "_join_records")


def test_the_c_page_builder_is_built_where_a_compiler_is() -> None:
    """Without agentrt._eventrows a follower's page reads would cost a seventh more."""
    _built_where_a_compiler_is("agentrt._eventrows", "events_of", pages, "_events_of")


def test_every_package_of_the_tree_is_in_the_distribution() -> None:
    """A non-editable install (pip install .) carries only what pyproject names:
    a subpackage left out installs an agentrt that cannot import itself."""
    import setuptools

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set(setuptools.find_packages(str(ROOT), **config["packages"]["find"]))
    tree = {str(p.parent.relative_to(ROOT)).replace("/", ".")
            for top in ("agentrt", "agentrt_export", "agentrt_otel")
            for p in (ROOT / top).rglob("__init__.py")}
    assert tree <= found, sorted(tree - found)
    assert {"agentrt.store", "agentrt.driver", "agentrt.view"} <= found


def test_the_export_package_gives_its_names_and_submodules_when_first_used():
    """The package imports lazily (so the command can take its stop signals before
    the imports); what it gave when it imported everything at once it still gives."""
    code = ("import sys, agentrt_export\n"
            "assert 'agentrt_export.follower' not in sys.modules\n"
            "print(agentrt_export.follower.HeadNotFoundError.__name__, "
            "agentrt_export.sinks.JSONLSink.__name__, agentrt_export.Follower.__name__)\n"
            "from agentrt_export import *\n"
            "print(sorted(set(agentrt_export.__all__) - set(dir(agentrt_export))), FileCursor)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=str(ROOT), check=True)
    assert done.stdout.splitlines() == [
        "HeadNotFoundError JSONLSink Follower",
        "[] <class 'agentrt_export.cursor.FileCursor'>"]

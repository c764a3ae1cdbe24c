"""The install that `make test` and CI make: every dependency pinned, each pin
inside pyproject.toml's range, and the running environment built from them."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

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

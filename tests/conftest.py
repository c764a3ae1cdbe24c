"""Shared test setup: make the helper modules in tests/ importable by name, and
check that no test changed the committed fixtures."""

import hashlib
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "fixtures")
_COMMITTED = ("runs.db", "runs.jsonl", "spans.json")
_SIDECARS = ("runs.db-wal", "runs.db-shm", "runs.db-journal")


def _state() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in _COMMITTED + _SIDECARS:
        path = os.path.join(_FIXTURES, name)
        try:
            with open(path, "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
        except FileNotFoundError:
            out[name] = None
    return out


@pytest.fixture(scope="session", autouse=True)
def committed_fixtures_are_unchanged_by_the_suite():
    """The fixture database is read-only input: tests copy it before anything that
    could write. Compared after the last test: a change fails the session."""
    before = _state()
    yield
    after = _state()
    changed = [name for name in before if before[name] != after[name]]
    assert not changed, f"the test suite changed fixtures/{changed}; tests must copy it first"

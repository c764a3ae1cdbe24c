"""Shared test setup: make the helper modules in tests/ importable by name,
check that no test changed the committed fixtures, and the ``waits`` fixture
(the driver's retry waits, recorded and not slept)."""

import hashlib
import os
import sys
from datetime import timedelta

import pytest

from agentrt.driver import CancelToken

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


@pytest.fixture
def waits(monkeypatch) -> list[timedelta]:
    """Every retry wait the driver asks for, recorded and not slept."""
    seen: list[timedelta] = []
    original = CancelToken.wait

    def record(self, seconds=None):
        seen.append(timedelta(seconds=seconds))
        return original(self, 0)

    monkeypatch.setattr(CancelToken, "wait", record)
    return seen

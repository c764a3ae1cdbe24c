"""Shared helpers for the fixture tests: copies of the committed fixture, and the
golden spans to compare what an exporter sends with, across restarts too."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eventdb import REPO_ROOT

from fixtures.golden import ordered

FIXTURES = Path(REPO_ROOT) / "fixtures"
DB = FIXTURES / "runs.db"
JSONL = FIXTURES / "runs.jsonl"
SPANS = FIXTURES / "spans.json"
GOLDEN_FILES = (DB, JSONL, SPANS)

#: What to tell the reader when a committed golden does not match.
STALE = ("the committed fixtures are stale (the runtime or an exporter changed what it "
         "writes): run `make fixtures` (python -m fixtures.generate fixtures), review the "
         "diff of fixtures/runs.jsonl and fixtures/spans.json, and commit all three files")


def copy_fixture(directory: Path) -> str:
    """A private 0600 copy of the committed database: tests never open the original,
    whatever mode a checkout gave it."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "runs.db"
    shutil.copyfile(DB, target)
    os.chmod(target, 0o600)
    return str(target)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def golden_spans() -> list[dict[str, Any]]:
    return json.loads(SPANS.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def identity(span: dict[str, Any]) -> tuple[str, str, str, str | None]:
    return (span["name"], span["trace_id"], span["span_id"], span["parent_span_id"])


def distinct(spans: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The spans in the golden order with exact duplicates (a page sent again
    after a kill) dropped. Across restarts this must be the golden list: every
    span the same as in one pass, whatever process sent it."""
    unique = {json.dumps(s, sort_keys=True): s for s in spans}
    return ordered(unique.values())


def to_ns(rfc3339: str) -> int:
    """Nanoseconds since the epoch of a golden time (``...Z``, up to 9 fraction digits)."""
    whole, _, frac = rfc3339.removesuffix("Z").partition(".")
    seconds = int(datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp())
    return seconds * 1_000_000_000 + int(frac.ljust(9, "0"))

"""Shared helpers for the fixture tests: copies of the committed fixture, and the
rules a span exported across restarts must meet against the golden one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eventdb import REPO_ROOT

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


#: Attributes a span rebuilt after a restart may lack, because the store keeps no
#: record of them (agentrt_otel.mapping's "known limits"): an approval's reason,
#: and policy attributes of a step's earlier rulings (only its latest is stored).
MAY_LACK_AFTER_RESTART = frozenset({"agentrt.approval.reason", "agentrt.policy.kind"})


def restart_differences(got: dict[str, Any], golden: dict[str, Any]) -> list[str]:
    """How a span made by an exporter that restarted differs from the golden span
    beyond the known limits of restart invariance; empty when it does not.

    Must hold: the same identity, kind, end, status and description; no
    ``start_unknown`` flag; every attribute it has equals the golden one, and
    it lacks only :data:`MAY_LACK_AFTER_RESTART`; its events are the golden
    span's last ones (events before a restart are not rebuilt); its start is
    the golden start, except a step that waited for an approval, which a
    restart rebuilds from its stored start (the resume time).
    """
    out = []
    for key in ("name", "trace_id", "span_id", "parent_span_id", "kind", "end", "status"):
        if got[key] != golden[key]:
            out.append(f"{key}: {got[key]!r} != {golden[key]!r}")
    if got.get("status_description") != golden.get("status_description"):
        out.append("status_description differs")
    attrs, want = got["attributes"], golden["attributes"]
    if "agentrt.span.start_unknown" in attrs:
        out.append("start_unknown is set")
    for key, value in attrs.items():
        if want.get(key) != value:
            out.append(f"attribute {key}: {value!r} != {want.get(key)!r}")
    missing = set(want) - set(attrs) - MAY_LACK_AFTER_RESTART
    if missing:
        out.append(f"attributes missing: {sorted(missing)}")
    events = got["events"]
    if events and events != golden["events"][-len(events):]:
        out.append("events are not the golden span's last events")
    waited = any(e["name"] == "approval.requested" for e in golden["events"])
    if got["start"] != golden["start"] and not (
            golden["name"] == "agentrt.step" and waited
            and to_ns(golden["start"]) <= to_ns(got["start"]) <= to_ns(got["end"])):
        out.append(f"start: {got['start']} != {golden['start']}")
    return out


def to_ns(rfc3339: str) -> int:
    """Nanoseconds since the epoch of a golden time (``...Z``, up to 9 fraction digits)."""
    whole, _, frac = rfc3339.removesuffix("Z").partition(".")
    seconds = int(datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp())
    return seconds * 1_000_000_000 + int(frac.ljust(9, "0"))

"""Page reads: bounded reads for a front end facing a database it may not trust.

Each reads at most the rows asked for after an offset, caps every text column
at ``MAX_PAGE_TEXT`` characters (the head plus a marker with the full length),
replaces an oversized JSON column with ``{"truncated":true,"length":n,
"head":...}`` (still JSON), and takes its total from a COUNT. Neither many
rows nor one huge row can exhaust the reader's memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apsw

from agentrt.errors import AgentrtError, NotFoundError
from agentrt.events import Event
from agentrt.records import MAX_PAGE_TEXT, Approval, Run, Step
from agentrt.store.rows import approval_from_row, event_from_row, run_from_row, step_from_row

__all__ = [
    "approvals_page",
    "capped_json",
    "capped_text",
    "events_after",
    "events_page",
    "pending_ids_of",
    "run_capped",
    "runs_page",
    "steps_page",
]

N = MAX_PAGE_TEXT


def _fits(col: str) -> str:
    # octet_length reads only the record header; a value of at most N bytes
    # cannot exceed N characters, so most rows never count characters.
    return f"(octet_length({col}) <= {N} OR length({col}) <= {N})"


def capped_text(col: str) -> str:
    """SQL for a text column cut to N characters plus ``…[truncated: L characters]``."""
    return (
        f"CASE WHEN {_fits(col)} THEN {col} ELSE substr({col}, 1, {N}) || "
        f"'…[truncated: ' || length({col}) || ' characters]' END"
    )


def capped_json(col: str) -> str:
    """SQL for a JSON column replaced, when too long, by the truncation object."""
    return (
        f"CASE WHEN {_fits(col)} THEN {col} ELSE json_object('truncated', json('true'), "
        f"'length', length({col}), 'head', substr({col}, 1, {N})) END"
    )


def _check_page(what: str, limit: int, offset: int) -> None:
    if limit <= 0 or offset < 0:
        raise PageError(f"list {what}: limit {limit} and offset {offset}")


class PageError(AgentrtError):
    """A page read asked for no rows or a negative offset."""

    base = "agentrt"


_RUN_PAGE_COLUMNS = ", ".join(
    [
        capped_text("id"),
        capped_text("goal"),
        capped_text("status"),
        capped_text("reason"),
        capped_text("reason_detail"),
        f"CASE WHEN {_fits('limits_json')} THEN limits_json ELSE '' END",
        "step_count",
        capped_text("created_at"),
        capped_text("started_at"),
        capped_text("finished_at"),
        capped_json("result_json"),
        "model_calls, input_tokens, output_tokens, cached_input_tokens, "
        "estimated_cost_micros, active_ms",
        capped_text("lease_owner"),
        capped_text("lease_expires_at"),
    ]
)


def _count(conn: apsw.Connection, sql: str, params: Sequence[Any] = ()) -> int:
    row = conn.execute(sql, tuple(params)).fetchone()
    return int(row[0]) if row else 0


def runs_page(conn: apsw.Connection, limit: int, offset: int) -> tuple[list[Run], int]:
    """Runs newest first by insertion; damaged limits read as zero, bad times as zero."""
    _check_page("runs", limit, offset)
    rows = conn.execute(
        f"SELECT {_RUN_PAGE_COLUMNS} FROM runs ORDER BY rowid DESC LIMIT ? OFFSET ?",
        (limit, offset),
    ).fetchall()
    total = _count(conn, "SELECT COUNT(*) FROM runs")
    return [run_from_row(r, lenient=True) for r in rows], total


def run_capped(conn: apsw.Connection, run_id: str) -> Run:
    row = conn.execute(f"SELECT {_RUN_PAGE_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"run {run_id}")
    return run_from_row(row, lenient=True)


def _small_object(col: str, fields: Sequence[str]) -> str:
    parts = ", ".join(
        f"'{f}', substr(json_extract({col}, '$.{f}'), 1, {N})" for f in fields
    )
    return f"CASE WHEN json_valid({col}) THEN json_object({parts}) ELSE '' END"


_STEP_SMALL = {
    "decision_json": ("kind", "tool"),
    "policy_json": ("outcome",),
    "observation_json": ("kind", "summary"),
}


def _step_columns() -> str:
    cols = [capped_text("id"), capped_text("run_id"), "idx", capped_text("status")]
    for col, fields in _STEP_SMALL.items():
        cols.append(f"CASE WHEN {_fits(col)} THEN {col} ELSE {_small_object(col, fields)} END")
    cols += [
        capped_text("observation_hash"),
        capped_text("started_at"),
        capped_text("finished_at"),
        capped_text("spec_hash"),
        capped_text("policy_id"),
    ]
    cols += [f"CASE WHEN {_fits(col)} THEN 0 ELSE length({col}) END" for col in _STEP_SMALL]
    return ", ".join(cols)


_STEP_PAGE_COLUMNS = _step_columns()
_STEP_LABELS = {"decision_json": "decision", "policy_json": "policy",
                "observation_json": "observation"}


def steps_page(
    conn: apsw.Connection, run_id: str, limit: int, offset: int
) -> tuple[list[Step], int]:
    """A run's steps by index; a column over the cap is read as its identifying fields."""
    _check_page("steps", limit, offset)
    rows = conn.execute(
        f"SELECT {_STEP_PAGE_COLUMNS} FROM steps WHERE run_id = ? ORDER BY idx LIMIT ? OFFSET ?",
        (run_id, limit, offset),
    ).fetchall()
    total = _count(conn, "SELECT COUNT(*) FROM steps WHERE run_id = ?", (run_id,))
    steps = []
    for r in rows:
        step = step_from_row(r[:12])
        notes = [
            f"{_STEP_LABELS[col]}: {length} characters, over MaxPageText, not read whole"
            for col, length in zip(_STEP_SMALL, r[12:15], strict=True)
            if length
        ]
        if notes:
            step.decode_error = "; ".join(([step.decode_error] if step.decode_error else [])
                                          + notes)
        steps.append(step)
    return steps, total


_APPROVAL_PAGE_COLUMNS = ", ".join(
    [
        capped_text("id"),
        capped_text("run_id"),
        capped_text("step_id"),
        capped_text("kind"),
        capped_json("capability_json"),
        capped_json("presentation_json"),
        f"CASE WHEN {_fits('request_json')} THEN request_json "
        f"WHEN json_valid(request_json) THEN json_object("
        f"'run_id', substr(json_extract(request_json, '$.run_id'), 1, {N}), "
        f"'step_id', substr(json_extract(request_json, '$.step_id'), 1, {N}), "
        f"'spec', json_object('name', substr(json_extract(request_json, '$.spec.name'), 1, {N})),"
        f" 'args', json_object('truncated', json('true'), 'length', length(request_json))) "
        f"ELSE '' END",
        capped_text("hash"),
        capped_text("status"),
        capped_text("created_at"),
        capped_text("expires_at"),
        capped_text("decided_at"),
        capped_text("decided_by"),
        capped_text("note"),
        f"CASE WHEN {_fits('request_json')} THEN 0 ELSE length(request_json) END",
    ]
)


def approvals_page(
    conn: apsw.Connection, run_id: str, status: str, limit: int, offset: int
) -> tuple[list[Approval], int]:
    """A run's approvals in insertion order, optionally of one status.

    An oversized request is read as its identifying fields with no arguments;
    to decide an approval, re-read it whole with ``get_approval`` (hash binding).
    """
    _check_page("approvals", limit, offset)
    where = "run_id = ?" + (" AND status = ?" if status else "")
    params: tuple[Any, ...] = (run_id, status) if status else (run_id,)
    rows = conn.execute(
        f"SELECT {_APPROVAL_PAGE_COLUMNS} FROM approvals WHERE {where} "
        "ORDER BY rowid LIMIT ? OFFSET ?",
        params + (limit, offset),
    ).fetchall()
    total = _count(conn, f"SELECT COUNT(*) FROM approvals WHERE {where}", params)
    out = []
    for r in rows:
        approval = approval_from_row(r[:14])
        if r[14]:
            note = (f"request: {r[14]} characters, over MaxPageText; "
                    "its arguments were not read")
            approval.decode_error = "; ".join(
                ([approval.decode_error] if approval.decode_error else []) + [note])
        out.append(approval)
    return out, total


_EVENT_PAGE_COLUMNS = ", ".join(
    [
        "seq",
        capped_text("run_id"),
        capped_text("step_id"),
        capped_text("at"),
        capped_text("type"),
        capped_json("payload_json"),
    ]
)


def events_page(
    conn: apsw.Connection, run_id: str, limit: int, offset: int
) -> tuple[list[Event], int]:
    _check_page("events", limit, offset)
    rows = conn.execute(
        f"SELECT {_EVENT_PAGE_COLUMNS} FROM events WHERE run_id = ? ORDER BY seq "
        "LIMIT ? OFFSET ?",
        (run_id, limit, offset),
    ).fetchall()
    total = _count(conn, "SELECT COUNT(*) FROM events WHERE run_id = ?", (run_id,))
    return [event_from_row(r) for r in rows], total


_AFTER_ALL = (
    f"SELECT {_EVENT_PAGE_COLUMNS} FROM events WHERE seq > ? ORDER BY seq LIMIT ?"
)
_AFTER_RUN = (
    f"SELECT {_EVENT_PAGE_COLUMNS} FROM events WHERE seq > ? AND run_id = ? "
    "ORDER BY seq LIMIT ?"
)


def events_after(conn: apsw.Connection, run_id: str, seq: int, limit: int) -> list[Event]:
    """At most ``limit`` events after ``seq`` in commit order, of one run or of all."""
    if limit <= 0:
        raise PageError(f"list events: limit {limit} and offset 0")
    if run_id:
        cursor = conn.execute(_AFTER_RUN, (seq, run_id, limit))
    else:
        cursor = conn.execute(_AFTER_ALL, (seq, limit))
    return [event_from_row(r) for r in cursor.fetchall()]


def pending_ids_of(
    conn: apsw.Connection, run_ids: Sequence[str], per_run: int
) -> dict[str, list[str]]:
    """Pending approval ids of the named waiting runs, at most ``per_run`` each."""
    if not run_ids or per_run <= 0:
        return {}
    marks = ", ".join("?" for _ in run_ids)
    rows = conn.execute(
        "SELECT run_id, id FROM ("
        f"SELECT a.run_id AS run_id, {capped_text('a.id')} AS id, "
        "ROW_NUMBER() OVER (PARTITION BY a.run_id ORDER BY a.rowid) AS rn "
        "FROM approvals a JOIN runs r ON r.id = a.run_id "
        f"WHERE a.status = 'pending' AND r.status = 'WAITING_FOR_APPROVAL' "
        f"AND a.run_id IN ({marks})) WHERE rn <= ? ORDER BY run_id, rn",
        (*run_ids, per_run),
    ).fetchall()
    out: dict[str, list[str]] = {}
    for run_id, approval_id in rows:
        out.setdefault(str(run_id), []).append(str(approval_id))
    return out

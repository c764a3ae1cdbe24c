"""Rows to records: the column lists every read selects and how each decodes.

A row that will not decode does not make its run unreadable: steps and
approvals come back with ``decode_error`` set and the undecodable fields
empty, so the run can still be listed, shown and cancelled.

Text that is not UTF-8 is the Python-specific way a row fails to decode:
SQLite stores the bytes it is given, and apsw refuses to turn invalid UTF-8
into ``str``, which would fail the whole query. :func:`fetch` therefore runs
the fast query first and, only if a value will not decode, runs it again with
every text column read as bytes and decoded with U+FFFD replacements.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import apsw

from agentrt.errors import NotFoundError, described
from agentrt.events import Event, event_from_fields
from agentrt.gojson import replace_lone_surrogates
from agentrt.records import (
    Approval,
    Decision,
    Limits,
    ModelCall,
    Observation,
    PolicyDecision,
    Run,
    Step,
    ToolRequest,
    Usage,
)
from agentrt.timefmt import parse_time

__all__ = [
    "APPROVAL_COLUMNS",
    "EVENT_COLUMNS",
    "MODEL_CALL_COLUMNS",
    "RUN_COLUMNS",
    "STEP_COLUMNS",
    "Columns",
    "approval_from_row",
    "blob_expr",
    "events_from_rows",
    "fetch",
    "model_call_from_row",
    "not_found",
    "run_from_row",
    "step_from_row",
    "text_expr",
]

T = TypeVar("T")

#: Marks a selected expression whose value is text (read leniently on fallback).
TEXT = "text"
#: Marks an expression read as bytes (JSON columns) or a number.
OTHER = "other"


@dataclass(frozen=True, slots=True)
class Columns:
    """A select list, in a fast form and in a form that survives invalid UTF-8."""

    fast: str
    safe: str
    text_positions: tuple[int, ...]
    #: The bare column names, in order, for writes of a full row.
    names: str

    @classmethod
    def of(cls, parts: Sequence[tuple[str, str]], names: Sequence[str] = ()) -> Columns:
        fast = ", ".join(expr for expr, _ in parts)
        safe = ", ".join(
            f"CAST(({expr}) AS BLOB)" if kind == TEXT else expr for expr, kind in parts
        )
        return cls(fast, safe, tuple(i for i, (_, k) in enumerate(parts) if k == TEXT),
                   ", ".join(names))

    def decode(self, row: Sequence[Any]) -> tuple[Any, ...]:
        out = list(row)
        for i in self.text_positions:
            v = out[i]
            if isinstance(v, bytes):
                out[i] = v.decode("utf-8", "replace")
        return tuple(out)


def not_found(what: str, **ids: object) -> Exception:
    """Nothing matched: an id that is not a str is said as such (it could not
    have matched), any other as not found, with a lone surrogate (which no
    stored id holds: writes store U+FFFD) shown as U+FFFD."""
    for name, value in ids.items():
        if not isinstance(value, str):
            return TypeError(f"agentrt: {name} is {described(value)}, not a str")
    return NotFoundError(replace_lone_surrogates(what))


# A row another tool stored with a blob id (the runtime stores text): page
# reads list it by the blob's text, and a lookup by that text never finds it.
# Both are index lookups (a blob compares equal only to a blob), so a miss
# costs what a hit does, however many rows the table has.
_BLOB_RUN = "SELECT 1 FROM runs WHERE id = CAST(? AS BLOB) LIMIT 1"
_BLOB_APPROVAL = ("SELECT 1 FROM approvals WHERE id = CAST(?1 AS BLOB) "
                  "AND run_id IN (?2, CAST(?2 AS BLOB)) LIMIT 1")


def run_not_found(conn: apsw.Connection, run_id: str) -> Exception:
    """:func:`not_found` for a run, saying so when its id is stored as a blob."""
    return _unless_a_blob(conn, f"run {run_id}", _BLOB_RUN, (run_id,), run_id=run_id)


def approval_not_found(conn: apsw.Connection, run_id: str, approval_id: str) -> Exception:
    """:func:`not_found` for an approval, saying so when its id is a blob."""
    return _unless_a_blob(conn, f"approval {approval_id} of run {run_id}", _BLOB_APPROVAL,
                          (approval_id, run_id), run_id=run_id, approval_id=approval_id)


def _unless_a_blob(conn: apsw.Connection, what: str, sql: str, params: tuple[str, ...],
                   **ids: object) -> Exception:
    error = not_found(what, **ids)
    if not isinstance(error, NotFoundError):
        return error
    try:
        stored = conn.execute(sql, params).fetchall()
    except (apsw.Error, UnicodeEncodeError):
        stored = []
    if not stored:
        return error
    return NotFoundError(f"{replace_lone_surrogates(what)}: its id is stored as a blob, not "
                         "text (another tool wrote it), so it is listed by that text but "
                         "cannot be read or decided by it; store the id as text")


def fetch(
    conn: apsw.Connection, cols: Columns, rest: str, params: Sequence[Any] = ()
) -> list[tuple[Any, ...]]:
    """``SELECT <cols> <rest>``: every row, text as ``str`` even when not UTF-8."""
    try:
        return conn.execute(f"SELECT {cols.fast} {rest}", tuple(params)).fetchall()
    except UnicodeDecodeError:
        rows = conn.execute(f"SELECT {cols.safe} {rest}", tuple(params)).fetchall()
        return [cols.decode(r) for r in rows]
    except UnicodeEncodeError:
        # A lone surrogate in a parameter, which UTF-8 cannot hold: writes
        # store such text with U+FFFD (``Tx``), so reads look for that.
        return fetch(conn, cols, rest, [
            replace_lone_surrogates(v) if isinstance(v, str) else v for v in params])


def text_expr(name: str) -> str:
    """A text column as ``str``: a BLOB or number stored in it is cast, NULL reads ''."""
    return f"ifnull(CAST({name} AS TEXT), '')"


def blob_expr(name: str) -> str:
    """A JSON column as ``bytes`` exactly as stored; NULL reads as empty."""
    return f"ifnull(CAST({name} AS BLOB), X'')"


def _texts(*names: str) -> list[tuple[str, str]]:
    return [(text_expr(n), TEXT) for n in names]


def _others(*names: str) -> list[tuple[str, str]]:
    return [(f"ifnull({n}, 0)", OTHER) for n in names]


def _blob(name: str) -> tuple[str, str]:
    return (blob_expr(name), OTHER)


_INT = "int"
_BLOB = "blob"


def _record(*columns: tuple[str, str]) -> Columns:
    """A table's columns as ``(name, kind)``: text as str, int, or blob as bytes."""
    parts: list[tuple[str, str]] = []
    for name, kind in columns:
        if kind == TEXT:
            parts += _texts(name)
        elif kind == _INT:
            parts += _others(name)
        else:
            parts.append(_blob(name))
    return Columns.of(parts, [name for name, _ in columns])


def _kinds(kind: str, *names: str) -> list[tuple[str, str]]:
    return [(n, kind) for n in names]


RUN_COLUMNS = _record(
    *_kinds(TEXT, "id", "goal", "status", "reason", "reason_detail", "limits_json"),
    ("step_count", _INT),
    *_kinds(TEXT, "created_at", "started_at", "finished_at"),
    ("result_json", _BLOB),
    *_kinds(_INT, "model_calls", "input_tokens", "output_tokens", "cached_input_tokens",
            "estimated_cost_micros", "active_ms"),
    *_kinds(TEXT, "lease_owner", "lease_expires_at"),
)
STEP_COLUMNS = _record(
    *_kinds(TEXT, "id", "run_id"), ("idx", _INT),
    *_kinds(TEXT, "status", "decision_json", "policy_json", "observation_json",
            "observation_hash", "started_at", "finished_at", "spec_hash", "policy_id"),
)
APPROVAL_COLUMNS = _record(
    *_kinds(TEXT, "id", "run_id", "step_id", "kind"),
    ("capability_json", _BLOB), ("presentation_json", _BLOB),
    *_kinds(TEXT, "request_json", "hash", "status", "created_at", "expires_at", "decided_at",
            "decided_by", "note"),
)
MODEL_CALL_COLUMNS = _record(
    *_kinds(TEXT, "id", "run_id", "step_id"), ("attempt", _INT),
    *_kinds(TEXT, "status", "model"),
    *_kinds(_INT, "input_tokens", "output_tokens", "cached_input_tokens", "cost_micros",
            "latency_ms"),
    *_kinds(TEXT, "error", "dispatched_at", "completed_at"),
)
#: seq is the rowid (always an integer); the rest come back as str and bytes,
#: so each row becomes an Event with one tuple copy (:func:`events_from_rows`;
#: ``list_events_after`` turns the row itself into it, see pages.py).
EVENT_COLUMNS = Columns.of(
    [("seq", OTHER)] + _texts("run_id", "step_id", "at", "type") + [_blob("payload_json")]
)


def _text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _bytes(v: Any) -> bytes:
    if v is None:
        return b""
    if isinstance(v, bytes):
        return v
    return str(v).encode("utf-8")


def _int(v: Any) -> int:
    """A count column as an int; what is not one (text, a BLOB, and an infinite
    REAL, which SQLite stores for an integer too large for 64 bits) reads as 0."""
    try:
        return int(v or 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def _lenient_time(text: Any) -> datetime | None:
    try:
        return parse_time(_text(text))
    except ValueError:
        return None


def _decode(errors: list[str], label: str, fn: Callable[[], T], default: T) -> T:
    try:
        return fn()
    except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as exc:
        errors.append(f"{label}: {exc}")
        return default


def _time(errors: list[str], label: str, text: Any) -> datetime | None:
    return _decode(errors, label, lambda: parse_time(_text(text)), None)


def run_from_row(row: Sequence[Any], *, lenient: bool = False) -> Run:
    """A run; ``lenient`` (page reads) reads damaged limits as zero and bad times as zero.

    Strict reads raise ValueError on damage: the driver must not act on a run
    it cannot read.
    """
    limits_text = _text(row[5])
    if lenient:
        try:
            limits = Limits.from_json(limits_text)
        except (ValueError, TypeError, RecursionError):
            limits = Limits()
        parse: Callable[[Any], datetime | None] = _lenient_time
    else:
        limits = Limits.from_json(limits_text)

        def parse(v: Any) -> datetime | None:
            return parse_time(_text(v))

    return Run(
        id=_text(row[0]),
        goal=_text(row[1]),
        status=_text(row[2]),
        reason=_text(row[3]),
        reason_detail=_text(row[4]),
        limits=limits,
        step_count=_int(row[6]),
        created_at=parse(row[7]),
        started_at=parse(row[8]),
        finished_at=parse(row[9]),
        result=_bytes(row[10]),
        model_calls=_int(row[11]),
        usage=Usage(_int(row[12]), _int(row[13]), _int(row[14])),
        estimated_cost_micros=_int(row[15]),
        active_ms=_int(row[16]),
        lease_owner=_text(row[17]),
        lease_expires_at=parse(row[18]),
    )


def step_from_row(row: Sequence[Any]) -> Step:
    errors: list[str] = []
    decision_text, policy_text, observation_text = _text(row[4]), _text(row[5]), _text(row[6])
    decision = (
        _decode(errors, "decision", lambda: Decision.from_json(decision_text), None)
        if decision_text else None
    )
    policy = (
        _decode(errors, "policy", lambda: PolicyDecision.from_json(policy_text), None)
        if policy_text else None
    )
    observation = (
        _decode(errors, "observation", lambda: Observation.from_json(observation_text), None)
        if observation_text else None
    )
    started = _time(errors, "started_at", row[8])
    finished = _time(errors, "finished_at", row[9])
    return Step(
        id=_text(row[0]),
        run_id=_text(row[1]),
        index=_int(row[2]),
        status=_text(row[3]),
        decision=decision,
        policy=policy,
        observation=observation,
        started_at=started,
        finished_at=finished,
        spec_hash=_text(row[10]),
        policy_id=_text(row[11]),
        decode_error="; ".join(errors),
    )


def approval_from_row(row: Sequence[Any]) -> Approval:
    errors: list[str] = []
    request_text = _text(row[6])
    request = _decode(errors, "request", lambda: ToolRequest.from_json(request_text), None)
    created = _time(errors, "created_at", row[9])
    expires = _time(errors, "expires_at", row[10])
    decided = _time(errors, "decided_at", row[11])
    return Approval(
        id=_text(row[0]),
        run_id=_text(row[1]),
        step_id=_text(row[2]),
        kind=_text(row[3]),
        capability=_bytes(row[4]),
        presentation=_bytes(row[5]),
        request=request,
        hash=_text(row[7]),
        status=_text(row[8]),
        created_at=created,
        expires_at=expires,
        decided_at=decided,
        decided_by=_text(row[12]),
        note=_text(row[13]),
        decode_error="; ".join(errors),
    )


def model_call_from_row(row: Sequence[Any]) -> ModelCall:
    return ModelCall(
        id=_text(row[0]),
        run_id=_text(row[1]),
        step_id=_text(row[2]),
        attempt=_int(row[3]),
        status=_text(row[4]),
        model=_text(row[5]),
        usage=Usage(_int(row[6]), _int(row[7]), _int(row[8])),
        cost_micros=_int(row[9]),
        latency_ms=_int(row[10]),
        error=_text(row[11]),
        dispatched_at=_lenient_time(row[12]),
        completed_at=_lenient_time(row[13]),
    )


def events_from_rows(rows: Iterable[Sequence[Any]]) -> list[Event]:
    """Events from rows selected as :data:`EVENT_COLUMNS` (or its capped form):
    an int, four str and bytes each, which need no conversion."""
    return list(map(event_from_fields, rows))

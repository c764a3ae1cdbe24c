"""Page reads: bounded reads for a front end facing a database it may not trust.

Each reads at most the rows asked for after an offset, caps every text column
at ``MAX_PAGE_TEXT`` characters (the head plus a marker with the full length),
replaces an oversized JSON column with ``{"truncated":true,"length":n,
"head":...}`` (still JSON), and takes its total from a COUNT. Neither many
rows nor one huge row can exhaust the reader's memory: SQLite hands a value
over the cap out as NULL without reading it, and the page read cuts it from
the blob handle in bounded chunks (see bigcells.py), in the read transaction
that read its row.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeGuard, cast

import apsw

from agentrt.errors import AgentrtError, described, shown_number
from agentrt.events import Event, event_from_fields
from agentrt.gojson import replace_lone_surrogates
from agentrt.records import MAX_PAGE_TEXT, Approval, Run, Step
from agentrt.store.bigcells import json_cut, read_cut, text_cut
from agentrt.store.rows import (
    EVENT_COLUMNS,
    OTHER,
    TEXT,
    Columns,
    approval_from_row,
    events_from_rows,
    fetch,
    run_from_row,
    run_not_found,
    step_from_row,
)

__all__ = [
    "MAX_WINDOW",
    "CappedColumns",
    "approvals_page",
    "capped_json",
    "capped_text",
    "events_after",
    "events_page",
    "fetch_capped",
    "marked_json",
    "marked_text",
    "pending_ids_of",
    "run_capped",
    "runs_page",
    "steps_page",
]

N = MAX_PAGE_TEXT


def _as_text(col: str) -> str:
    # A writer that binds JSON as bytes stores a BLOB; the JSON functions refuse
    # BLOBs and length() would count its bytes, so they all see it as text.
    return f"CAST({col} AS TEXT)"


def _fits(col: str, n: int = N) -> str:
    # octet_length reads only the record header; a value of at most N bytes
    # cannot exceed N characters, so most rows never count characters. Only a
    # value of at most 4 N bytes (N characters of up to 4 bytes) is counted,
    # and only without a NUL: length() stops at the first one, so a huge text
    # behind a NUL would count as short and be read whole.
    return (f"(octet_length({col}) <= {n} OR (octet_length({col}) <= {4 * n} "
            f"AND instr(CAST({col} AS BLOB), X'00') = 0 AND length({_as_text(col)}) <= {n}))")


def capped_text(col: str, n: int = N) -> str:
    """SQL for a text column cut to n characters plus ``…[truncated: L characters]``.

    Always text: a BLOB or number stored in the column is cast, NULL reads ''.
    SQLite loads a value over the cap whole to cut it: page reads use
    :func:`fetch_capped`, which does not.
    """
    text = _as_text(col)
    return (
        f"CASE WHEN {_fits(col, n)} THEN {text} WHEN {col} IS NULL THEN '' "
        f"ELSE substr({text}, 1, {n}) || '…[truncated: ' || length({text}) || ' characters]' END"
    )


def capped_json(col: str, n: int = N) -> str:
    """SQL for a JSON column as bytes, replaced when too long by the truncation
    object ``{"truncated":true,"length":L,"head":"<first n characters>"}``."""
    text = _as_text(col)
    return (
        f"CASE WHEN {_fits(col, n)} THEN CAST({col} AS BLOB) WHEN {col} IS NULL THEN X'' "
        f"ELSE CAST(json_object('truncated', json('true'), 'length', length({text}), "
        f"'head', substr({text}, 1, {n})) AS BLOB) END"
    )


def _marked(col: str, fitting: str, empty: str, n: int) -> str:
    """SQL for a capped column that leaves a value over the cap unread: the value
    when it fits, ``empty`` for NULL, and NULL (which no capped column reads as
    otherwise) for one over the cap. typeof(), like octet_length(), reads only
    the record header."""
    return f"CASE WHEN {_fits(col, n)} THEN {fitting} WHEN typeof({col}) = 'null' THEN {empty} END"


def marked_text(col: str, n: int = N) -> str:
    """:func:`capped_text` with a value over the cap left to :func:`fetch_capped`."""
    return _marked(col, _as_text(col), "''", n)


def marked_json(col: str, n: int = N) -> str:
    """:func:`capped_json` with a value over the cap left to :func:`fetch_capped`."""
    return _marked(col, f"CAST({col} AS BLOB)", "X''", n)


#: A capped column: its name and whether it is JSON.
Cell = tuple[str, bool]


@dataclass(frozen=True, slots=True)
class CappedColumns:
    """A page's select list, and where in it the capped columns of ``table`` are."""

    table: str
    columns: Columns
    #: The capped columns' positions in the select list, names and kinds.
    cells: tuple[tuple[int, str, bool], ...]
    #: Where the row's rowid is (appended when the page does not select it).
    rowid_at: int
    n: int = N

    @classmethod
    def of(cls, table: str, parts: Sequence[tuple[str, str, Cell | None]],
           rowid_at: int | None = None, n: int = N) -> CappedColumns:
        if rowid_at is None:
            rowid_at = len(parts)
            parts = [*parts, ("rowid", OTHER, None)]
        return cls(table, Columns.of([(expr, kind) for expr, kind, _ in parts]),
                   tuple((i, *cell) for i, (_, _, cell) in enumerate(parts)
                         if cell is not None), rowid_at, n)


def fetch_capped(conn: apsw.Connection, cols: CappedColumns, rest: str,
                 params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """``SELECT <cols> <rest>`` with every value over the cap cut from the blob
    handle, rows and cells read in one snapshot (ended here unless the caller's)."""
    with one_snapshot(conn):
        rows = fetch(conn, cols.columns, rest, params)
        return [_cut_cells(conn, cols, r) if None in r else r for r in rows]


def _cut_cells(conn: apsw.Connection, cols: CappedColumns,
               row: tuple[Any, ...]) -> tuple[Any, ...]:
    out = list(row)
    for i, column, is_json in cols.cells:
        if out[i] is None:
            head, length = read_cut(conn, cols.table, column, row[cols.rowid_at], cols.n)
            out[i] = json_cut(conn, head, length) if is_json else text_cut(head, length)
    return tuple(out)


#: The largest row count or offset SQLite takes (a signed 64-bit integer).
MAX_WINDOW = 2**63 - 1


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_page(what: str, limit: int, offset: int) -> None:
    if not (_is_int(limit) and _is_int(offset) and 0 < limit <= MAX_WINDOW
            and 0 <= offset <= MAX_WINDOW):
        raise _window_error(what, limit, offset)


def _window_error(what: str, limit: object, offset: object) -> PageError:
    """The one sentence for a page window that is not one: a limit or offset
    that is not an int, or beyond what SQLite counts; an empty or negative
    window in the reference's words."""
    for name, value in (("limit", limit), ("offset", offset)):
        if _is_int(value):
            if value > MAX_WINDOW:
                return PageError(f"list {what}: {name} {shown_number(value)} is more rows "
                                 f"than SQLite counts (at most {MAX_WINDOW})")
        else:
            return PageError(f"list {what}: {name} is {described(value)}, "
                             "not an int: pass a whole number of rows")
    return PageError(f"list {what}: limit {shown_number(limit)} and offset {shown_number(offset)}")


class PageError(AgentrtError):
    """A page read asked for no rows or a negative offset."""

    base = "agentrt"


def _t(col: str) -> tuple[str, str, Cell]:
    return (marked_text(col), TEXT, (col, False))


def _j(col: str) -> tuple[str, str, Cell]:
    return (marked_json(col), OTHER, (col, True))


def _n(col: str) -> tuple[str, str, None]:
    return (f"ifnull({col}, 0)", OTHER, None)


_RUN_PAGE = CappedColumns.of(
    "runs", [
        _t("id"), _t("goal"), _t("status"), _t("reason"), _t("reason_detail"),
        (f"CASE WHEN {_fits('limits_json')} THEN {_as_text('limits_json')} ELSE '' END", TEXT,
         None),
        _n("step_count"),
        _t("created_at"), _t("started_at"), _t("finished_at"),
        _j("result_json"),
        _n("model_calls"), _n("input_tokens"), _n("output_tokens"),
        _n("cached_input_tokens"), _n("estimated_cost_micros"), _n("active_ms"),
        _t("lease_owner"), _t("lease_expires_at"),
    ]
)


@contextmanager
def one_snapshot(conn: apsw.Connection) -> Iterator[None]:
    """A page's rows and its total read from one snapshot. In autocommit each
    statement sees the latest commit, so a writer's commit between the two could
    make the total disagree with the rows; a deferred read transaction holds one
    snapshot for both (none is begun inside a transaction already open)."""
    if conn.in_transaction:
        yield
        return
    conn.execute("BEGIN DEFERRED")
    try:
        yield
    finally:
        conn.execute("COMMIT")  # a read transaction: nothing to keep or undo


def _count(conn: apsw.Connection, sql: str, params: Sequence[Any] = ()) -> int:
    try:
        row = conn.execute(sql, tuple(params)).fetchone()
    except UnicodeEncodeError:  # a lone surrogate: looked up as stored, as ``fetch`` does
        row = conn.execute(sql, tuple(replace_lone_surrogates(v) if isinstance(v, str) else v
                                      for v in params)).fetchone()
    return int(row[0]) if row else 0


def runs_page(conn: apsw.Connection, limit: int, offset: int) -> tuple[list[Run], int]:
    """Runs newest first by insertion; damaged limits read as zero, bad times as zero."""
    _check_page("runs", limit, offset)
    rows = fetch_capped(conn, _RUN_PAGE, "FROM runs ORDER BY rowid DESC LIMIT ? OFFSET ?",
                        (limit, offset))
    total = _count(conn, "SELECT COUNT(*) FROM runs")
    return [run_from_row(r, lenient=True) for r in rows], total


def run_capped(conn: apsw.Connection, run_id: str) -> Run:
    """One run with the page reads' caps; NotFoundError when there is none."""
    rows = fetch_capped(conn, _RUN_PAGE, "FROM runs WHERE id = ?", (run_id,))
    if not rows:
        raise run_not_found(conn, run_id)
    return run_from_row(rows[0], lenient=True)


def _small_object(col: str, fields: Sequence[str]) -> str:
    text = _as_text(col)
    parts = ", ".join(
        f"'{f}', substr(json_extract({text}, '$.{f}'), 1, {N})" for f in fields
    )
    return f"CASE WHEN json_valid({text}) THEN json_object({parts}) ELSE '' END"


_STEP_SMALL = {
    "decision_json": ("kind", "tool"),
    "policy_json": ("outcome",),
    "observation_json": ("kind", "summary"),
}
_STEP_LABELS = {"decision_json": "decision", "policy_json": "policy",
                "observation_json": "observation"}

_STEP_PAGE = CappedColumns.of(
    "steps",
    [_t("id"), _t("run_id"), _n("idx"), _t("status")]
    + [
        (f"CASE WHEN {_fits(col)} THEN {_as_text(col)} WHEN {col} IS NULL THEN '' "
         f"ELSE {_small_object(col, fields)} END", TEXT, None)
        for col, fields in _STEP_SMALL.items()
    ]
    + [_t("observation_hash"), _t("started_at"), _t("finished_at"), _t("spec_hash"),
       _t("policy_id")]
    + [(f"CASE WHEN {_fits(col)} THEN 0 ELSE length({_as_text(col)}) END", OTHER, None)
       for col in _STEP_SMALL]
)


def steps_page(
    conn: apsw.Connection, run_id: str, limit: int, offset: int
) -> tuple[list[Step], int]:
    """A run's steps by index; a column over the cap is read as its identifying fields."""
    _check_page("steps", limit, offset)
    rows = fetch_capped(conn, _STEP_PAGE,
                        "FROM steps WHERE run_id = ? ORDER BY idx LIMIT ? OFFSET ?",
                        (run_id, limit, offset))
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


_REQUEST = _as_text("request_json")
_REQUEST_SMALL = (
    "json_object("
    f"'run_id', substr(json_extract({_REQUEST}, '$.run_id'), 1, {N}), "
    f"'step_id', substr(json_extract({_REQUEST}, '$.step_id'), 1, {N}), "
    f"'spec', json_object('name', substr(json_extract({_REQUEST}, '$.spec.name'), 1, {N})), "
    f"'args', json_object('truncated', json('true'), 'length', length({_REQUEST})))"
)

_APPROVAL_PAGE = CappedColumns.of(
    "approvals",
    [_t("id"), _t("run_id"), _t("step_id"), _t("kind"),
     _j("capability_json"), _j("presentation_json"),
     (f"CASE WHEN {_fits('request_json')} THEN {_REQUEST} "
      f"WHEN json_valid({_REQUEST}) THEN {_REQUEST_SMALL} ELSE '' END", TEXT, None),
     _t("hash"), _t("status"), _t("created_at"), _t("expires_at"), _t("decided_at"),
     _t("decided_by"), _t("note"),
     (f"CASE WHEN {_fits('request_json')} THEN 0 ELSE length({_REQUEST}) END", OTHER, None)]
)


def approvals_page(
    conn: apsw.Connection, run_id: str, status: str, limit: int, offset: int,
    after_id: str | None = None,
) -> tuple[list[Approval], int]:
    """A run's approvals in insertion order, optionally of one status. With
    ``after_id``, the page starts after that approval of the run when its id
    reads back exactly as stored, and at ``offset`` otherwise (an id a page
    read cut, decoded or read from NULL names no row to start after).

    An oversized request is read as its identifying fields with no arguments;
    to decide an approval, re-read it whole with ``get_approval`` (hash binding).
    """
    _check_page("approvals", limit, offset)
    if after_id is not None and not isinstance(after_id, str):
        raise PageError(f"list approvals: after_id is {described(after_id)}, not a str: "
                        "name the last approval read, or None for the first page")
    where = "run_id = ?" + (" AND status = ?" if status else "")
    params: tuple[Any, ...] = (run_id, status) if status else (run_id,)
    anchor = _approval_rowid(conn, run_id, after_id) if after_id is not None else None
    window, window_params = (("AND rowid > ? ORDER BY rowid LIMIT ?", (anchor, limit))
                             if anchor is not None else
                             ("ORDER BY rowid LIMIT ? OFFSET ?", (limit, offset)))
    rows = fetch_capped(conn, _APPROVAL_PAGE, f"FROM approvals WHERE {where} {window}",
                        params + window_params)
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


#: seq is the events' rowid (``refuse_foreign_shape`` makes sure of it).
_EVENT_PAGE = CappedColumns.of(
    "events",
    [("seq", OTHER, None), _t("run_id"), _t("step_id"), _t("at"), _t("type"),
     _j("payload_json")],
    rowid_at=0,
)
_AFTER_ALL = "FROM events WHERE seq > ? ORDER BY seq LIMIT ?"
_AFTER_RUN = "FROM events WHERE seq > ? AND run_id = ? ORDER BY seq LIMIT ?"


def events_page(
    conn: apsw.Connection, run_id: str, limit: int, offset: int
) -> tuple[list[Event], int]:
    """A run's events by seq, with each text column capped and the payload capped as JSON."""
    _check_page("events", limit, offset)
    rows = fetch_capped(conn, _EVENT_PAGE, "FROM events WHERE run_id = ? ORDER BY seq "
                        "LIMIT ? OFFSET ?", (run_id, limit, offset))
    total = _count(conn, "SELECT COUNT(*) FROM events WHERE run_id = ?", (run_id,))
    return events_from_rows(rows), total


# The follower's hot path reads the columns bare under a length limit of N
# bytes: a value of at most N bytes has at most N characters, so no cap
# applies and none is computed. A value over the limit makes SQLite refuse the
# query (TooBigError) before reading it, and the page is read again with the
# capping expressions. Measured in bench/bench_store.py.
_FAST_AFTER_COLUMNS = EVENT_COLUMNS.fast
_FAST_AFTER_ALL_SQL = f"SELECT {_FAST_AFTER_COLUMNS} {_AFTER_ALL}"
_FAST_AFTER_RUN_SQL = f"SELECT {_FAST_AFTER_COLUMNS} {_AFTER_RUN}"
# With the C module, the text columns are read as stored, with no conversion:
# a row where one is not text (NULL, a number, a blob) makes events_of answer
# None, and the page is read again with the converting columns above, so both
# give the same events. The payload is still cast: a blob is what an event holds.
_PLAIN_AFTER_COLUMNS = "seq, run_id, step_id, at, type, CAST(payload_json AS BLOB)"
_PLAIN_AFTER_ALL_SQL = f"SELECT {_PLAIN_AFTER_COLUMNS} {_AFTER_ALL}"
_PLAIN_AFTER_RUN_SQL = f"SELECT {_PLAIN_AFTER_COLUMNS} {_AFTER_RUN}"

try:
    from agentrt._eventrows import events_of as _events_of
except ImportError:  # installed without a C compiler: the same events, built slower
    _events_of = None  # type: ignore[assignment]


def _approval_rowid(conn: apsw.Connection, run_id: str, approval_id: str) -> int | None:
    """The rowid of the run's one approval a page read returns ``approval_id`` for:
    None unless exactly one row of the run reads back as it (a BLOB id reads as
    its text and a NULL one as '', so a stored text twin would be another row)
    and that row stores it as that very text, no longer than the cap."""
    try:
        rows = conn.execute(
            "SELECT rowid, typeof(id) = 'text' AND length(id) <= ? FROM approvals "
            "WHERE run_id = ? AND (CAST(id AS TEXT) = ? OR (id IS NULL AND ? = ''))",
            (N, run_id, approval_id, approval_id)).fetchall()
    except UnicodeEncodeError:  # a lone surrogate: read back from U+FFFD, not stored so
        return None
    return cast(int, rows[0][0]) if len(rows) == 1 and rows[0][1] else None


def events_after(conn: apsw.Connection, run_id: str, seq: int, limit: int) -> list[Event]:
    """At most ``limit`` events after ``seq`` in commit order, of one run or of all.

    The arguments are checked only when they fail (a bind that refuses them,
    a comparison with a limit that is not a number) or when the page is
    empty (a ``seq`` of None matches nothing): the follower's full pages pay
    nothing for it.
    """
    try:
        if limit <= 0:
            raise PageError(f"list events: limit {limit} and offset 0")
    except TypeError:
        _check_after(run_id, seq, limit)
        raise
    params: tuple[Any, ...] = (seq, run_id, limit) if run_id else (seq, limit)
    previous = conn.limit(apsw.SQLITE_LIMIT_LENGTH, N)
    try:
        events = None
        # Each row becomes its event (see _eventrows.c). Not under a row tracer
        # or a cursor factory a consumer set on the connection (store.db()):
        # what they return may be no row of ours, and they would see the
        # page's first row again when the page is re-read.
        if (_events_of is not None and conn.row_trace is None
                and conn.cursor_factory is apsw.Cursor):
            events = _events_of(conn.execute(
                _PLAIN_AFTER_RUN_SQL if run_id else _PLAIN_AFTER_ALL_SQL, params),
                event_from_fields)
        if events is None:
            # Mapping the cursor, not a fetched list, frees each row tuple as
            # its event is built: half the live objects for the garbage collector.
            events = events_from_rows(conn.execute(
                _FAST_AFTER_RUN_SQL if run_id else _FAST_AFTER_ALL_SQL, params))
        if not events and _matches_nothing(run_id, seq):
            _check_after(run_id, seq, limit)
        return events
    except (apsw.TooBigError, UnicodeDecodeError):
        pass
    except UnicodeEncodeError:
        _check_after(run_id, seq, limit)  # else a lone surrogate in the run id (see fetch)
    except (OverflowError, TypeError, apsw.MismatchError):
        _check_after(run_id, seq, limit)
        raise
    finally:
        conn.limit(apsw.SQLITE_LIMIT_LENGTH, previous)
    return events_from_rows(fetch_capped(conn, _EVENT_PAGE,
                                         _AFTER_RUN if run_id else _AFTER_ALL, params))


def _matches_nothing(run_id: object, seq: object) -> bool:
    """Whether the query could never return a row for these (an empty page is
    the only sign): a run id that is not text (a falsy one means every run),
    or a seq SQLite does not compare as a number (None, text that is not an
    integer, bytes)."""
    if run_id and not isinstance(run_id, str):
        return True
    if isinstance(seq, (int, float)):
        return False
    return not (isinstance(seq, str) and seq.strip().removeprefix("-").isdigit())


def _check_after(run_id: object, seq: object, limit: object) -> None:
    """Raise the sentence for arguments :func:`events_after` cannot use, if any."""
    if ((not run_id or isinstance(run_id, str)) and isinstance(seq, int)
            and isinstance(limit, int) and -MAX_WINDOW <= seq <= MAX_WINDOW
            and 0 < limit <= MAX_WINDOW):
        return
    if run_id and not isinstance(run_id, str):
        raise PageError(f"list events: run_id is {described(run_id)}, "
                        "not a str: name one run, or '' for every run")
    if not isinstance(seq, int):
        raise PageError(f"list events: seq is {described(seq)}, not an int: "
                        "pass the seq to read after (0 for the first event)")
    if not -MAX_WINDOW <= seq <= MAX_WINDOW:
        raise PageError(f"list events: seq {seq} is beyond any seq SQLite hands out "
                        f"(at most {MAX_WINDOW})")
    raise _window_error("events", limit, 0)


#: A pending approval's run, id (over the cap: cut from the blob handle) and rowid.
_PENDING = CappedColumns.of(
    "approvals", [("a.run_id", TEXT, None), (marked_text("a.id"), TEXT, ("id", False)),
                  ("a.rowid", OTHER, None)], rowid_at=2)


#: Run ids bound in one query (SQLite's limit is 32,766 variables).
_IDS_PER_QUERY = 10_000


def pending_ids_of(
    conn: apsw.Connection, run_ids: Sequence[str], per_run: int
) -> dict[str, list[str]]:
    """Pending approval ids of the named waiting runs, at most ``per_run`` each.

    The window numbers rowids only: SQLite's rewrite of a window query carries
    every column its select list names through a sorter, so an id selected
    beside ROW_NUMBER() would be read whole (and copied) however it is capped.
    """
    if not (_is_int(per_run) and per_run <= MAX_WINDOW):
        raise PageError(f"pending approval ids: per_run is {described(per_run)}, not a "
                        f"whole number of at most {MAX_WINDOW}")
    if not run_ids or per_run <= 0:
        return {}
    if len(run_ids) > _IDS_PER_QUERY:
        run_ids = list(run_ids)  # a set or dict view has a length but no slices
        # SQLite binds at most 32,766 values a statement; each run's window is its own.
        out: dict[str, list[str]] = {}
        with one_snapshot(conn):
            for at in range(0, len(run_ids), _IDS_PER_QUERY):
                out.update(pending_ids_of(conn, run_ids[at:at + _IDS_PER_QUERY], per_run))
        return out
    marks = ", ".join("?" for _ in run_ids)
    rows = fetch_capped(
        conn, _PENDING,
        "FROM approvals a JOIN ("
        "SELECT p.rowid AS rid, "
        "ROW_NUMBER() OVER (PARTITION BY p.run_id ORDER BY p.rowid) AS rn "
        "FROM approvals p JOIN runs r ON r.id = p.run_id "
        "WHERE p.status = 'pending' AND r.status = 'WAITING_FOR_APPROVAL' "
        f"AND p.run_id IN ({marks})) w ON a.rowid = w.rid "
        "WHERE w.rn <= ? ORDER BY a.run_id, w.rn",
        (*run_ids, per_run),
    )
    found: dict[str, list[str]] = {}
    for run_id, approval_id, _ in rows:
        found.setdefault(str(run_id), []).append(str(approval_id))
    return found

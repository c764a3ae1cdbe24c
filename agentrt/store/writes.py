"""Every state-changing statement the driver and the operator paths run.

Each function runs inside a :class:`~agentrt.store.tx.Tx` the caller opened,
so the rows it changes commit with the events the caller appends (through
``Tx.run``, as no statement here returns rows; it returns the rows changed).
Status changes are compare-and-set: an UPDATE names the state it expects, and when
no row matched, the run is read again to say why (another status, another
lease owner, an expired lease). That is what makes two resumes of one
approved run execute its tool once, and an operator's cancel win over a loop
that has not noticed it yet.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import apsw

from agentrt.errors import LeaseLostError, NotFoundError, RunLeasedError, RunStateError
from agentrt.records import Approval, Run, RunStatus, Step
from agentrt.store.rows import (
    APPROVAL_COLUMNS,
    RUN_COLUMNS,
    STEP_COLUMNS,
    approval_from_row,
    run_from_row,
    step_from_row,
)
from agentrt.store.tx import Tx
from agentrt.timefmt import format_time, format_time_nano, parse_time

__all__ = [
    "MAX_INT64",
    "add_active_ms",
    "add_model_totals",
    "check_run",
    "decide_approval",
    "expire_approval",
    "fail_open_steps",
    "finish_model_call",
    "insert_approval",
    "insert_model_call",
    "insert_run",
    "insert_step",
    "put_tool_spec",
    "read_approval",
    "read_run",
    "read_step",
    "release_lease",
    "renew_lease",
    "set_step_outcome",
    "start_step",
    "take_lease",
    "transition",
    "update_step",
]

MAX_INT64 = (1 << 63) - 1
RUNNING = RunStatus.RUNNING.value
OPEN_STEP_STATUSES = ("deciding", "awaiting_approval", "executing")


def _either(values: Sequence[str]) -> str:
    return " or ".join(values)


@functools.cache
def _marks(n: int) -> str:
    """``?, ?, ?`` for n parameters (remembered: statements are rebuilt on every write)."""
    return ", ".join("?" * n)


@functools.lru_cache(maxsize=64)
def _parse_text(text: str) -> datetime | None:
    try:
        return parse_time(text)
    except ValueError:
        return None


def _parse(text: Any) -> datetime | None:
    """A stored time, or None; remembered, since a run's lease expiry is read at
    every side effect and changes only every TTL/3."""
    return _parse_text(str(text or ""))


# -- reads inside a transaction ---------------------------------------------


def read_run(tx: Tx, run_id: str) -> Run:
    """The whole run as this transaction sees it; NotFoundError when absent."""
    row = tx.one(f"SELECT {RUN_COLUMNS.fast} FROM runs WHERE id = ?", (run_id,))
    if row is None:
        raise NotFoundError(f"run {run_id}")
    return run_from_row(row)


def read_step(tx: Tx, step_id: str) -> Step | None:
    row = tx.one(f"SELECT {STEP_COLUMNS.fast} FROM steps WHERE id = ?", (step_id,))
    return step_from_row(row) if row is not None else None


def read_approval(tx: Tx, run_id: str, approval_id: str) -> Approval | None:
    row = tx.one(
        f"SELECT {APPROVAL_COLUMNS.fast} FROM approvals WHERE id = ? AND run_id = ?",
        (approval_id, run_id),
    )
    return approval_from_row(row) if row is not None else None


def check_run(
    tx: Tx,
    run_id: str,
    statuses: Sequence[str],
    *,
    owner: str | None = None,
    live_at: datetime | None = None,
) -> str:
    """Require the run to be in one of ``statuses``; return its status.

    With ``owner``, a RUNNING run must be leased by it (RunLeasedError names
    who holds it). With ``live_at`` (writes that start a side effect) the
    stored lease must also not have expired by that wall-clock instant
    (LeaseLostError).
    """
    row = tx.only(
        "SELECT status, lease_owner, lease_expires_at FROM runs WHERE id = ?", (run_id,)
    )
    if row is None:
        raise NotFoundError(f"run {run_id}")
    status, lease_owner, expires_text = row
    if status not in statuses:
        raise RunStateError(f"run {run_id} is {status}, not {_either(statuses)}")
    if status == RUNNING and owner is not None:
        if lease_owner != owner:
            raise RunLeasedError(run_id, lease_owner, _parse(expires_text))
        if live_at is not None:
            expires = _parse(expires_text)
            if expires is None or expires <= live_at:
                raise LeaseLostError(
                    f"run {run_id}: the lease expired at {format_time_nano(expires)}")
    return str(status)


# -- runs ----------------------------------------------------------------------


def insert_run(tx: Tx, run: Run, limits_json: bytes, owner: str, expires: datetime) -> None:
    """A new RUNNING run held by ``owner``; a duplicate id raises apsw.ConstraintError."""
    tx.run(
        "INSERT INTO runs (id, goal, status, reason, reason_detail, limits_json, step_count, "
        "created_at, started_at, finished_at, result_json, lease_owner, lease_expires_at) "
        "VALUES (?, ?, ?, '', '', ?, 0, ?, ?, '', '', ?, ?)",
        (
            run.id,
            run.goal,
            run.status,
            limits_json.decode("utf-8"),
            format_time(run.created_at),
            format_time(run.started_at),
            owner,
            format_time(expires),
        ),
    )


def transition(
    tx: Tx,
    run_id: str,
    from_statuses: Sequence[str],
    to_status: str,
    *,
    reason: str = "",
    detail: str = "",
    finished_at: datetime | None = None,
    result: bytes = b"",
    owner: str | None = None,
    lease_owner: str = "",
    lease_expires: datetime | None = None,
) -> None:
    """Compare-and-set the run's status, ending columns and lease.

    ``owner`` (driver writes) requires a RUNNING run to be leased by it. The
    lease columns become ``lease_owner``/``lease_expires``: the new owner for
    a move to RUNNING, empty for a pause or an ending. Step count and totals
    are never touched here.
    """
    params: list[Any] = [
        to_status,
        reason,
        detail,
        format_time(finished_at),
        result.decode("utf-8", "surrogateescape") if result else "",
        lease_owner,
        format_time(lease_expires),
        run_id,
        *from_statuses,
    ]
    lease_clause = ""
    if owner is not None:
        lease_clause = " AND (status != 'RUNNING' OR lease_owner = ?)"
        params.append(owner)
    changed = tx.run(
        "UPDATE runs SET status = ?, reason = ?, reason_detail = ?, finished_at = ?, "
        "result_json = ?, lease_owner = ?, lease_expires_at = ? "
        f"WHERE id = ? AND status IN ({_marks(len(from_statuses))}){lease_clause}",
        tuple(params),
    )
    if changed == 0:
        check_run(tx, run_id, from_statuses, owner=owner)
        raise RunStateError(f"run {run_id} changed under the transition")  # pragma: no cover


def start_step(tx: Tx, run_id: str, index: int, owner: str) -> None:
    """Count a new step, only if the run is still RUNNING, held by ``owner``, at ``index``."""
    changed = tx.run(
        "UPDATE runs SET step_count = step_count + 1 WHERE id = ? AND status = 'RUNNING' "
        "AND step_count = ? AND lease_owner = ?",
        (run_id, index, owner),
    )
    if changed == 0:
        check_run(tx, run_id, (RUNNING,), owner=owner)
        raise RunStateError(f"run {run_id} has moved past step {index}")


def add_active_ms(tx: Tx, run_id: str, ms: int, *, running_for: str | None = None) -> None:
    """Active time only ever grows by increments, so a concurrent writer's share survives.

    With ``running_for`` the run must be RUNNING under that lease owner: the
    statement is then also the write's status check (as :func:`check_run`).
    """
    ms = max(ms, 0)
    if running_for is None:
        if ms:
            tx.run(
                "UPDATE runs SET active_ms = CASE WHEN active_ms > ? - ? THEN ? "
                "ELSE active_ms + ? END WHERE id = ?",
                (MAX_INT64, ms, MAX_INT64, ms, run_id),
            )
        return
    changed = tx.run(
        "UPDATE runs SET active_ms = CASE WHEN active_ms > ? - ? THEN ? "
        "ELSE active_ms + ? END WHERE id = ? AND status = 'RUNNING' AND lease_owner = ?",
        (MAX_INT64, ms, MAX_INT64, ms, run_id, running_for),
    )
    if changed == 0:
        check_run(tx, run_id, (RUNNING,), owner=running_for)
        raise RunStateError(f"run {run_id} changed under the write")  # pragma: no cover


def _saturating_add(column: str) -> str:
    return (
        f"{column} = CASE WHEN ? <= 0 THEN {column} WHEN {column} > {MAX_INT64} - ? "
        f"THEN {MAX_INT64} ELSE {column} + ? END"
    )


def add_model_totals(
    tx: Tx, run_id: str, input_tokens: int, output_tokens: int, cached: int, cost: int
) -> None:
    """One more model call and its charge, each clamped at zero and saturating, not wrapping."""

    def clamp(v: int) -> int:
        return max(0, min(v, MAX_INT64))

    values = [clamp(input_tokens), clamp(output_tokens), clamp(cached), clamp(cost)]
    params: list[int] = []
    for v in values:
        params.extend((v, v, v))
    tx.run(
        "UPDATE runs SET model_calls = CASE WHEN model_calls >= "
        f"{MAX_INT64} THEN model_calls ELSE model_calls + 1 END, "
        + ", ".join(
            _saturating_add(c)
            for c in ("input_tokens", "output_tokens", "cached_input_tokens",
                      "estimated_cost_micros")
        )
        + " WHERE id = ?",
        (*params, run_id),
    )


# -- the lease -----------------------------------------------------------------


def take_lease(
    tx: Tx, run_id: str, owner: str, expires: datetime, wall_now: datetime
) -> tuple[str, datetime | None]:
    """Take a RUNNING (or INTERRUPTED) run's lease; return the previous (owner, expiry).

    A live lease of another owner is refused with RunLeasedError.
    """
    row = tx.one(
        "SELECT status, lease_owner, lease_expires_at FROM runs WHERE id = ?", (run_id,)
    )
    if row is None:
        raise NotFoundError(f"run {run_id}")
    status, prev_owner, prev_expires = str(row[0]), str(row[1]), _parse(row[2])
    allowed = (RUNNING, RunStatus.INTERRUPTED.value)
    if status not in allowed:
        raise RunStateError(f"run {run_id} is {status}, not {_either(allowed)}")
    if prev_owner and prev_owner != owner and prev_expires is not None and (
        prev_expires > wall_now
    ):
        raise RunLeasedError(run_id, prev_owner, prev_expires)
    tx.run(
        "UPDATE runs SET lease_owner = ?, lease_expires_at = ? WHERE id = ?",
        (owner, format_time(expires), run_id),
    )
    return prev_owner, prev_expires


def renew_lease(conn: apsw.Connection, run_id: str, owner: str, expires: datetime) -> bool:
    """The heartbeat's renewal; False when the lease is no longer ``owner``'s."""
    conn.execute(
        "UPDATE runs SET lease_expires_at = ? WHERE id = ? AND lease_owner = ?",
        (format_time(expires), run_id, owner),
    )
    return bool(conn.changes())


def release_lease(conn: apsw.Connection, run_id: str, owner: str) -> None:
    """Free the run at once for the next Resume, if ``owner`` still holds it."""
    conn.execute(
        "UPDATE runs SET lease_owner = '', lease_expires_at = '' "
        "WHERE id = ? AND lease_owner = ?",
        (run_id, owner),
    )


# -- steps and specs -----------------------------------------------------------


def put_tool_spec(tx: Tx, spec_hash: str, canonical: bytes) -> None:
    """Each distinct spec once, under the hash of its canonical text."""
    tx.run(
        "INSERT OR IGNORE INTO tool_specs (hash, spec_json) VALUES (?, ?)",
        (spec_hash, canonical.decode("utf-8")),
    )


@functools.cache
def _insert_step_sql(n: int) -> str:
    return f"INSERT INTO steps ({STEP_COLUMNS.names}) VALUES ({_marks(n)})"


def insert_step(tx: Tx, row: Sequence[Any]) -> None:
    """A new step from a full row in ``STEP_COLUMNS`` order."""
    tx.run(_insert_step_sql(len(row)), tuple(row))


def _step_not_in(tx: Tx, step_id: str, expected: Sequence[str]) -> RunStateError:
    row = tx.one("SELECT status FROM steps WHERE id = ?", (step_id,))
    if row is None:
        return RunStateError(f"step {step_id} does not exist")
    return RunStateError(f"step {step_id} is {row[0]}, not {_either(expected)}")


@functools.cache
def _update_step_sql(n_expected: int, guarded: bool, lease: bool = False) -> str:
    expiry = " AND lease_expires_at = ?" if lease else ""
    guard = (" AND EXISTS (SELECT 1 FROM runs WHERE id = ? AND status = 'RUNNING' "
             f"AND lease_owner = ?{expiry})") if guarded else ""
    return ("UPDATE steps SET status = ?, decision_json = ?, policy_json = ?, "
            "observation_json = ?, observation_hash = ?, started_at = ?, finished_at = ?, "
            "spec_hash = ?, policy_id = ? "
            f"WHERE id = ? AND status IN ({_marks(n_expected)}){guard}")


def update_step(tx: Tx, row: Sequence[Any], expected: Sequence[str], *,
                running_for: str | None = None,
                live: tuple[str, datetime] | None = None) -> None:
    """Rewrite a step from a full row, only if it is still in an ``expected`` status.

    With ``running_for`` (a lease owner) the write also requires the run to be
    RUNNING under that owner, in the same statement; when it is not, the
    error says why (as :func:`check_run` does).

    ``live`` (with ``running_for``) is a step about to start a side effect:
    (the lease expiry text last read, a wall-clock instant), and the write
    does what :func:`check_run` with ``live_at`` and then the plain write do.
    While that text, still stored, is a time after the instant, the same
    statement checks it and the run is not read; otherwise (say, the
    heartbeat renewed the lease since) the run is read and checked first.
    """
    step_id = row[0]
    if live is not None and running_for is not None:
        expires_text, live_at = live
        expires = _parse(expires_text)
        if expires is not None and expires > live_at and tx.run(
                _update_step_sql(len(expected), True, True),
                (*row[3:], step_id, *expected, row[1], running_for, expires_text)):
            return
        check_run(tx, str(row[1]), (RUNNING,), owner=running_for, live_at=live_at)
        running_for = None  # just checked: the plain compare-and-set follows
    if running_for is None:
        changed = tx.run(_update_step_sql(len(expected), False), (*row[3:], step_id, *expected))
    else:
        changed = tx.run(_update_step_sql(len(expected), True),
                         (*row[3:], step_id, *expected, row[1], running_for))
    if changed == 0:
        if running_for is not None:
            check_run(tx, str(row[1]), (RUNNING,), owner=running_for)
        raise _step_not_in(tx, step_id, expected)


def set_step_outcome(
    tx: Tx,
    step_id: str,
    expected: Sequence[str],
    status: str,
    observation_json: bytes,
    observation_hash: str,
    finished_at: datetime | None,
) -> None:
    """Only a step's outcome columns: its decision and policy are left as recorded."""
    tx.run(
        "UPDATE steps SET status = ?, observation_json = ?, observation_hash = ?, "
        f"finished_at = ? WHERE id = ? AND status IN ({_marks(len(expected))})",
        (status, observation_json.decode("utf-8"), observation_hash, format_time(finished_at),
         step_id, *expected),
    )
    if tx.changes() == 0:
        raise _step_not_in(tx, step_id, expected)


def fail_open_steps(
    tx: Tx, run_id: str, observation_json: bytes, observation_hash: str,
    finished_at: datetime | None,
) -> int:
    """Fail every step still deciding, awaiting approval or executing; return how many.

    Only outcome columns are written, so a step row that will not decode is
    ended without being rewritten.
    """
    tx.run(
        "UPDATE steps SET status = 'failed', observation_json = ?, observation_hash = ?, "
        f"finished_at = ? WHERE run_id = ? AND status IN ({_marks(len(OPEN_STEP_STATUSES))})",
        (observation_json.decode("utf-8"), observation_hash, format_time(finished_at), run_id,
         *OPEN_STEP_STATUSES),
    )
    return tx.changes()


# -- approvals -----------------------------------------------------------------


def insert_approval(tx: Tx, row: Sequence[Any]) -> None:
    """A new approval from a full row in ``APPROVAL_COLUMNS`` order."""
    tx.run(
        f"INSERT INTO approvals ({APPROVAL_COLUMNS.names}) VALUES ({_marks(len(row))})", tuple(row)
    )


def decide_approval(
    tx: Tx, approval_id: str, status: str, decided_at: datetime, by: str, note: str,
    expected_hash: str,
) -> bool:
    """Decide a pending approval, only if it still carries the hash that was checked."""
    tx.run(
        "UPDATE approvals SET status = ?, decided_at = ?, decided_by = ?, note = ? "
        "WHERE id = ? AND status = 'pending' AND hash = ?",
        (status, format_time(decided_at), by, note, approval_id, expected_hash),
    )
    return tx.changes() == 1


def expire_approval(
    tx: Tx, approval_id: str, from_status: str, decided_at: datetime | None
) -> bool:
    """Mark an approval expired from ``from_status``.

    A pending one gets ``decided_at`` and the note ``expired``; an approved grant
    keeps who decided it and when.
    """
    if from_status == "pending":
        tx.run(
            "UPDATE approvals SET status = 'expired', decided_at = ?, note = 'expired' "
            "WHERE id = ? AND status = 'pending'",
            (format_time(decided_at), approval_id),
        )
    else:
        tx.run(
            "UPDATE approvals SET status = 'expired' WHERE id = ? AND status = ?",
            (approval_id, from_status),
        )
    return tx.changes() == 1


# -- model calls ---------------------------------------------------------------


def insert_model_call(
    tx: Tx, call_id: str, run_id: str, step_id: str, attempt: int, model: str,
    dispatched_at: datetime,
) -> None:
    tx.run(
        "INSERT INTO model_calls (id, run_id, step_id, attempt, status, model, dispatched_at) "
        "VALUES (?, ?, ?, ?, 'dispatched', ?, ?)",
        (call_id, run_id, step_id, attempt, model, format_time(dispatched_at)),
    )


def finish_model_call(
    tx: Tx, call_id: str, status: str, input_tokens: int, output_tokens: int, cached: int,
    cost: int, latency_ms: int, error: str, completed_at: datetime,
) -> None:
    def clamp(v: int) -> int:
        return max(-MAX_INT64 - 1, min(v, MAX_INT64))

    tx.run(
        "UPDATE model_calls SET status = ?, input_tokens = ?, output_tokens = ?, "
        "cached_input_tokens = ?, cost_micros = ?, latency_ms = ?, error = ?, completed_at = ? "
        "WHERE id = ?",
        (status, clamp(input_tokens), clamp(output_tokens), clamp(cached), clamp(cost),
         clamp(latency_ms), error, format_time(completed_at), call_id),
    )

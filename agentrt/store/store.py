"""The Store: one SQLite file whose tables are the state and whose events explain them.

Open it with :func:`open_store` (the consumer's opener: creates and migrates)
or :func:`open_existing` (the operator's: never creates, never migrates,
optionally read-only). A file-backed writer keeps a second connection used
only by the lease heartbeat, so a consumer holding :meth:`Store.db` cannot
starve the renewal.
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any

import apsw

from agentrt.canonical import canonical_text
from agentrt.errors import AgentrtError, NotFoundError, described
from agentrt.events import Event, EventType, Observer
from agentrt.gojson import replace_lone_surrogates
from agentrt.records import (
    Approval,
    ModelCall,
    Run,
    Step,
    ToolSpec,
)
from agentrt.store import chainread, pages
from agentrt.store.opening import (
    StoreOpenError,
    close_quietly,
    open_memory,
    open_reader,
    open_writer,
)
from agentrt.store.pages import capped_text
from agentrt.store.rows import (
    APPROVAL_COLUMNS,
    EVENT_COLUMNS,
    MODEL_CALL_COLUMNS,
    OTHER,
    RUN_COLUMNS,
    STEP_COLUMNS,
    TEXT,
    Columns,
    approval_from_row,
    approval_not_found,
    events_from_rows,
    fetch,
    model_call_from_row,
    run_from_row,
    run_not_found,
    step_from_row,
)
from agentrt.store.rows import not_found as _not_found
from agentrt.store.tx import CLOSED, ChainHead, StoreClosedError, Tx, closed_error
from agentrt.timefmt import parse_time

__all__ = ["ForkedStoreError", "ReadOnlyStoreError", "Store", "StoreClosedError",
           "open_existing", "open_store"]

_PENDING_COLUMNS = Columns.of([("a.run_id", TEXT), ("a.id", TEXT)])
_LEASE_COLUMNS = Columns.of([(capped_text("lease_owner"), TEXT),
                             ("ifnull(CAST(substr(lease_expires_at, 1, 64) AS TEXT), '')", TEXT)])
_APPROVAL_ID_COLUMNS = Columns.of([("a.id", TEXT)])
_REASONS_COLUMNS = Columns.of([("id", TEXT), (capped_text("reason"), TEXT)])
#: Approval ids asked for in one query of :meth:`Store.approval_reasons`.
REASONS_AT_ONCE = 500
_HASH_COLUMNS = Columns.of(
    [("seq", OTHER), (f"ifnull(CAST(substr(hash, 1, {chainread.STORED_HASH_CAP}) AS TEXT), '')",
                      TEXT)]
)


class ReadOnlyStoreError(AgentrtError):
    """A write was asked of a store opened read-only."""

    base = "agentrt: store is read-only"


class ForkedStoreError(StoreClosedError):
    """A store used in a process forked after it was opened. SQLite's file
    locks belong to the process that took them, so a connection carried
    across a fork believes it holds locks it does not: used, it can corrupt
    the file. The child opens the store again."""

    base = "agentrt: the store was opened before this process forked"


#: Every open store, marked unusable in a forked child (see ForkedStoreError).
_open_stores: weakref.WeakSet[Store] = weakref.WeakSet()
#: Connections of stores a fork left behind, kept so the child does not close
#: them as it runs: closing runs SQLite's unlock code on locks it does not hold.
_left_by_fork: list[apsw.Connection] = []


def _after_fork_in_child() -> None:
    for store in list(_open_stores):
        store._forked()
    _open_stores.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Forked:
    """A store's ``_guarded`` in a forked child: every use raises ForkedStoreError."""

    __slots__ = ("_said",)

    def __init__(self, said: str) -> None:
        self._said = said

    def __enter__(self) -> apsw.Connection:
        raise ForkedStoreError(self._said)

    def __exit__(self, *exc: object) -> None:
        return None


#: The largest seq SQLite hands out (a signed 64-bit rowid).
_MAX_SEQ = 2**63 - 1


def _seq_arg(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"agentrt: {name} is {described(value)}, not an int: pass "
                        "an event's seq")
    if value > _MAX_SEQ:
        raise ValueError(f"agentrt: {name} {value} is past any seq SQLite hands out "
                         f"(at most {_MAX_SEQ})")
    return value


class _Locked:
    """``with store.locked() as conn``: the lock held, the connection handed out,
    and a statement on a closed connection raised as :class:`StoreClosedError`.

    One instance per store (it holds no state of its own use), and a class
    rather than a ``@contextmanager`` generator, which cost several times the
    lock itself on the loop's once-a-step read of the run.
    """

    __slots__ = ("_conn", "_lock", "_path")

    def __init__(self, conn: apsw.Connection, lock: threading.RLock, path: str) -> None:
        self._conn = conn
        self._lock = lock
        self._path = path

    def __enter__(self) -> apsw.Connection:
        self._lock.acquire()
        return self._conn

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        self._lock.release()
        if exc_type is not None and issubclass(exc_type, CLOSED) and not issubclass(
                exc_type, StoreClosedError):
            raise closed_error(self._path) from exc


class Store:
    """A handle on one database. Use :func:`open_store` or :func:`open_existing`.

    The store keeps a single SQLite connection (SQLite has one writer, and an
    in-memory database is per connection); a lock serialises its use across
    threads, as the reference's one-connection pool does.
    """

    def __init__(
        self,
        conn: apsw.Connection,
        path: str,
        *,
        read_only: bool,
        lease_conn: apsw.Connection | None = None,
    ) -> None:
        self._conn = conn
        self._lease_conn = lease_conn
        self._lock = threading.RLock()
        self._lease_lock = threading.Lock() if lease_conn is not None else self._lock
        self.path = path
        self.read_only = read_only
        self._closed = False
        self._head = ChainHead()
        self._tx_cursor = conn.cursor()  # for Tx's own statements, under the lock
        #: ``with self._guarded as conn``: the lock held, and a call on the closed
        #: connection said as StoreClosedError (every read goes through it).
        self._guarded: _Locked | _Forked = _Locked(conn, self._lock, path)
        #: Said by every use in a process forked after the open ('' before).
        self._fork_said = ""
        _open_stores.add(self)

    # -- lifecycle ---------------------------------------------------------

    def _forked(self) -> None:
        """In a child forked after the open: refuse every use from now on."""
        self._fork_said = (
            f"{self.path} (opened in process {os.getppid()}); an SQLite connection must not "
            "cross a fork, as its file locks stay with that process: open the store again "
            "in this process")
        self._guarded = _Forked(self._fork_said)
        _left_by_fork.extend(c for c in (self._conn, self._lease_conn) if c is not None)
        self._closed = True  # close() has nothing left to do

    def _refuse_if_forked(self) -> None:
        if self._fork_said:
            raise ForkedStoreError(self._fork_said)

    def close(self) -> None:
        """Close both connections; safe to call twice."""
        if self._fork_said:  # the lock may be held by a thread the fork left behind
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            with self._lease_lock:  # a renewal in progress ends first
                close_quietly(self._lease_conn)
            close_quietly(self._conn)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def db(self) -> apsw.Connection:
        """The connection, for a consumer's own tables in the same file.

        It is the store's own connection and is not guarded: while a driver runs
        in this process, use it inside ``locked()``, which holds the loop's
        writes until it ends. A transaction on it must not call Store methods
        or the driver, and a write transaction must end well within the lease
        TTL: the heartbeat renews the lease on its own connection, but cannot
        write while another holds the file's write lock.
        """
        self._refuse_if_forked()
        return self._conn

    def locked(self) -> AbstractContextManager[apsw.Connection]:
        """The connection under the store's lock, for a sequence of reads.

        An in-memory store's heartbeat renews leases on this same connection:
        held across a driver call, it holds the renewals too, so keep it shorter
        than the lease TTL there."""
        return self._guarded

    def read_row(self, sql: str, params: tuple[Any, ...]) -> Any:
        """The first row of one query, or None, under the store's lock: the loop's
        once-a-step read of the run.

        The query runs to its end on the store's own cursor (used only under
        the lock), not on a cursor of its own, which cost a third of the read:
        so it is meant for a query of one row (by primary key)."""
        with self._guarded:
            rows = self._tx_cursor.execute(sql, params).fetchall()
            return rows[0] if rows else None

    @contextmanager
    def lease_connection(self, wait: float = -1) -> Iterator[apsw.Connection]:
        """The heartbeat's connection (the main one for in-memory stores).

        ``wait`` bounds the wait for it in seconds (apsw.BusyError after): an
        in-memory store's heartbeat shares the lock a caller may hold across a
        whole run, and must give up its tick rather than hold the run's end."""
        self._refuse_if_forked()
        conn = self._lease_conn if self._lease_conn is not None else self._conn
        if not self._lease_lock.acquire(timeout=wait):
            raise apsw.BusyError(f"{self.path}: the lease connection is in use")
        try:
            yield conn
        finally:
            self._lease_lock.release()

    # -- writes ------------------------------------------------------------

    def tx(self, observer: Observer | None = None, *, own_writes: bool = False) -> Tx:
        """One write transaction: ``with store.tx(observer) as tx: ...``.

        BEGIN IMMEDIATE (the write lock is taken up front, so a read-then-write
        transaction waits for another process's writer instead of failing),
        the mutation and its ``tx.append``-ed events, COMMIT, and only then the
        events to the observer, in append order. Any exception inside rolls
        the transaction back and propagates; the connection stays usable.

        ``own_writes`` is the runtime's promise that its statements change
        the events table only through ``tx.append``; such transactions reuse
        the chain head the last one left when no commit happened since.
        """
        if self.read_only:
            raise ReadOnlyStoreError(
                f"{self.path} was opened read-only; open it with "
                "open_existing(path, read_only=False) to write")
        if self._fork_said:  # inline: four transactions a driver step
            raise ForkedStoreError(self._fork_said)
        return Tx(self._conn, self._lock, observer, self._head if own_writes else None,
                  self._tx_cursor)

    # -- full reads --------------------------------------------------------

    def _rows(self, cols: Columns, rest: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._guarded as conn:
            return fetch(conn, cols, rest, params)

    def _one(self, sql: str, params: Sequence[Any]) -> Any:
        with self._guarded as conn:
            try:
                return conn.execute(sql, tuple(params)).fetchone()
            except UnicodeEncodeError:  # a lone surrogate: stored ids hold U+FFFD
                return conn.execute(sql, tuple(
                    replace_lone_surrogates(v) if isinstance(v, str) else v
                    for v in params)).fetchone()

    def get_run(self, run_id: str) -> Run:
        """The run, decoded whole; NotFoundError when there is none.

        Raises ValueError when its limits or times do not decode: code that
        would act on a run must not guess. ``get_run_capped`` reads such a run.
        """
        rows = self._rows(RUN_COLUMNS, "FROM runs WHERE id = ?", (run_id,))
        if not rows:
            with self._guarded as conn:
                raise run_not_found(conn, run_id)
        return run_from_row(rows[0])

    def list_runs(self) -> list[Run]:
        """Every run, newest first by insertion."""
        return [run_from_row(r) for r in self._rows(RUN_COLUMNS,
                                                     "FROM runs ORDER BY rowid DESC")]

    def list_steps(self, run_id: str) -> list[Step]:
        """The run's steps by index; an undecodable one has ``decode_error`` set."""
        return [step_from_row(r) for r in self._rows(
            STEP_COLUMNS, "FROM steps WHERE run_id = ? ORDER BY idx", (run_id,))]

    def list_approvals(self, run_id: str) -> list[Approval]:
        """The run's approvals in insertion order; an undecodable one has
        ``decode_error`` set."""
        return [approval_from_row(r) for r in self._rows(
            APPROVAL_COLUMNS, "FROM approvals WHERE run_id = ? ORDER BY rowid", (run_id,))]

    def get_approval(self, run_id: str, approval_id: str) -> Approval:
        """An approval of that run (an id of another run is not found)."""
        rows = self._rows(APPROVAL_COLUMNS, "FROM approvals WHERE id = ? AND run_id = ?",
                          (approval_id, run_id))
        if not rows:
            with self._guarded as conn:
                raise approval_not_found(conn, run_id, approval_id)
        return approval_from_row(rows[0])

    def list_model_calls(self, run_id: str) -> list[ModelCall]:
        """The run's model calls (every attempt) in insertion order."""
        return [model_call_from_row(r) for r in self._rows(
            MODEL_CALL_COLUMNS, "FROM model_calls WHERE run_id = ? ORDER BY rowid", (run_id,))]

    def list_events(self, run_id: str) -> list[Event]:
        """The run's events in seq (commit) order, uncapped."""
        return events_from_rows(self._rows(
            EVENT_COLUMNS, "FROM events WHERE run_id = ? ORDER BY seq", (run_id,)))

    def pending_approval_ids(self) -> dict[str, list[str]]:
        """Every waiting run mapped to its pending approval ids, in one query."""
        out: dict[str, list[str]] = {}
        for run_id, approval_id in self._rows(
            _PENDING_COLUMNS,
            "FROM approvals a JOIN runs r ON r.id = a.run_id "
            "WHERE a.status = 'pending' AND r.status = 'WAITING_FOR_APPROVAL' "
            "ORDER BY a.rowid",
        ):
            out.setdefault(run_id, []).append(approval_id)
        return out

    def tool_spec(self, spec_hash: str) -> ToolSpec:
        """A recorded tool spec, re-hashed on the way out; a mismatch is refused."""
        row = self._one("SELECT CAST(spec_json AS BLOB) FROM tool_specs WHERE hash = ?",
                        (spec_hash,))
        if row is None:
            raise _not_found(f"tool spec {spec_hash}", spec_hash=spec_hash)
        data = bytes(row[0] or b"")
        try:
            matches = hashlib.sha256(canonical_text(data)).hexdigest() == spec_hash
        except ValueError:
            matches = False
        if not matches:
            raise ValueError(f"agentrt: tool spec {spec_hash} does not match its hash")
        return ToolSpec.from_json(data)

    # -- page reads --------------------------------------------------------

    def list_runs_page(self, limit: int, offset: int) -> tuple[list[Run], int]:
        with self._guarded as conn, pages.one_snapshot(conn):
            return pages.runs_page(conn, limit, offset)

    def get_run_capped(self, run_id: str) -> Run:
        with self._guarded as conn:
            return pages.run_capped(conn, run_id)

    def list_steps_page(self, run_id: str, limit: int, offset: int) -> tuple[list[Step], int]:
        with self._guarded as conn, pages.one_snapshot(conn):
            return pages.steps_page(conn, run_id, limit, offset)

    def list_approvals_page(
        self, run_id: str, status: str, limit: int, offset: int, *,
        after_id: str | None = None,
    ) -> tuple[list[Approval], int]:
        """A page of a run's approvals in insertion order, of one status or all,
        and the total. With ``after_id`` (the last approval of the page before),
        the page starts after that approval, so approvals that left the status
        since skip none; at ``offset`` when the id does not read back as stored
        (a database another tool wrote). The total counts them all."""
        with self._guarded as conn, pages.one_snapshot(conn):
            return pages.approvals_page(conn, run_id, status, limit, offset, after_id)

    def list_events_page(self, run_id: str, limit: int, offset: int) -> tuple[list[Event], int]:
        with self._guarded as conn, pages.one_snapshot(conn):
            return pages.events_page(conn, run_id, limit, offset)

    def list_events_after(self, run_id: str, seq: int, limit: int) -> list[Event]:
        """At most ``limit`` events with seq > ``seq``, in seq order: of one run,
        or of every run interleaved in commit order when ``run_id`` is ''.

        Seq is assigned in the transaction that commits the event, so it rises
        in commit order and is never reused: the last seq returned is a cursor
        a follower resumes after. Text columns are capped as in page reads.
        """
        with self._guarded as conn:
            return pages.events_after(conn, run_id, seq, limit)

    def pending_approval_ids_of(self, run_ids: Sequence[str], per_run: int) -> dict[
            str, list[str]]:
        if isinstance(run_ids, str):
            raise TypeError(f"agentrt: run_ids is {described(run_ids)}, one id, not a "
                            "sequence of run ids: pass a list, such as [run_id]")
        with self._guarded as conn:
            return pages.pending_ids_of(conn, run_ids, per_run)

    # -- reads for tools beside a consumer ----------------------------------

    def lease(self, run_id: str) -> tuple[str, datetime | None]:
        """The run's stored lease: (owner, expiry by that driver's wall clock).

        A run nobody holds (paused, finished, or released by the call that
        executed it) has ('', None). A lease whose time has passed is stale,
        not released: a resume takes such a run over. NotFoundError when there
        is no such run. The owner is capped like a page read's text.
        """
        rows = self._rows(_LEASE_COLUMNS, "FROM runs WHERE id = ?", (run_id,))
        if not rows:
            with self._guarded as conn:
                raise run_not_found(conn, run_id)
        owner, expires_text = rows[0]
        try:
            expires = parse_time(expires_text)
        except ValueError:
            expires = None
        return owner, expires

    def approval_reason(self, run_id: str, approval_id: str) -> str:
        """The reason of the policy decision that paused the run on this approval.

        Read from the first ``approval.requested`` event of the approval's step
        that names it, because the approval row has no reason of its own: once
        the approval is granted and resumed the step holds the policy's
        decision at resume, and this still returns the one that asked. Capped
        like a page read's text; '' when there is no such event; NotFoundError
        when the run has no such approval.
        """
        reasons = self.approval_reasons(run_id, [approval_id])
        if approval_id not in reasons:
            raise _not_found(f"approval {approval_id} of run {run_id}", run_id=run_id,
                             approval_id=approval_id)
        return reasons[approval_id]

    def approval_reasons(self, run_id: str, approval_ids: Sequence[str]) -> dict[str, str]:
        """:meth:`approval_reason` of many approvals of one run, keyed by the ids given.

        Ids the run has no approval of are left out. The run's events are read
        once per ``REASONS_AT_ONCE`` ids, not once per approval: an operator's
        listing of a run's pending approvals would otherwise scan them for each.
        """
        if isinstance(approval_ids, str):
            raise TypeError(f"agentrt: approval_ids is {described(approval_ids)}, one id, "
                            "not a sequence of approval ids: pass a list, such as [approval_id]")
        for value, name in ((run_id, "run_id"), *((i, "approval_id") for i in approval_ids)):
            if not isinstance(value, str):
                raise TypeError(f"agentrt: {name} is {described(value)}, not a str")
        wanted = list(dict.fromkeys(approval_ids))
        found: dict[str, str] = {}
        with self._lock:  # one lock for every read (reentrant: _rows takes it too)
            for at in range(0, len(wanted), REASONS_AT_ONCE):
                found.update(self._reasons_of(run_id, wanted[at:at + REASONS_AT_ONCE]))
        # Stored ids hold U+FFFD where a caller's may hold a lone surrogate.
        return {i: found[stored] for i in wanted
                if (stored := replace_lone_surrogates(i)) in found}

    def _reasons_of(self, run_id: str, approval_ids: list[str]) -> dict[str, str]:
        marks = ", ".join("?" for _ in approval_ids)
        approvals = f"a.run_id = ? AND a.id IN ({marks})"
        reasons: dict[str, str] = {
            str(i): "" for (i,) in self._rows(
                _APPROVAL_ID_COLUMNS, f"FROM approvals a WHERE {approvals}",
                (run_id, *approval_ids))}
        if not reasons:
            return reasons
        # The run's events are the outer loop (CROSS JOIN keeps that order), read
        # once through events_run in seq order; each request finds its approval
        # by primary key. The approval id must be a JSON string equal to the id.
        payload = "CAST(e.payload_json AS TEXT)"
        rows = self._rows(
            _REASONS_COLUMNS,
            f"FROM (SELECT a.id AS id, json_extract({payload}, '$.reason') AS reason "
            "FROM events e CROSS JOIN approvals a "
            f"ON a.id = json_extract({payload}, '$.approval_id') "
            "AND CAST(a.step_id AS BLOB) = CAST(e.step_id AS BLOB) "
            f"WHERE e.run_id = ? AND e.type = ? AND json_valid({payload}) "
            f"AND json_type({payload}, '$.approval_id') = 'text' AND {approvals} "
            "ORDER BY e.seq)",
            (run_id, EventType.APPROVAL_REQUESTED.value, run_id, *approval_ids),
        )
        first: set[str] = set()
        for approval_id, reason in rows:
            if approval_id not in first:
                first.add(approval_id)
                reasons[approval_id] = str(reason)
        return reasons

    def data_version(self) -> int:
        """Changes whenever a commit lands, from any connection (this one included):
        a cheap "anything new?" check for a follower."""
        with self._guarded as conn:
            # The pragma refreshes the pager's view of other connections'
            # commits; the file-control value then counts this one's too.
            conn.execute("PRAGMA data_version").fetchall()
            return int(conn.data_version())

    # -- the chain ---------------------------------------------------------

    def chain_head(self) -> tuple[int, str]:
        """(seq, stored hash) of the newest event, or (0, '') when there is none.

        Keep it somewhere the database's writers cannot reach to find out later
        that the end of the log was cut: ``verify_events`` cannot see that.
        """
        rows = self._rows(_HASH_COLUMNS, "FROM events ORDER BY seq DESC LIMIT 1")
        return (int(rows[0][0]), rows[0][1]) if rows else (0, "")

    def event_hash(self, seq: int) -> str:
        """The stored hash of event ``seq`` (cut to 128 characters); NotFoundError."""
        seq = _seq_arg("seq", seq)
        rows = self._rows(_HASH_COLUMNS, "FROM events WHERE seq = ?", (seq,))
        if not rows:
            raise NotFoundError(f"event {seq}")
        return str(rows[0][1])

    def verify_events(self, from_seq: int = 0, to_seq: int = 0) -> chainread.VerifyReport:
        """Walk the hash chain; writes nothing. See :func:`chainread.verify`."""
        from_seq, to_seq = _seq_arg("from_seq", from_seq), _seq_arg("to_seq", to_seq)
        with self._guarded as conn:
            return chainread.verify(conn, from_seq, to_seq)


# -- opening -----------------------------------------------------------------


def open_store(path: str | os.PathLike[str]) -> Store:
    """Open or create the database at ``path`` and apply its migrations.

    Follows a symbolic link (the consumer's own configuration names its
    database). ``":memory:"`` opens an in-memory store for tests. A file it
    refuses (modes, a trigger or view, a newer schema, not SQLite) is left
    as it was. ``path`` is a str or an ``os.PathLike``; anything else, an
    empty path or one holding a NUL character is refused before a file is
    created.
    """
    path = _path_arg(path, "open_store")
    if path == ":memory:":
        return Store(open_memory(), path, read_only=False)
    conn, lease = open_writer(path)
    return Store(conn, path, read_only=False, lease_conn=lease)


def open_existing(path: str | os.PathLike[str], read_only: bool = True) -> Store:
    """Open an existing database without creating or migrating it (the operator's opener).

    Refuses a symbolic link and anything that is not a regular file, a file
    others can write, a trigger or view, and a schema version other than this
    build's. ``read_only`` never writes the file or changes its mode; it reads
    a WAL database while a writer is live, and one in a directory it cannot
    write. ``path`` is a str or an ``os.PathLike``; ``read_only`` a bool.
    """
    path = _path_arg(path, "open_existing")
    if not isinstance(read_only, bool):
        raise TypeError(f"open_existing: read_only is {described(read_only)}, not "
                        "True or False")
    conn, lease = open_reader(path, read_only)
    return Store(conn, path, read_only=read_only, lease_conn=lease)


def _path_arg(path: object, opener: str) -> str:
    """``path`` as a str (an ``os.PathLike`` through ``os.fspath``), refused
    before anything is opened or created when it cannot name a file."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"{opener}: path is {described(path)}, not a str or "
                        "os.PathLike naming the database file"
                        + (" (decode it with os.fsdecode)" if isinstance(path, bytes) else ""))
    if not path:
        raise StoreOpenError("the database path is empty: name the database file")
    if "\x00" in path:
        raise StoreOpenError(f"the database path {path!r} holds a NUL character, which no "
                             "file name can: name the database file")
    return path

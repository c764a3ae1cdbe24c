"""The Store: one SQLite file whose tables are the state and whose events explain them.

Open it with :func:`open_store` (the consumer's opener: creates and migrates)
or :func:`open_existing` (the operator's: never creates, never migrates,
optionally read-only). A file-backed writer keeps a second connection used
only by the lease heartbeat, so a consumer holding :meth:`Store.db` cannot
starve the renewal.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import apsw

from agentrt.canonical import canonical_text
from agentrt.errors import NotFoundError, SchemaVersionError
from agentrt.events import Event, EventType, Observer
from agentrt.records import (
    MAX_PAGE_TEXT,
    SCHEMA_VERSION,
    Approval,
    ModelCall,
    Run,
    Step,
    ToolSpec,
)
from agentrt.store import chainread, pages
from agentrt.store.migrations import current_version, migrate
from agentrt.store.opening import (
    StoreOpenError,
    close_quietly,
    connect,
    lstat_regular,
    refuse_unsafe_schema,
    secure_files,
    sqlite_uri,
    switch_to_wal,
)
from agentrt.store.rows import (
    APPROVAL_COLUMNS,
    EVENT_COLUMNS,
    MODEL_CALL_COLUMNS,
    RUN_COLUMNS,
    STEP_COLUMNS,
    approval_from_row,
    event_from_row,
    model_call_from_row,
    run_from_row,
    step_from_row,
)
from agentrt.store.tx import Tx
from agentrt.timefmt import parse_time

__all__ = ["Store", "open_existing", "open_store"]


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

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Close both connections; safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            close_quietly(self._lease_conn)
            close_quietly(self._conn)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def db(self) -> apsw.Connection:
        """The connection, for a consumer's own tables in the same file.

        A transaction on it must not call Store methods or the driver, and it
        holds up the loop until it ends (the lease heartbeat has its own
        connection, so the lease survives it).
        """
        return self._conn

    @contextmanager
    def locked(self) -> Iterator[apsw.Connection]:
        """The connection under the store's lock, for a sequence of reads."""
        with self._lock:
            yield self._conn

    @contextmanager
    def lease_connection(self) -> Iterator[apsw.Connection]:
        """The heartbeat's connection (the main one for in-memory stores)."""
        conn = self._lease_conn if self._lease_conn is not None else self._conn
        with self._lease_lock:
            yield conn

    # -- writes ------------------------------------------------------------

    @contextmanager
    def tx(self, observer: Observer | None = None) -> Iterator[Tx]:
        """One write transaction: BEGIN IMMEDIATE, the mutation, COMMIT, then events.

        Any exception inside rolls the transaction back (and propagates), so the
        connection is never left inside an open transaction. The observer gets
        the events only after COMMIT, in append order.
        """
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            tx = Tx(self._conn)
            try:
                yield tx
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
        if observer is not None:
            for event in tx.events:
                observer(event)

    # -- full reads --------------------------------------------------------

    def _one(self, sql: str, params: Sequence[Any]) -> Any:
        with self._lock:
            return self._conn.execute(sql, tuple(params)).fetchone()

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self._conn.execute(sql, tuple(params)).fetchall()

    def get_run(self, run_id: str) -> Run:
        row = self._one(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
        if row is None:
            raise NotFoundError(f"run {run_id}")
        return run_from_row(row)

    def list_runs(self) -> list[Run]:
        """Every run, newest first by insertion."""
        return [run_from_row(r) for r in self._all(
            f"SELECT {RUN_COLUMNS} FROM runs ORDER BY rowid DESC")]

    def list_steps(self, run_id: str) -> list[Step]:
        return [step_from_row(r) for r in self._all(
            f"SELECT {STEP_COLUMNS} FROM steps WHERE run_id = ? ORDER BY idx", (run_id,))]

    def list_approvals(self, run_id: str) -> list[Approval]:
        return [approval_from_row(r) for r in self._all(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE run_id = ? ORDER BY rowid",
            (run_id,))]

    def get_approval(self, run_id: str, approval_id: str) -> Approval:
        """An approval of that run (an id of another run is not found)."""
        row = self._one(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE id = ? AND run_id = ?",
            (approval_id, run_id))
        if row is None:
            raise NotFoundError(f"approval {approval_id} of run {run_id}")
        return approval_from_row(row)

    def list_model_calls(self, run_id: str) -> list[ModelCall]:
        return [model_call_from_row(r) for r in self._all(
            f"SELECT {MODEL_CALL_COLUMNS} FROM model_calls WHERE run_id = ? ORDER BY rowid",
            (run_id,))]

    def list_events(self, run_id: str) -> list[Event]:
        return [event_from_row(r) for r in self._all(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? ORDER BY seq", (run_id,))]

    def pending_approval_ids(self) -> dict[str, list[str]]:
        """Every waiting run mapped to its pending approval ids, in one query."""
        out: dict[str, list[str]] = {}
        for run_id, approval_id in self._all(
            "SELECT a.run_id, a.id FROM approvals a JOIN runs r ON r.id = a.run_id "
            "WHERE a.status = 'pending' AND r.status = 'WAITING_FOR_APPROVAL' "
            "ORDER BY a.rowid"
        ):
            out.setdefault(str(run_id), []).append(str(approval_id))
        return out

    def tool_spec(self, spec_hash: str) -> ToolSpec:
        """A recorded tool spec, re-hashed on the way out; a mismatch is refused."""
        row = self._one("SELECT spec_json FROM tool_specs WHERE hash = ?", (spec_hash,))
        if row is None:
            raise NotFoundError(f"tool spec {spec_hash}")
        spec = ToolSpec.from_json(str(row[0]))
        if hashlib.sha256(canonical_text(str(row[0]).encode())).hexdigest() != spec_hash:
            raise ValueError(f"agentrt: tool spec {spec_hash} does not match its hash")
        return spec

    # -- page reads --------------------------------------------------------

    def list_runs_page(self, limit: int, offset: int) -> tuple[list[Run], int]:
        with self._lock:
            return pages.runs_page(self._conn, limit, offset)

    def get_run_capped(self, run_id: str) -> Run:
        with self._lock:
            return pages.run_capped(self._conn, run_id)

    def list_steps_page(self, run_id: str, limit: int, offset: int) -> tuple[list[Step], int]:
        with self._lock:
            return pages.steps_page(self._conn, run_id, limit, offset)

    def list_approvals_page(
        self, run_id: str, status: str, limit: int, offset: int
    ) -> tuple[list[Approval], int]:
        with self._lock:
            return pages.approvals_page(self._conn, run_id, status, limit, offset)

    def list_events_page(self, run_id: str, limit: int, offset: int) -> tuple[list[Event], int]:
        with self._lock:
            return pages.events_page(self._conn, run_id, limit, offset)

    def list_events_after(self, run_id: str, seq: int, limit: int) -> list[Event]:
        """At most ``limit`` events with seq > ``seq``, in seq order: of one run,
        or of every run interleaved in commit order when ``run_id`` is ''.

        Seq is assigned in the transaction that commits the event, so it rises
        in commit order and is never reused: the last seq returned is a cursor
        a follower resumes after. Text columns are capped as in page reads.
        """
        with self._lock:
            return pages.events_after(self._conn, run_id, seq, limit)

    def pending_approval_ids_of(self, run_ids: Sequence[str], per_run: int) -> dict[
            str, list[str]]:
        with self._lock:
            return pages.pending_ids_of(self._conn, run_ids, per_run)

    # -- reads for tools beside a consumer ----------------------------------

    def lease(self, run_id: str) -> tuple[str, datetime | None]:
        """The run's stored lease: (owner, expiry by that driver's wall clock).

        A run nobody holds has ('', None). A lease whose time has passed is
        stale, not released: a resume takes such a run over.
        """
        row = self._one(
            f"SELECT substr(lease_owner, 1, {MAX_PAGE_TEXT}), "
            f"substr(lease_expires_at, 1, 64) FROM runs WHERE id = ?", (run_id,))
        if row is None:
            raise NotFoundError(f"run {run_id}")
        owner = str(row[0])
        try:
            expires = parse_time(str(row[1]))
        except ValueError:
            expires = None
        return owner, expires

    def approval_reason(self, run_id: str, approval_id: str) -> str:
        """The reason of the policy decision that paused the run on this approval.

        Read from the approval's ``approval.requested`` event, because the
        approval row has no reason of its own; '' when there is no such event.
        """
        with self._lock:
            row = self._conn.execute(
                "SELECT step_id FROM approvals WHERE id = ? AND run_id = ?",
                (approval_id, run_id)).fetchone()
            if row is None:
                raise NotFoundError(f"approval {approval_id} of run {run_id}")
            found = self._conn.execute(
                f"SELECT substr(json_extract(payload_json, '$.reason'), 1, {MAX_PAGE_TEXT}) "
                "FROM events WHERE run_id = ? AND step_id = ? AND type = ? "
                "AND json_valid(payload_json) "
                "AND json_extract(payload_json, '$.approval_id') = ? ORDER BY seq LIMIT 1",
                (run_id, str(row[0]), EventType.APPROVAL_REQUESTED.value, approval_id),
            ).fetchone()
        return str(found[0]) if found is not None and found[0] is not None else ""

    def data_version(self) -> int:
        """Changes whenever a commit lands, from any connection (this one included):
        a cheap "anything new?" check for a follower."""
        with self._lock:
            # The pragma refreshes the pager's view of other connections'
            # commits; the file-control value then counts this one's too.
            self._conn.execute("PRAGMA data_version").fetchall()
            return int(self._conn.data_version())

    # -- the chain ---------------------------------------------------------

    def chain_head(self) -> tuple[int, str]:
        """(seq, hash) of the newest event, or (0, '')."""
        row = self._one(
            f"SELECT seq, substr(hash, 1, {chainread.STORED_HASH_CAP}) FROM events "
            "ORDER BY seq DESC LIMIT 1", ())
        return (int(row[0]), str(row[1])) if row is not None else (0, "")

    def event_hash(self, seq: int) -> str:
        row = self._one(
            f"SELECT substr(hash, 1, {chainread.STORED_HASH_CAP}) FROM events WHERE seq = ?",
            (seq,))
        if row is None:
            raise NotFoundError(f"event {seq}")
        return str(row[0])

    def verify_events(self, from_seq: int = 0, to_seq: int = 0) -> chainread.VerifyReport:
        """Walk the hash chain; writes nothing. See :func:`chainread.verify`."""
        with self._lock:
            return chainread.verify(self._conn, from_seq, to_seq)


# -- opening -----------------------------------------------------------------


def _schema_version(conn: apsw.Connection, path: str) -> int:
    try:
        return current_version(conn)
    except apsw.Error as exc:
        raise StoreOpenError(
            f"{path} is not an agent-runtime database: {exc}; name a database an "
            "agentrt consumer created"
        ) from exc


def open_store(path: str) -> Store:
    """Open or create the database at ``path`` and apply its migrations.

    Follows a symbolic link (the consumer's own configuration names its
    database). ``":memory:"`` opens an in-memory store for tests.
    """
    if path == ":memory:":
        conn = connect("file::memory:", write=True, create=True)
        try:
            migrate(conn, path)
        except BaseException:
            close_quietly(conn)
            raise
        return Store(conn, path, read_only=False)
    secure_files(path, create=True, write=True)
    uri = sqlite_uri(path, {})
    conn = lease = None
    try:
        conn = connect(uri, write=True, create=True)
        switch_to_wal(conn, path)
        refuse_unsafe_schema(conn, path)
        migrate(conn, path)
        lease = connect(uri, write=True)
        secure_files(path, create=False, write=True)  # the WAL files SQLite just made
    except apsw.NotADBError as exc:
        close_quietly(lease)
        close_quietly(conn)
        raise StoreOpenError(
            f"{path} is not a SQLite database; name the agentrt database file") from exc
    except apsw.Error as exc:
        close_quietly(lease)
        close_quietly(conn)
        raise StoreOpenError(f"{path}: {exc}") from exc
    except BaseException:
        close_quietly(lease)
        close_quietly(conn)
        raise
    return Store(conn, path, read_only=False, lease_conn=lease)


def open_existing(path: str, read_only: bool = True) -> Store:
    """Open an existing database without creating or migrating it (the operator's opener).

    Refuses a symbolic link and anything that is not a regular file, a file
    others can write, a trigger or view, and a schema version other than this
    build's. ``read_only`` never writes the file or changes its mode; it reads
    a WAL database while a writer is live, and one in a directory it cannot
    write.
    """
    lstat_regular(path)
    secure_files(path, create=False, write=not read_only)
    params = {"mode": "ro"} if read_only else {"mode": "rw"}
    conn = lease = None
    try:
        conn = connect(sqlite_uri(path, params), write=not read_only)
        try:
            refuse_unsafe_schema(conn, path)
        except apsw.ReadOnlyError as exc:
            if not read_only or exc.extendedresult != apsw.SQLITE_READONLY_DIRECTORY:
                raise
            # A WAL database with no -shm in a directory we cannot write: no
            # writer can be live, so the file may be read as immutable.
            close_quietly(conn)
            conn = connect(sqlite_uri(path, {"mode": "ro", "immutable": "1"}), write=False)
            refuse_unsafe_schema(conn, path)
        version = _schema_version(conn, path)
        if version != SCHEMA_VERSION:
            newer = "the database is newer" if version > SCHEMA_VERSION else "this build is newer"
            raise SchemaVersionError(
                f"{path} is at version {version}, this build writes {SCHEMA_VERSION} "
                f"({newer}); the consumer that owns the database migrates it",
                found=version,
                known=SCHEMA_VERSION,
            )
        if not read_only:
            lease = connect(sqlite_uri(path, params), write=True)
    except apsw.NotADBError as exc:
        close_quietly(lease)
        close_quietly(conn)
        raise StoreOpenError(
            f"{path} is not a SQLite database; name the agentrt database file") from exc
    except apsw.Error as exc:
        close_quietly(lease)
        close_quietly(conn)
        raise StoreOpenError(f"{path}: {exc}") from exc
    except BaseException:
        close_quietly(lease)
        close_quietly(conn)
        raise
    return Store(conn, path, read_only=read_only, lease_conn=lease)

"""One write transaction: the state change and the events that explain it.

Every write goes through :class:`Tx`, opened by ``Store.tx()``: it begins
IMMEDIATE (the write lock is held from the start, so a read-then-write
transaction waits for another process's writer instead of failing to
upgrade), runs the mutation, appends the events, commits, and only then hands
the events to the observer. An observer never sees an event whose state did
not commit.
"""

from __future__ import annotations

import errno
import os
import re
import resource
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext, suppress
from datetime import datetime
from types import TracebackType
from typing import Any, cast

import apsw
import orjson

from agentrt.chain import chain_hash
from agentrt.errors import AgentrtError, described
from agentrt.events import Event, Observer
from agentrt.gojson import Raw, dumps, is_valid, replace_lone_surrogates
from agentrt.timefmt import format_time

__all__ = [
    "ChainHead",
    "StoreClosedError",
    "StoreFullError",
    "StoreIOError",
    "StoreWriteError",
    "TransactionEndedError",
    "TransactionOpenError",
    "Tx",
    "TxScope",
    "encode_payload",
]


class StoreClosedError(AgentrtError, apsw.ConnectionClosedError):
    """A call on a store that was closed. Also an ``apsw.ConnectionClosedError``,
    which such a call raised before."""

    base = "agentrt: the store is closed"


class TransactionOpenError(AgentrtError, apsw.SQLError):
    """A transaction was begun inside another on the same connection (a
    ``store.tx()`` inside another). Also the ``apsw.SQLError`` SQLite raises."""

    base = "agentrt: a transaction is already open on this store"


class TransactionEndedError(AgentrtError, apsw.SQLError):
    """SQL run through a ``store.tx()`` (a ROLLBACK, COMMIT, or ROLLBACK TO a
    savepoint) ended its transaction or undid events appended in it. The
    transaction's events and chain head are kept in memory, so it is refused
    whole. Also the ``apsw.SQLError`` the COMMIT of an ended one raised."""

    base = "agentrt: SQL run inside store.tx() ended its transaction or undid its events"


class StoreWriteError(apsw.Error):
    """A transaction SQLite could not write to the file, rolled back whole: the
    file system is full, the file reached the process's size limit, or a disk
    I/O error. Its text is one sentence: the database, the cause, the fix.

    An ``apsw.Error`` (a :class:`StoreFullError` is an ``apsw.FullError``, a
    :class:`StoreIOError` an ``apsw.IOError``), as such a write raised before.
    """

    def __init__(self, path: str, cause: str, remedy: str, action: str = "try again") -> None:
        self.path = path
        self.cause = cause
        self.remedy = remedy
        self.action = action
        super().__init__(f"{path}: {cause}, so the transaction was rolled back (the database "
                         f"is as it was before it); {remedy} and {action}")

    def retold(self, path: str = "", action: str = "") -> StoreWriteError:
        """The same failure said of ``path`` as the caller named it, with the
        caller's next ``action`` (``resume run R``)."""
        told = type(self)(path or self.path, self.cause, self.remedy, action or self.action)
        told.__cause__ = self.__cause__
        return told


class StoreFullError(StoreWriteError, apsw.FullError):
    """:class:`StoreWriteError` for want of space (SQLITE_FULL, ENOSPC, EDQUOT, EFBIG)."""


class StoreIOError(StoreWriteError, apsw.IOError):
    """:class:`StoreWriteError` for a disk I/O error SQLite reported (SQLITE_IOERR)."""


#: The failures of a write that :func:`write_failed` words.
WRITE_FAILED = (apsw.FullError, apsw.IOError)


def write_failed(path: str, exc: apsw.Error, system_errno: int = 0) -> StoreWriteError:
    """The :class:`StoreWriteError` for ``exc`` (an apsw.FullError or IOError) met
    writing ``path``; ``system_errno`` is the connection's errno just after it
    (SQLite says "disk I/O error" for a write past the file size limit)."""
    if isinstance(exc, StoreWriteError):
        return exc.retold(path)
    if system_errno == errno.EFBIG:
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        return StoreFullError(
            path, f"it reached this process's file size limit ({soft} bytes, ulimit -f)",
            "raise the limit (ulimit -f unlimited)")
    if system_errno == errno.EDQUOT:
        return StoreFullError(path, "its owner's disk quota on the file system holding it "
                              "is used up", "free space there")
    if isinstance(exc, apsw.FullError) or system_errno == errno.ENOSPC:
        return StoreFullError(path, "the file system holding it is full", "free space there")
    said = f"{exc}: {os.strerror(system_errno)}" if system_errno else str(exc)
    return StoreIOError(path, f"disk I/O error ({said})",
                        "check the file system holding it (full, read-only or failing), "
                        "run agentrt verify on it")


#: What apsw raises for a statement on a closed connection (or its cursor).
CLOSED = (apsw.ConnectionClosedError, apsw.CursorClosedError)


def closed_error(path: str = "") -> StoreClosedError:
    """The error for a call on a closed store (of the file at ``path``)."""
    again = "open it again (open_store or open_existing) to read or write it"
    return StoreClosedError(f"{path}: {again}" if path else again)


# The head: the larger of the highest seq stored and the highest AUTOINCREMENT
# ever handed out (which survives deleting the newest events), and the hash of
# the newest stored event.
_HEAD_SQL = (
    "SELECT MAX("
    # The row of the events table under the name it was created with, whatever
    # its case: AUTOINCREMENT keeps only that one.
    "COALESCE((SELECT seq FROM sqlite_sequence WHERE name = (SELECT name FROM sqlite_schema "
    "WHERE type = 'table' AND lower(name) = 'events')), 0), "
    "COALESCE((SELECT MAX(seq) FROM events), 0)), "
    # As stored, bytes: the chain hashes them (a BLOB, or text that is not UTF-8).
    "(SELECT CAST(hash AS BLOB) FROM events ORDER BY seq DESC LIMIT 1)"
)
# How many of the transaction's appended seqs are still stored, and the last one's hash.
_APPENDED_SQL = ("SELECT COUNT(*), (SELECT hash FROM events WHERE seq = ?2) FROM events "
                 "WHERE seq >= ?1 AND seq <= ?2")
_INSERT_EVENT_SQL = (
    "INSERT INTO events (seq, run_id, step_id, at, type, payload_json, hash) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)


_NO_LOCK = nullcontext()
#: The largest seq SQLite hands out (a signed 64-bit rowid).
_MAX_SEQ = 2**63 - 1
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


class ChainHead:
    """The chain's head (seq, hash) as the store's last own-writes transaction left
    it, and the connection's data version just after that commit.

    SQLite's data version (``SQLITE_FCNTL_DATA_VERSION``) changes with every
    commit to the file, by this connection or any other, once a transaction
    sees it. So inside a later transaction, an unchanged version proves no
    commit happened in between: the head is still this one, and reading it
    again (three subqueries, the costliest statement of a small transaction)
    can be skipped. Only transactions opened with ``own_writes`` use and
    update it: their statements are the runtime's, which change the events
    table through ``append`` alone; any other transaction reads the head.
    """

    __slots__ = ("hash", "seq", "version")

    def __init__(self) -> None:
        self.version = -1  # never a data version
        self.seq = 0
        self.hash = ""


def encode_payload(payload: bytes | dict[str, Any] | None) -> bytes:
    """A payload's stored bytes: dicts are encoded in their insertion order, as
    Go encodes a struct; empty is ``{}``.

    Raises TypeError for anything but bytes, a dict or None, and for a dict
    the encoder cannot write (naming the key); bytes are taken as they are
    (:meth:`Tx.append` checks that they hold JSON).
    """
    if isinstance(payload, bytes):  # the common case first: the caller encoded it
        return payload if payload.strip() else b"{}"
    if payload is None:
        return b"{}"
    if isinstance(payload, dict):
        try:
            return dumps(payload)
        except (TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise TypeError(f"agentrt: append: {_unencodable(payload, exc)}") from exc
    hint = (": encode it (.encode()) if it is JSON, or pass a dict"
            if isinstance(payload, str) else "")
    raise TypeError(f"agentrt: append: payload is {described(payload)}, not bytes holding "
                    f"JSON, a dict or None{hint}")


def _shown(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _unencodable(payload: dict[str, Any], exc: BaseException) -> str:
    """The sentence for a dict payload the encoder refused: where, and what.
    Walked only after the encoder failed; depth-first, in the encoder's order."""
    stack: list[tuple[str, Any, bool]] = [("payload", payload, False)]
    open_: set[int] = set()  # the containers being walked: one met again is a cycle
    while stack:
        path, value, leaving = stack.pop()
        if leaving:
            open_.discard(id(value))
            continue
        if isinstance(value, (dict, list, tuple)):
            if id(value) in open_:
                return f"{path} holds itself (a cycle), which JSON cannot hold"
            open_.add(id(value))
            stack.append((path, value, True))
        if isinstance(value, dict):
            for key in value:
                if not isinstance(key, str):
                    return (f"{path} has a key that is {described(key)}: JSON "
                            "object keys are str")
            stack.extend((f"{path}[{k!r}]", v, False) for k, v in reversed(value.items()))
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{path}[{i}]", v, False)
                         for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, float):
            return (f"{path} is the float {value!r}, which the payload encoder does not "
                    "write (a float's JSON differs between Go and Python): store it as a "
                    "str or an int, or pass the payload as JSON bytes")
        elif isinstance(value, Raw):
            if value.data.strip() and not is_valid(value.data):
                return f"{path} is a Raw value that is not JSON ({_shown(value.data)})"
        elif not isinstance(value, (str, int, type(None))):
            return (f"{path} is {described(value)}, which JSON "
                    "cannot hold: use str, int, bool, None, list or dict")
    return f"payload cannot be encoded as JSON: {exc}"


def _check_json(data: bytes) -> None:
    """Refuse bytes that are not one JSON value in UTF-8; orjson refused them,
    so this is the failure path (numbers beyond a double, or an escaped lone
    surrogate, are JSON orjson refuses)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"agentrt: append: payload {_shown(data)} is not UTF-8 "
                         f"({exc.reason} at byte {exc.start}): pass JSON encoded as UTF-8, "
                         "or a dict") from None
    if not is_valid(data):
        raise ValueError(f"agentrt: append: payload {_shown(data)} is not JSON: pass one "
                         "JSON value encoded as UTF-8, or a dict")


def _names(run_id: object, step_id: object, type_: object) -> tuple[str, str, str]:
    """The checked ``run_id``, ``step_id`` and ``type`` of an event, str
    subclasses (an ``EventType``) as plain str; TypeError or ValueError for
    one that is not text, or an empty run id or type."""
    for name, value in (("run_id", run_id), ("step_id", step_id), ("type", type_)):
        if not isinstance(value, str):
            raise TypeError(f"agentrt: append: {name} is {described(value)}, not a str")
    if not run_id:
        raise ValueError("agentrt: append: run_id is empty: name the run the event belongs to")
    if not type_:
        raise ValueError("agentrt: append: type is empty: name the event's type, such as "
                         "'run.created'")
    return str(run_id), str(step_id), str(type_)


def _at_error(at: object) -> Exception:
    if not isinstance(at, datetime):
        return TypeError(f"agentrt: append: at is {described(at)}, not a datetime: pass an "
                         "aware datetime, such as datetime.now(UTC)")
    if at.tzinfo is None or at.utcoffset() is None:
        return ValueError(f"agentrt: append: at {at.isoformat()} has no time zone: pass an "
                          "aware datetime, such as datetime.now(UTC)")
    return ValueError(f"agentrt: append: at {at.isoformat()} is the zero time, which is "
                      "stored as no time at all: pass the time the event happened")


class Tx:
    """One write transaction: ``with store.tx(observer) as tx``.

    Enter takes the store's lock and begins IMMEDIATE; a clean exit commits and
    then hands the events to the observer; an exception (any BaseException)
    rolls back and propagates, so the connection is never left inside an open
    transaction and the observer never sees an event whose state did not
    commit. Inside, ``execute`` runs a statement on the store's connection and
    ``append`` adds an event with the next seq (head + 1, read once inside this
    transaction) and its chain hash. Ending the transaction is the block's:
    SQL that ends it or rolls a savepoint back over appended events is
    refused (:class:`TransactionEndedError`), as its events are kept here.

    The context manager and the handle are one object (``TxScope`` is the same
    class under its former name): every write of every step goes through it,
    and a second object per transaction was measurable.
    """

    __slots__ = ("_conn", "_cur", "_known_head", "_head_hash", "_head_seq", "_lock",
                 "_observer", "_undo_possible", "events")

    def __init__(self, conn: apsw.Connection,
                 lock: AbstractContextManager[Any] | None = None,
                 observer: Observer | None = None, known_head: ChainHead | None = None,
                 cursor: apsw.Cursor | None = None) -> None:
        self._conn = conn
        # The transaction's own statements (BEGIN, COMMIT, the head, the events,
        # ``run``) share one cursor: a cursor per statement, as ``conn.execute``
        # makes, cost a third of a small statement. Each runs to its end (the
        # head's aggregate is reset by the insert after it). The store hands
        # over its cursor, used only under its lock.
        self._cur = cursor if cursor is not None else conn.cursor()
        self._lock = lock if lock is not None else _NO_LOCK
        self._observer = observer
        #: Set for the runtime's own transactions (see :class:`ChainHead`).
        self._known_head = known_head
        self._head_seq: int | None = None
        self._head_hash = ""
        self.events: list[Event] = []
        #: Whether SQL run here may have ended the transaction or rolled a
        #: savepoint back over appended events (checked at the commit then).
        self._undo_possible = False

    def __enter__(self) -> Tx:
        lock = self._lock
        lock.__enter__()
        conn = self._conn
        was_open = True  # (until read: a closed connection raises reading it)
        try:
            was_open = conn.in_transaction
            self._cur.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            if not was_open:
                # BEGIN may have succeeded and then an interrupt (Ctrl-C while
                # it waited for the write lock) surfaced: end what it began.
                with suppress(apsw.Error):
                    if conn.in_transaction:
                        self._cur.execute("ROLLBACK")
            lock.__exit__(None, None, None)
            if isinstance(exc, CLOSED):
                raise closed_error() from exc
            if isinstance(exc, apsw.SQLError) and was_open:
                raise TransactionOpenError(
                    "store.tx() cannot begin inside another on the same connection; do "
                    "these writes in the open transaction, or after it ends") from exc
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        conn = self._conn
        cur = self._cur
        try:
            if exc_type is None:
                if not conn.in_transaction:  # ended by SQL whose rows were read later, say
                    raise TransactionEndedError(
                        "SQL run in it ended the transaction before its end (a COMMIT or "
                        "ROLLBACK, or a trigger's RAISE(ROLLBACK)), so what it had done is "
                        "committed or rolled back as that SQL said and the observer was told "
                        "nothing; leave ending it to the with block")
                if self._undo_possible and self.events and not self._appended_stored():
                    if conn.in_transaction:
                        cur.execute("ROLLBACK")
                    raise TransactionEndedError(
                        "events appended in it were rolled back (a ROLLBACK, or a ROLLBACK "
                        "TO a savepoint), so it was rolled back whole and the observer got "
                        "nothing; undo appended events only by raising out of the with block")
                try:
                    cur.execute("COMMIT")
                except BaseException as failed:
                    said = conn.system_errno  # the write's errno, before the rollback
                    if conn.in_transaction:
                        cur.execute("ROLLBACK")
                    if isinstance(failed, WRITE_FAILED):
                        raise write_failed(conn.filename, failed, said) from failed
                    raise
                known = self._known_head
                if known is not None and self._head_seq is not None:
                    # Invalid first, valid last: an interrupt in between must not
                    # leave an old head under the current version.
                    known.version = -1
                    known.seq = self._head_seq
                    known.hash = self._head_hash
                    known.version = conn.data_version()
            else:
                said = conn.system_errno
                if conn.in_transaction:
                    cur.execute("ROLLBACK")
                if isinstance(exc, WRITE_FAILED) and not isinstance(exc, StoreWriteError):
                    # A statement's page write (a cache spill, or a new page of a
                    # growing table) met the full disk before COMMIT did.
                    raise write_failed(conn.filename, exc, said) from exc
        finally:
            self._lock.__exit__(None, None, None)
        observer = self._observer
        if exc_type is None and observer is not None:
            for event in self.events:
                observer(event)

    def _appended_stored(self) -> bool:
        """Whether every event appended is still stored, the last with its hash:
        a savepoint rolled back over some would leave the chain broken and the
        observer told of events that are not there."""
        events = self.events
        count, last_hash = self._cur.execute(
            _APPENDED_SQL, (events[0][0], events[-1][0])).fetchall()[0]
        return bool(count == len(events) and last_hash == self._head_hash)

    @property
    def conn(self) -> apsw.Connection:
        return self._conn

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> apsw.Cursor:
        """Run one statement (or several) in this transaction; its own cursor, so
        its rows can be read while other statements run."""
        shape = _shape(sql)
        cursor = self._conn.execute(sql, bindable(params))
        if shape & _MAY_UNDO:
            self._controlled()
        return cursor

    def run(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> int:
        """Run one statement that returns no rows (an INSERT or UPDATE without
        RETURNING): cheaper than :meth:`execute`, as it reuses one cursor.
        Returns the rows it changed (as :meth:`changes` would, one call less
        for a compare-and-set write)."""
        shape = _shape(sql)
        if shape & _SEVERAL:  # the ones before a failed bind would run again
            params = bindable(params)
        try:
            self._cur.execute(sql, params)
        except UnicodeEncodeError:  # one statement: refused at its bind, it did not run
            self._cur.execute(sql, storable(params))
        if shape & _MAY_UNDO:
            self._controlled()
        return self._conn.changes()

    def one(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
            ) -> tuple[Any, ...] | None:
        """The first row of a query, or None.

        On a cursor of its own, dropped at once: a query left part-read would
        hold its table (a DROP in the same transaction would find it locked).
        """
        shape = _shape(sql)
        if shape & _SEVERAL:
            params = bindable(params)
        try:
            row = self._conn.execute(sql, params).fetchone()
        except UnicodeEncodeError:  # one statement: refused at its bind, it did not run
            row = self._conn.execute(sql, storable(params)).fetchone()
        if shape & _MAY_UNDO:
            self._controlled()
        return tuple(row) if row is not None else None

    def only(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """:meth:`one` for a query that yields at most one row (a lookup by primary
        key): on the transaction's shared cursor, read to its end, so it holds
        nothing afterwards and skips a cursor of its own (a third of the query)."""
        shape = _shape(sql)
        if shape & _SEVERAL:
            params = cast(Sequence[Any], bindable(params))
        try:
            rows = self._cur.execute(sql, params).fetchall()
        except UnicodeEncodeError:  # one statement: refused at its bind, it did not run
            rows = self._cur.execute(sql, storable(params)).fetchall()
        if shape & _MAY_UNDO:
            self._controlled()
        return tuple(rows[0]) if rows else None

    def _controlled(self) -> None:
        """After SQL that may end the transaction or undo part of it: the commit
        will check its events are all still there; one that ended it is refused
        at once (what it committed or rolled back stays so; the observer is told
        nothing)."""
        self._undo_possible = True
        if not self._conn.in_transaction:
            raise TransactionEndedError(
                "SQL run through it ended the transaction (a COMMIT, END or ROLLBACK), so "
                "what it had done is committed or rolled back as that SQL said and the "
                "observer was told nothing; leave ending it to the with block")

    def changes(self) -> int:
        """Rows changed by the last statement (compare-and-set writes check it)."""
        return int(self._conn.changes())

    def append(
        self,
        run_id: str,
        step_id: str,
        at: datetime,
        type: str,
        payload: bytes | dict[str, Any] | None = None,
    ) -> Event:
        """Append one event to the global chain inside this transaction.

        Its seq is the head's + 1: the head is read once, at the transaction's
        first append, as the larger of the highest seq stored and the highest
        AUTOINCREMENT ever handed out, so a seq is never reused even after the
        newest events were deleted. The write lock is held from BEGIN
        IMMEDIATE, so writers in other processes extend the same chain.

        ``run_id`` and ``type`` are non-empty str, ``step_id`` a str ('' for
        none), ``at`` an aware datetime, and ``payload`` bytes holding one
        JSON value in UTF-8 (blank: ``{}``), a dict (encoded as Go encodes a
        struct, in insertion order; no floats) or None (``{}``). Anything else
        raises TypeError or ValueError naming the argument, before anything is
        read or written (a ``run_id`` naming no run, when the insert finds it;
        it writes nothing either); raised inside ``with``, it rolls the
        transaction back. Appending after SQL run through :meth:`execute`
        ended the transaction raises :class:`TransactionEndedError`.
        """
        # The arguments are checked before anything is read or written, each
        # where using it costs the check anyway: a wrong one fails that use
        # (or takes the path a str subclass takes) and is then said plainly.
        if isinstance(payload, bytes) and payload.strip():
            data = payload
            try:
                _loads(data)
            except _JSONDecodeError:
                _check_json(data)
        else:
            data = encode_payload(payload)
        return self.append_encoded(run_id, step_id, at, type, data)

    def append_encoded(self, run_id: str, step_id: str, at: datetime, type: str,
                       data: bytes) -> Event:
        """:meth:`append` for ``data`` that this package's JSON encoder just wrote
        (the driver's path, five events a step): the bytes are not parsed again
        to check they are JSON. Bytes from anywhere else go through :meth:`append`.
        """
        if (run_id.__class__ is not str or step_id.__class__ is not str
                or type.__class__ is not str or not run_id or not type):
            run_id, step_id, type = _names(run_id, step_id, type)
        try:
            at_text = format_time(at) if at.tzinfo is not None else ""
        except AttributeError:
            at_text = ""
        except OverflowError:
            raise ValueError(f"agentrt: append: at {at.isoformat()} is out of range in UTC "
                             "(its offset takes it before year 1 or past year 9999): pass "
                             "the time the event happened") from None
        if not at_text:
            raise _at_error(at)
        conn = self._conn
        if not conn.in_transaction:  # SQL, or a trigger's RAISE(ROLLBACK), ended it
            raise TransactionEndedError(
                "append needs the transaction open, and a ROLLBACK or COMMIT run through "
                "execute ended it; leave ending it to the with block")
        seq = self._head_seq
        if seq is None:
            known = self._known_head
            if known is not None and known.version == conn.data_version():
                seq, self._head_hash = known.seq, known.hash  # no commit since it was left
            else:
                row = self._cur.execute(_HEAD_SQL).fetchone()
                assert row is not None  # an aggregate always yields a row
                seq = int(row[0])
                # Bytes that are not UTF-8 become lone surrogates, which the
                # chain hash below cannot encode: its fallback hashes them back
                # to the stored bytes.
                self._head_hash = (row[1] or b"").decode("utf-8", "surrogateescape")
        if seq >= _MAX_SEQ:
            raise StoreWriteError(
                conn.filename, f"its events have used every seq SQLite counts (the head is "
                f"{str(seq)[:24]})", "copy the runs to keep into a new database")
        seq += 1
        text = data.decode("utf-8")  # as stored, and hashed as these UTF-8 bytes
        try:
            digest = chain_hash(self._head_hash, seq, run_id, step_id, at_text, type, text)
        except UnicodeEncodeError:
            clean = replace_lone_surrogates
            run_id, step_id, type = clean(run_id), clean(step_id), clean(type)
            digest = chain_hash(self._head_hash, seq, run_id, step_id, at_text, type, text)
        try:
            self._cur.execute(_INSERT_EVENT_SQL,
                              (seq, run_id, step_id, at_text, type, text, digest))
        except apsw.ConstraintError:
            if self.only("SELECT 1 FROM runs WHERE id = ?", (run_id,)) is not None:
                raise
            raise ValueError(f"agentrt: append: run {_shown(run_id)} does not exist: insert "
                             "the run first, or name one that exists") from None
        self._head_seq = seq
        self._head_hash = digest
        # Event's own constructor would format ``at`` again; the fields are final.
        event: Event = tuple.__new__(Event, (seq, run_id, step_id, at_text, type, data))
        self.events.append(event)
        return event


def storable(params: Sequence[Any] | Mapping[str, Any]) -> Sequence[Any] | Mapping[str, Any]:
    """``params`` with each lone surrogate in a string as U+FFFD.

    SQLite stores UTF-8, which cannot hold a lone surrogate (Python's JSON
    decoder makes one from a ``"\\ud800"`` escape a model wrote), so binding
    one raises before the statement runs. Such text is stored as the JSON
    encoder writes it, U+FFFD, instead of failing the transition half-way.
    """
    if isinstance(params, Mapping):
        return {k: replace_lone_surrogates(v) if isinstance(v, str) else v
                for k, v in params.items()}
    return [replace_lone_surrogates(v) if isinstance(v, str) else v for v in params]


#: Words of the SQL that can end a transaction or undo part of it.
#: Statements that end the transaction or undo part of it (at a statement's start:
#: the CASE ... END of an ordinary write is none).
_TRANSACTION_CONTROL = re.compile(  # possessive: no backtracking over a long run of space
    r"(?:^|;)(?:\s++|--[^\n]*+|/\*(?:[^*]|\*(?!/))*+\*/)*+"
    r"(?:ROLLBACK|COMMIT|END|RELEASE|SAVEPOINT|BEGIN)\b",
    re.I)
_MAY_UNDO, _SEVERAL = 1, 2
_SHAPES: dict[str, int] = {}


def _shape(sql: str) -> int:
    """Whether ``sql`` may end the transaction or roll a savepoint back (so the
    commit checks its events are still there), and whether it may be several
    statements (so a parameter is made bindable before any runs); remembered
    per text, as the runtime's own statements are a few constant ones."""
    shape = _SHAPES.get(sql)
    if shape is None:
        shape = ((_MAY_UNDO if _TRANSACTION_CONTROL.search(sql) else 0)
                 | (_SEVERAL if ";" in sql.strip().rstrip(";") else 0))
        if len(_SHAPES) < 1024:
            _SHAPES[sql] = shape
    return shape


def bindable(params: Sequence[Any] | Mapping[str, Any]) -> Sequence[Any] | Mapping[str, Any]:
    """``params`` itself, or :func:`storable` of it when a string holds a lone
    surrogate. Checked before the SQL runs, not after a bind failed: a text of
    several statements has run those before the failing one, and would run
    them twice. Only a non-ASCII string can hold one, so the usual write pays
    an ``isascii`` per string."""
    if not params:  # () or None: nothing to bind
        return params
    values = (params if params.__class__ is tuple
              else params.values() if isinstance(params, Mapping) else params)
    for v in values:
        if isinstance(v, str) and not v.isascii():
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return storable(params)
    return params


#: The former name of the transaction's context manager, now :class:`Tx` itself.
TxScope = Tx

"""The Follower: pages the events table by its seq cursor into a sink, read-only.

Seq is assigned by the writer inside its IMMEDIATE transaction, so it rises
in commit order across every run and is never reused: a reader always sees a
prefix of the seq order, and the seq of the last event a sink accepted is a
safe place to resume. The follower saves that cursor after each page and
before every return that follows a delivery, which makes delivery exactly
once across clean stops and at least once (at most one page again) after a
hard kill. It never writes the database and holds no read transaction while
the sink runs, so it never stops the writer's checkpoints.
"""

from __future__ import annotations

import inspect
import math
import os
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from agentrt.errors import AgentrtError, NotFoundError, shown_number
from agentrt.errors import described as _described
from agentrt.events import Event
from agentrt.store import Store
from agentrt.store.pages import one_snapshot
from agentrt_export.cursor import ALL_RUNS, Cursor, FileCursor, MemoryCursor, scope_of
from agentrt_export.wake import ChangeWaiter, open_waiter

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_INTERVAL",
    "MAX_PAGE_SIZE",
    "EventSink",
    "FollowError",
    "Follower",
    "HeadNotFoundError",
    "PageSink",
    "PartialPage",
]

DEFAULT_PAGE_SIZE = 500
MAX_PAGE_SIZE = 10_000
MAX_INTERVAL = 60.0
#: Longest wait between checks when a change notification ends waits early.
NOTIFIED_INTERVAL = 1.0
#: Wait between checks when no change notification is available.
POLL_INTERVAL = 0.005
#: After a notification with nothing new yet (the writer is still syncing its
#: commit), check this often for this long before sleeping again.
SETTLE_POLL = 0.001
SETTLE_WINDOW = 0.2


class FollowError(AgentrtError):
    """The follower cannot start or go on: bad settings, or a cursor that does
    not fit the database."""

    base = "export"


class HeadNotFoundError(FollowError, NotFoundError):
    """:meth:`Follower.head` found no event at the cursor's seq: a FollowError,
    and a NotFoundError as the specification's wrapped ErrNotFound is."""


class EventSink(Protocol):
    """Receives one event at a time; raising refuses the event and stops the follower.

    If the sink has a ``flush()`` method, the follower calls it after each page
    and saves the cursor only once it returns.
    """

    def __call__(self, event: Event) -> None: ...


@runtime_checkable
class PageSink(Protocol):
    """Receives a whole page; the page counts as delivered only if it returns."""

    def handle_page(self, events: Sequence[Event]) -> None: ...


class PartialPage(Exception):
    """Raised by a page sink whose page failed after its first ``accepted``
    events had reached their destination; ``error`` is the failure. The
    follower saves the cursor after those events, then raises ``error``, so a
    restart delivers the rest of the page and nothing twice."""

    def __init__(self, accepted: int, error: Exception) -> None:
        super().__init__(f"{shown_number(accepted)} events delivered, then: {error}")
        self.accepted = accepted
        self.error = error


Sink = EventSink | PageSink | Callable[[Event], None]


class Follower:
    """Follow the events of one run (``run_id``) or of all runs, in commit order.

    ``store`` should come from ``open_existing(path, read_only=True)``.
    ``cursor`` holds the position (None: start at 0 and remember nothing).
    ``interval`` is the longest wait between checks once caught up: on Linux a
    change to the database's files ends the wait at once, so the default is a
    second there and 5 ms elsewhere; 0, as in the reference, means the
    default. ``once`` returns as soon as everything committed at that moment
    has been delivered.
    """

    def __init__(
        self,
        store: Store,
        *,
        run_id: str | None = None,
        cursor: Cursor | None = None,
        interval: float | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        once: bool = False,
        on_page: Callable[[int, int], None] | None = None,
    ) -> None:
        if store is None:
            raise FollowError("Follower needs a store")
        if not isinstance(store, Store):
            raise FollowError(f"store is {_described(store)}, not a Store: open the database "
                              "with agentrt.store.open_existing(path) and pass that")
        if run_id is not None and not isinstance(run_id, str):
            raise FollowError(f"run_id is {_described(run_id)}, not a str: name one run, or "
                              "leave it None for every run")
        if cursor is not None and not isinstance(cursor, Cursor):
            hint = (": for a cursor kept in a file, pass FileCursor(path)"
                    if isinstance(cursor, (str, os.PathLike)) else "")
            raise FollowError(f"cursor is {_described(cursor)}, not a cursor (an object with "
                              f"load() and save(seq), such as FileCursor or MemoryCursor){hint}")
        if interval is not None and (isinstance(interval, bool)
                                     or not isinstance(interval, (int, float))):
            raise FollowError(f"interval is {_described(interval)}, not a number of seconds")
        if isinstance(interval, float) and math.isnan(interval):
            raise FollowError("interval nan is not a number of seconds")
        if interval is not None and interval < 0:
            raise FollowError(f"interval {shown_number(interval)} is negative")
        if isinstance(page_size, bool) or not isinstance(page_size, int):
            raise FollowError(f"page size is {_described(page_size)}, not an int: events per "
                              f"read, 1 to {MAX_PAGE_SIZE} (0: {DEFAULT_PAGE_SIZE})")
        if page_size < 0:
            raise FollowError(f"page size {shown_number(page_size)} is negative")
        if not isinstance(once, bool):
            raise FollowError(f"once is {_described(once)}, not True or False")
        if on_page is not None and not callable(on_page):
            raise FollowError(f"on_page is {_described(on_page)}, not a function of "
                              "(seq, count) or None")
        self.store = store
        self.run_id = run_id or ""
        self.cursor: Cursor = cursor if cursor is not None else MemoryCursor()
        self._keeps_cursor = cursor is not None
        self.interval = None if not interval else min(interval, MAX_INTERVAL)
        self.page_size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        self.once = once
        self.on_page = on_page

    # -- position --------------------------------------------------------------

    def _start_seq(self) -> int:
        """Where to start, checked before anything is delivered: a file cursor
        that could not be saved later (checked as it is held), or a position past
        the head, is refused."""
        seq = self.cursor.load()
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise FollowError(f"the cursor's load() returned {_described(seq)}, not an int "
                              "seq")
        if seq < 0:
            raise FollowError(f"cursor {shown_number(seq)} is negative")
        if seq:
            head, _ = self.store.chain_head()
            if seq > head:
                raise FollowError(self._ahead(seq, head))
            self._check_binding(seq)
            self._check_scope(seq)
        return seq

    def _check_binding(self, seq: int) -> None:
        """Refuse a file cursor saved against another database: the chain hash
        it was saved with must be the one this database has at its seq. (A
        restored backup of the same database has the same events up to there.)"""
        if not isinstance(self.cursor, FileCursor):
            return
        bound = self.cursor.binding(seq)
        if bound is None or bound == self.store.event_hash(seq):
            return
        path = self.cursor.path
        raise FollowError(
            f"cursor file {path} was saved after seq {seq} of another database: "
            f"{self.store.path} has another history up to that event (its chain hash "
            f"differs), so the events after it are not the ones the cursor stands "
            f"before; give this database a cursor file of its own, or delete {path} to "
            "export it from the start")

    def _check_scope(self, seq: int) -> None:
        """Refuse a file cursor saved by an export of one run to a wider export
        (every run, or another run): its seq stands after events of the other
        runs that it never delivered, which would be skipped for good. The same
        run goes on, and so does one run on a cursor of every run; a cursor with
        no scope saved (the reference's, an old one, no extended attributes)
        is taken as it is."""
        if not isinstance(self.cursor, FileCursor):
            return
        saved, asked = self.cursor.scope(seq), scope_of(self.run_id)
        if saved is None or saved in (ALL_RUNS, asked):
            return
        path = self.cursor.path
        run, flag = _scope_words(saved)
        wider, _ = _scope_words(asked)
        raise FollowError(
            f"cursor file {path} was saved by an export of {run} alone, so the events of "
            f"other runs up to its seq {seq} were not delivered through it and this export of "
            f"{wider} would skip them for good: go on with {flag} and this cursor file, or "
            f"give the export of {wider} a cursor file of its own (or --after-seq instead of "
            "one)")

    def _save(self, seq: int, known: str | None = None) -> None:
        """Save the cursor; a file cursor also keeps the chain hash at ``seq``
        (``known``: read with the page, else read now), which binds it to this
        database, and this export's scope, which keeps a wider export from
        skipping what it did not deliver (both checked on the next start). A
        one-run export on a cursor of every run saves its run's scope: past the
        old seq it delivered no other run's events."""
        cursor = self.cursor
        # A subclass's own save(seq) keeps the Cursor protocol and goes unbound.
        if isinstance(cursor, FileCursor) and type(cursor).save is FileCursor.save:
            cursor.save(seq, known if known is not None else self.store.event_hash(seq),
                        scope_of(self.run_id))
        else:
            cursor.save(seq)

    def _ahead(self, seq: int, head: int) -> str:
        end = f"ends at seq {head}" if head else "holds no events"
        if isinstance(self.cursor, FileCursor):
            path = self.cursor.path
            return (
                f"cursor file {path} is at seq {shown_number(seq)} but {self.store.path} "
                f"{end}: the database was replaced or restored from a backup; delete {path} "
                "to start over, or write into it a seq the database has"
            )
        return (
            f"the start position seq {shown_number(seq)} is past the end of "
            f"{self.store.path}, which {end}: the database was replaced or restored from a "
            "backup, or the position belongs to another database; start after a seq the "
            "database has"
        )

    def head(self) -> tuple[int, str]:
        """(seq, hash) of the last event delivered, for ``agentrt verify --head``.

        The hash covers every run's events up to that seq, even for a one-run
        follower. (0, '') before anything was delivered or without a cursor.
        Reads the cursor and one row; callable while ``follow`` runs.
        """
        if not self._keeps_cursor:
            return 0, ""
        seq = self.cursor.load()
        if seq <= 0:
            return 0, ""
        try:
            return seq, self.store.event_hash(seq)
        except NotFoundError as exc:
            raise HeadNotFoundError(f"head at seq {seq}: {exc}") from exc
        except AgentrtError as exc:
            raise FollowError(f"head at seq {seq}: {exc}") from exc

    # -- delivery --------------------------------------------------------------

    def _deliver(self, page: list[Event], sink: Sink, end_hash: str | None = None) -> int:
        """Hand one page to the sink and save the cursor; the new position.
        ``end_hash`` is the chain hash of the page's last event, read with it."""
        if isinstance(sink, PageSink):
            try:
                returned: object = sink.handle_page(page)  # type: ignore[func-returns-value]
                _refuse_awaitable(returned, sink)  # a plain def around async code
            except PartialPage as cut:
                # The first events reached the destination: a restart must
                # begin after them, with the one that failed.
                if not _usable_count(cut.accepted, len(page)):
                    cut.error.add_note(
                        f"the sink's PartialPage count was unusable: {_described(cut.accepted)}, "
                        f"not an int from 0 to {len(page)} (the events of the page); the cursor "
                        "was not saved")
                    raise cut.error from None
                if cut.accepted:
                    self._save_before_raising(page[cut.accepted - 1].seq, cut.error,
                                              (page[-1].seq, end_hash))
                raise cut.error from None
            last = page[-1].seq
            self._save(last, end_hash)
            return last
        last = 0
        try:
            for event in page:
                _refuse_awaitable(sink(event), sink)
                last = event.seq
        except Exception as exc:
            # The sink refused an event: keep what it accepted before it, if
            # that reached the sink's stream, so a restart begins with the
            # refused event. (BaseException, e.g. a hard kill, saves nothing.)
            if last and _flush(sink):
                self._save_before_raising(last, exc, (page[-1].seq, end_hash))
            raise
        if not _flush(sink, raising=True):
            return page[0].seq - 1  # pragma: no cover - _flush raised
        self._save(last, end_hash)
        return last

    def _save_before_raising(self, seq: int, error: Exception,
                             page_end: tuple[int, str | None]) -> None:
        """Save ``seq`` on the way out of a sink failure. A save that fails too
        is noted on ``error``, which stays the one raised: its type is what a
        caller catches (the reference joins the two the same way).

        ``page_end`` is the seq and chain hash of the page's last event as read
        with the page: the cursor is bound only if the history still ends the
        page that way (restored or rewritten meanwhile: not saved, so the next
        start checks the cursor saved before it against the new history)."""
        try:
            known = None
            if page_end[1] is not None:
                with self.store.locked() as conn, one_snapshot(conn):
                    now_end, known = self._hash_at(page_end[0]), self._hash_at(seq)
                if now_end != page_end[1] or known is None:
                    error.add_note(f"the cursor was not saved at seq {seq}: "
                                   f"{self.store.path} changed while the page was in hand")
                    return
            self._save(seq, known)
        except Exception as save_error:  # noqa: BLE001 - reported on the sink's error
            error.add_note(f"and the cursor could not be saved at seq {seq}: {save_error}")

    def follow(self, sink: Sink, stop: threading.Event | None = None) -> None:
        """Deliver every event after the cursor, then (unless ``once``) wait for more.

        Returns when ``stop`` is set (after finishing the page in hand and saving
        the cursor; a ``stop`` set before the call reads and delivers nothing)
        or, with ``once``, when caught up. A sink exception stops the
        follower with the cursor just before the refused event and propagates.
        Before anything is delivered, a ``FileCursor`` that could not be saved
        (see ``FileCursor.check``) or that another exporter holds (see
        ``FileCursor.acquire``; held here until the return unless the caller
        holds it), a position past the head, and a ``FileCursor`` saved on
        another database or by an export of one run when this one follows
        every run or another run, are refused.
        """
        if sink is None:
            raise FollowError("sink is None")
        if not isinstance(sink, PageSink) and not callable(sink):
            raise FollowError(f"sink is {_described(sink)}, not a function of one event or an "
                              "object with handle_page(events), such as JSONLSink")
        if _is_async(sink):
            raise FollowError(f"sink is {_described(sink)}, an async function: the follower "
                              "calls its sink synchronously and would save the cursor past "
                              "events it never handled; pass a plain function (run async "
                              "code inside it with asyncio.run)")
        if stop is not None and not isinstance(stop, threading.Event):
            raise FollowError(f"stop is {_described(stop)}, not a threading.Event or None")
        stop = stop if stop is not None else threading.Event()
        cursor = self.cursor
        if isinstance(cursor, FileCursor):
            # Checked before a lock file is made beside it; then held (refused
            # while another exporter, or another follow on this object, has it).
            cursor.check(database=self.store.path)
            with cursor.following():
                self._follow(sink, stop)
        else:
            self._follow(sink, stop)

    def _follow(self, sink: Sink, stop: threading.Event) -> None:
        seq = self._start_seq()
        path = os.path.abspath(self.store.path)  # the file now, whatever chdir comes later
        opened = file_identity(path)
        waiter: ChangeWaiter | None = None
        delivered: str | None = None  # the chain hash at seq, as this follower read it
        try:
            while True:
                if stop.is_set():  # before each read, the first included: nothing more is handed
                    return
                version = self.store.data_version()
                page, at_seq, at_end = self._read(seq)
                if opened is not None and (now := file_identity(path)) != opened:
                    raise FollowError(_replaced(self.store.path, seq, removed=now is None))
                if delivered is not None and at_seq != delivered:
                    raise FollowError(_rewritten(self.store.path, seq, cut=at_seq is None))
                delivered = at_end if page else at_seq
                if page:
                    seq = self._deliver(page, sink, at_end)
                    if self.on_page is not None:
                        self.on_page(seq, len(page))
                if len(page) == self.page_size and not stop.is_set():
                    continue
                if self.once or stop.is_set():
                    return
                if waiter is None:
                    waiter = open_waiter(self.store.path)
                if not self._wait_for_change(version, waiter, stop, path, opened):
                    return
        finally:
            if waiter is not None:
                waiter.close()

    def _read(self, seq: int) -> tuple[list[Event], str | None, str | None]:
        """The page after ``seq`` and the chain hashes at ``seq`` and at the page's
        last event (None: no such event), from one snapshot.

        A file restored or copied over in place (``sqlite3 .restore``, ``cp``)
        keeps its identity; its history up to ``seq`` then differs, or ends
        before it and its next events reuse seqs already delivered. The hash at
        ``seq`` read with each page tells it, with no read between the two.
        """
        with self.store.locked() as conn, one_snapshot(conn):
            page = self.store.list_events_after(self.run_id, seq, self.page_size)
            at_seq = self._hash_at(seq) if seq else None
            at_end = self._hash_at(page[-1].seq) if page else None
        return page, at_seq, at_end

    def _hash_at(self, seq: int) -> str | None:
        try:
            return self.store.event_hash(seq)
        except NotFoundError:
            return None

    def _wait_for_change(self, version: int, waiter: ChangeWaiter, stop: threading.Event,
                         path: str, opened: tuple[int, int] | None) -> bool:
        """Wait until the database changed since ``version``, or the file at ``path``
        is no longer the one ``opened`` (the next read says so); False if stopped.

        A file replaced or removed together with its -wal and -shm (a restore
        from backup) leaves this connection on the old, unlinked files, whose
        ``data_version`` never moves again: only the name tells."""
        if self.interval is not None:
            timeout = self.interval
        else:
            timeout = NOTIFIED_INTERVAL if waiter.notifies else POLL_INTERVAL
        settle_until = 0.0
        while not stop.is_set():
            if self.store.data_version() != version:
                return True
            if time.monotonic() < settle_until:
                stop.wait(SETTLE_POLL)
                continue
            if waiter.wait(timeout, stop):
                settle_until = time.monotonic() + SETTLE_WINDOW
            if opened is not None and file_identity(path) != opened:
                return True
        return False


def _is_async(sink: object) -> bool:
    """Whether what the follower would call is an ``async def`` (its coroutine
    would be dropped unrun while the cursor moved on)."""
    called = sink.handle_page if isinstance(sink, PageSink) else sink
    return (inspect.iscoroutinefunction(called)
            or inspect.iscoroutinefunction(type(called).__call__))


def _refuse_awaitable(result: object, sink: object) -> None:
    """Refuse what a sink returned that still has to run (a coroutine of an
    async client called from a plain function): the event was not handled."""
    if result is not None and inspect.isawaitable(result):  # None: the usual sink, fast
        close = getattr(result, "close", None)
        if callable(close):
            close()  # no "never awaited" warning on top of the sentence
        raise FollowError(f"sink {_described(sink)} returned {_described(result)}, which "
                          "has not run: the event was not handled; await it inside the sink "
                          "(asyncio.run) or pass a function that does the work")


def _usable_count(accepted: object, page_size: int) -> bool:
    """Whether a PartialPage's ``accepted`` counts events of a page of ``page_size``."""
    return (isinstance(accepted, int) and not isinstance(accepted, bool)
            and 0 <= accepted <= page_size)


def _scope_words(scope: str) -> tuple[str, str]:
    """How a sentence names ``scope`` (see ``scope_of``), and the ``--run`` flag
    that follows it."""
    if scope == ALL_RUNS:
        return "every run", "no --run"
    kind, _, run_id = scope.partition(":")
    if kind == "run":
        return f"run {run_id}", f"--run {shlex.quote(run_id)}"
    return (f"the run whose id has the SHA-256 {run_id} (too long to keep)",
            "--run and that run's id")


def file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``; None when there is none to stat."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _replaced(path: str, seq: int, *, removed: bool) -> str:
    # Checked after each read: a page read before the file was swapped is the
    # old file's, and one read after is refused whole, so the sink never gets
    # events of two databases (a restore or a copy over the file, with the old
    # -wal beside it, reads as the new file's events after the old cursor).
    if removed:
        return (f"{path} was removed while it was followed (the last event delivered is "
                f"seq {seq})")
    return (f"{path} was replaced by another file while it was followed; nothing of the "
            f"new file was delivered (the last event delivered is seq {seq}): start again "
            "to follow the new file, with a cursor that belongs to it")


def _rewritten(path: str, seq: int, *, cut: bool) -> str:
    # Checked with each read, as _replaced is, for a file changed in place.
    if cut:
        what = f"was cut back to before seq {seq}, the last event delivered,"
    else:
        what = (f"was rewritten up to seq {seq}, the last event delivered (its chain hash "
                "there changed),")
    return (f"{path} {what} while it was followed: restored from a backup or copied over "
            "in place; nothing of the new history was delivered: start again to follow it, "
            "with a cursor that belongs to it")


def _flush(sink: object, raising: bool = False) -> bool:
    flush = getattr(sink, "flush", None)
    if flush is None:
        return True
    try:
        flush()
        return True
    except Exception:
        if raising:
            raise
        return False

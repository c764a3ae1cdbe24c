"""The Follower in one process: order, cursor rules, read-only, bounded pages, head."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import threading
import time
from datetime import UTC, datetime

import apsw
import pytest
from eventdb import add_run, make_db

from agentrt.events import Event
from agentrt.records import MAX_PAGE_TEXT
from agentrt.store import open_existing, open_store
from agentrt_export import (
    CursorError,
    FileCursor,
    Follower,
    FollowError,
    JSONLSink,
    MemoryCursor,
    PartialPage,
)


class HardKill(BaseException):
    """Stands for the process dying inside the sink: nothing after it runs."""


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "runs.db")


def fingerprint(path):
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    st = os.stat(path)
    return digest, st.st_mtime_ns, st.st_mode


def collect(follower, **kw):
    got: list[Event] = []
    follower.follow(got.append, **kw)
    return got


def test_follower_delivers_every_run_in_commit_order(db_path):
    writer = make_db(db_path, runs=3, events_per_run=4)
    stored = [e for r in ("run-0", "run-1", "run-2") for e in writer.list_events(r)]
    reader = open_existing(db_path)
    got = collect(Follower(reader, once=True, page_size=5))
    assert [e.seq for e in got] == sorted(e.seq for e in stored)
    assert got == sorted(stored, key=lambda e: e.seq)
    one = collect(Follower(reader, run_id="run-1", once=True, page_size=2))
    assert [e.seq for e in one] == [e.seq for e in writer.list_events("run-1")]


def test_follower_delivers_exactly_once_across_restarts(db_path, tmp_path):
    writer = make_db(db_path, runs=2, events_per_run=5)
    reader = open_existing(db_path)
    cursor = FileCursor(str(tmp_path / "cursor"))
    first = collect(Follower(reader, cursor=cursor, once=True, page_size=3))
    assert cursor.load() == first[-1].seq == 10
    add_run(writer, "run-2", 4)
    second = collect(Follower(reader, cursor=cursor, once=True, page_size=3))
    assert [e.run_id for e in second] == ["run-2"] * 4
    assert not {e.seq for e in first} & {e.seq for e in second}
    mtime = os.stat(tmp_path / "cursor").st_mtime_ns
    assert collect(Follower(reader, cursor=cursor, once=True)) == []
    assert os.stat(tmp_path / "cursor").st_mtime_ns == mtime  # nothing new: not saved


def test_follower_saves_no_cursor_when_nothing_was_delivered(db_path, tmp_path):
    open_store(db_path).close()
    cursor_path = tmp_path / "cursor"
    assert collect(Follower(open_existing(db_path), cursor=FileCursor(str(cursor_path)),
                            once=True)) == []
    assert not cursor_path.exists()


def test_a_sink_with_flush_is_flushed_after_each_page_before_the_cursor_moves(db_path):
    make_db(db_path, runs=1, events_per_run=7)
    cursor = MemoryCursor()

    class Sink:
        def __init__(self) -> None:
            self.seqs: list[int] = []
            self.flushes: list[tuple[int, int]] = []  # (events handed over, cursor)

        def __call__(self, event: Event) -> None:
            self.seqs.append(event.seq)

        def flush(self) -> None:
            self.flushes.append((len(self.seqs), cursor.load()))

    sink = Sink()
    Follower(open_existing(db_path), cursor=cursor, page_size=3, once=True).follow(sink)
    assert sink.seqs == list(range(1, 8))
    assert sink.flushes == [(3, 0), (6, 3), (7, 6)]
    assert cursor.load() == 7


def test_a_page_sink_gets_whole_pages_and_the_cursor_moves_after_each(db_path):
    make_db(db_path, runs=1, events_per_run=7)
    cursor = MemoryCursor()
    pages: list[tuple[list[int], int]] = []

    class Sink:
        def handle_page(self, events: list[Event]) -> None:
            pages.append(([e.seq for e in events], cursor.load()))

    Follower(open_existing(db_path), cursor=cursor, page_size=3, once=True).follow(Sink())
    assert pages == [([1, 2, 3], 0), ([4, 5, 6], 3), ([7], 6)]
    assert cursor.load() == 7


def test_sink_error_stops_with_the_cursor_before_the_refused_event(db_path):
    make_db(db_path, runs=2, events_per_run=5)
    cursor = MemoryCursor()
    calls = []

    def sink(event):
        calls.append(event.seq)
        if len(calls) == 4:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        Follower(open_existing(db_path), cursor=cursor, once=True, page_size=10).follow(sink)
    assert cursor.load() == calls[2]


class SavingFails(MemoryCursor):
    def save(self, seq: int) -> None:
        raise OSError(28, "No space left on device")


def test_a_sink_error_stays_the_error_raised_when_the_cursor_cannot_be_saved_either(db_path):
    make_db(db_path, runs=1, events_per_run=5)

    def sink(event):
        if event.seq == 3:
            raise KeyError("refused")

    with pytest.raises(KeyError) as info:
        Follower(open_existing(db_path), cursor=SavingFails(), once=True).follow(sink)
    assert info.value.__notes__ == [
        "and the cursor could not be saved at seq 2: [Errno 28] No space left on device"]


def test_a_page_sink_that_delivered_part_of_a_page_moves_the_cursor_past_that_part(db_path):
    make_db(db_path, runs=1, events_per_run=8)
    cursor = MemoryCursor()
    pages: list[list[int]] = []

    class HalfThenFull:
        def handle_page(self, events):
            pages.append([e.seq for e in events])
            if len(pages) == 1:
                raise PartialPage(3, OSError(27, "File too large"))

    sink = HalfThenFull()
    with pytest.raises(OSError, match="File too large"):
        Follower(open_existing(db_path), cursor=cursor, once=True).follow(sink)
    assert cursor.load() == 3
    Follower(open_existing(db_path), cursor=cursor, once=True).follow(sink)
    assert pages == [[1, 2, 3, 4, 5, 6, 7, 8], [4, 5, 6, 7, 8]]


def test_follower_redelivers_at_most_one_page_after_a_hard_kill(db_path):
    make_db(db_path, runs=1, events_per_run=12)
    reader = open_existing(db_path)
    cursor = MemoryCursor()
    seen: list[int] = []

    def dying_sink(event):
        if len(seen) == 6:
            raise HardKill
        seen.append(event.seq)

    with pytest.raises(HardKill):
        Follower(reader, cursor=cursor, once=True, page_size=4).follow(dying_sink)
    assert cursor.load() == seen[3]  # saved after the first page only
    again = collect(Follower(reader, cursor=cursor, once=True, page_size=4))
    assert [e.seq for e in again[:2]] == seen[4:6]  # the page in flight comes again
    assert seen[:4] + [e.seq for e in again] == list(range(1, 13))


def test_follower_rejects_bad_settings(db_path):
    store = make_db(db_path)
    with pytest.raises(FollowError):
        Follower(None)  # type: ignore[arg-type]
    with pytest.raises(FollowError, match="interval"):
        Follower(store, interval=-1)
    with pytest.raises(FollowError, match="page size"):
        Follower(store, page_size=-1)
    with pytest.raises(FollowError, match="sink"):
        Follower(store, once=True).follow(None)  # type: ignore[arg-type]


def test_follower_refuses_a_nan_interval(db_path):
    store = make_db(db_path)
    with pytest.raises(FollowError, match="^export: interval nan is not a number of seconds$"):
        Follower(store, interval=float("nan"))
    assert Follower(store, interval=float("inf")).interval == 60.0
    assert Follower(store, interval=0).interval is None  # 0 is the default, as in the reference


def test_follower_checks_a_file_cursor_before_delivering_anything(db_path, tmp_path):
    make_db(db_path, runs=1, events_per_run=3)
    reader = open_existing(db_path)
    for path in (tmp_path / "gone" / "cursor", db_path, os.devnull):
        got: list[Event] = []
        with pytest.raises(CursorError):
            Follower(reader, cursor=FileCursor(path), once=True).follow(got.append)
        assert got == []


def test_a_file_cursor_ahead_of_the_database_names_the_file(db_path, tmp_path):
    make_db(db_path, runs=1, events_per_run=3)
    path = tmp_path / "cursor"
    path.write_text("99\n")
    follower = Follower(open_existing(db_path), cursor=FileCursor(path), once=True)
    with pytest.raises(FollowError) as caught:
        follower.follow(lambda e: None)
    assert str(caught.value) == (
        f"export: cursor file {path} is at seq 99 but {db_path} ends at seq 3: the database "
        f"was replaced or restored from a backup; delete {path} to start over, or write into "
        "it a seq the database has")


def test_cursor_ahead_of_the_database_is_refused(db_path):
    make_db(db_path, runs=1, events_per_run=3)
    follower = Follower(open_existing(db_path), cursor=MemoryCursor(99), once=True)
    with pytest.raises(FollowError, match=r"seq 99 .* ends at seq 3.*replaced or restored"):
        follower.follow(lambda e: None)


def test_follower_leaves_the_database_file_untouched(db_path, tmp_path):
    store = make_db(db_path, runs=3, events_per_run=5)
    store.close()  # checkpoints and removes the WAL
    before = fingerprint(db_path)
    reader = open_existing(db_path)
    got = collect(Follower(reader, cursor=FileCursor(str(tmp_path / "c")), once=True,
                           page_size=2))
    reader.close()
    assert len(got) == 15
    assert fingerprint(db_path) == before
    wal = db_path + "-wal"
    assert not os.path.exists(wal) or os.path.getsize(wal) == 0


def test_follower_pages_a_large_table_and_caps_huge_payloads(db_path):
    store = open_store(db_path)
    big = b'{"args":"' + b"x" * (MAX_PAGE_TEXT + 10) + b'"}'
    add_run(store, "big", 40, payload=lambda i: big if i % 5 == 0 else b'{"i":%d}' % i)
    got = collect(Follower(open_existing(db_path), once=True, page_size=7))
    assert [e.seq for e in got] == [e.seq for e in store.list_events("big")]
    capped = [json.loads(e.payload) for e in got if e.payload.startswith(b'{"truncated"')]
    assert len(capped) == 8
    assert all(c["truncated"] is True and c["length"] == len(big) and c["head"]
               for c in capped)
    assert all(len(e.payload) <= MAX_PAGE_TEXT + 100 for e in got)


def test_follower_holds_no_read_transaction_while_the_sink_runs(db_path):
    writer = make_db(db_path, runs=2, events_per_run=5)
    checkpoints = []

    def sink(event):
        # A writer can checkpoint all the way (nothing pins the WAL) mid-follow.
        if event.run_id.startswith("during-"):
            return
        add_run(writer, f"during-{event.seq}", 1)
        busy, _, _ = writer.db().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        checkpoints.append(busy)

    Follower(open_existing(db_path), once=True, page_size=3).follow(sink)
    assert checkpoints and set(checkpoints) == {0}


def follow_a_later_commit(follower, writer, ready=lambda: True) -> list[Event]:
    """Follow live: wait for the two events already there (and ``ready()``),
    commit a run of three more, stop once they arrived."""
    got: list[Event] = []
    stop = threading.Event()
    thread = threading.Thread(target=follower.follow, args=(got.append, stop))
    thread.start()
    deadline = time.monotonic() + 10
    while (len(got) < 2 or not ready()) and time.monotonic() < deadline:
        time.sleep(0.005)
    add_run(writer, "later", 3)
    while len(got) < 5 and time.monotonic() < deadline:
        time.sleep(0.005)
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    assert [e.run_id for e in got[2:]] == ["later"] * 3
    return got


def spy_on_waits(monkeypatch, waiter: type) -> list[float]:
    """The timeout of every wait ``waiter`` is asked for from now on."""
    timeouts: list[float] = []
    real_wait = waiter.wait

    def spy(self, timeout, stop):
        timeouts.append(timeout)
        return real_wait(self, timeout, stop)

    monkeypatch.setattr(waiter, "wait", spy)
    return timeouts


def test_live_follow_delivers_a_later_commit_and_stops_cleanly(db_path):
    writer = make_db(db_path, runs=1, events_per_run=2)
    cursor = MemoryCursor()
    got = follow_a_later_commit(Follower(open_existing(db_path), cursor=cursor), writer)
    assert cursor.load() == got[-1].seq


def test_without_inotify_live_follow_polls_every_5_ms_and_delivers(db_path, monkeypatch):
    import agentrt_export.wake as wake
    from agentrt_export.follower import POLL_INTERVAL

    monkeypatch.setattr(wake, "_libc", lambda: None)  # as where inotify is missing
    writer = make_db(db_path, runs=1, events_per_run=2)
    assert wake.open_waiter(db_path).notifies is False
    timeouts = spy_on_waits(monkeypatch, wake.ChangeWaiter)
    follow_a_later_commit(Follower(open_existing(db_path)), writer, ready=lambda: timeouts)
    assert timeouts and set(timeouts) == {POLL_INTERVAL} and POLL_INTERVAL == 0.005


@pytest.mark.parametrize("inotify", [True, False])
def test_interval_bounds_every_wait_with_or_without_inotify(db_path, monkeypatch, inotify):
    import agentrt_export.wake as wake

    if not inotify:
        monkeypatch.setattr(wake, "_libc", lambda: None)
    make_db(db_path, runs=1, events_per_run=2)
    waiter = type(wake.open_waiter(db_path))
    assert waiter.notifies is inotify or not sys.platform.startswith("linux")
    timeouts = spy_on_waits(monkeypatch, waiter)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    got = collect(Follower(open_existing(db_path), interval=0.02), stop=stop)
    assert len(got) == 2
    assert timeouts and set(timeouts) == {0.02}


def test_defaults_are_pages_of_500_a_1_s_notified_wait_and_both_are_capped(db_path, monkeypatch):
    import agentrt_export.wake as wake

    make_db(db_path, runs=1, events_per_run=2)
    store = open_existing(db_path)
    assert Follower(store).page_size == 500 and Follower(store).interval is None
    assert Follower(store, page_size=20_000).page_size == 10_000
    assert Follower(store, interval=3600).interval == 60.0
    if not sys.platform.startswith("linux"):
        return
    waiter = type(wake.open_waiter(db_path))
    assert waiter.notifies
    timeouts = spy_on_waits(monkeypatch, waiter)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    collect(Follower(store), stop=stop)
    assert timeouts and set(timeouts) == {1.0}  # inotify ends it early; 1 s at most


def test_a_stop_during_a_page_finishes_that_page_and_saves_its_end(db_path):
    make_db(db_path, runs=5, events_per_run=5)
    stop = threading.Event()
    got: list[Event] = []

    def sink(event: Event) -> None:
        got.append(event)
        stop.set()  # at the first event of the first page

    cursor = MemoryCursor()
    Follower(open_existing(db_path), cursor=cursor, page_size=10).follow(sink, stop=stop)
    assert [e.seq for e in got] == list(range(1, 11))
    assert cursor.load() == 10


def test_live_follow_sees_commits_on_the_same_connection(tmp_path):
    # An in-memory store shared with its writer: no other connection commits.
    store = open_store(":memory:")
    got: list[Event] = []
    stop = threading.Event()
    thread = threading.Thread(target=Follower(store, interval=0.01).follow,
                              args=(got.append, stop))
    thread.start()
    time.sleep(0.3)  # the follower is caught up and waiting
    add_run(store, "mem", 2)
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    stop.set()
    thread.join(5)
    assert [e.run_id for e in got] == ["mem", "mem"]


def test_head_is_the_chain_as_far_as_delivered(db_path, tmp_path):
    writer = make_db(db_path, runs=2, events_per_run=3)
    reader = open_existing(db_path)
    cursor = FileCursor(str(tmp_path / "c"))
    follower = Follower(reader, cursor=cursor, once=True)
    assert follower.head() == (0, "")
    collect(follower)
    seq, digest = follower.head()
    assert (seq, digest) == writer.chain_head()
    assert len(digest) == 64
    report = reader.verify_events(0, seq)
    assert report.broken is None and report.hash == digest
    add_run(writer, "unfollowed", 2)
    assert follower.head() == (seq, digest)
    assert Follower(reader, once=True).head() == (0, "")


def test_jsonl_sink_output_equals_the_live_trace_observer(db_path):
    from agentrt import trace

    live = io.BytesIO()
    store = open_store(db_path)
    observer = trace.jsonl(live)
    with store.tx(observer) as tx:
        tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) "
                   "VALUES ('r', 'g', 'RUNNING', '{}', 'x')")
        tx.append("r", "", datetime.now(UTC), "run.created", b'{"a":"<b>&"}')
        tx.append("r", "s", datetime.now(UTC), "step.started", {"index": 0})
    exported = io.BytesIO()
    Follower(open_existing(db_path), once=True).follow(JSONLSink(exported))
    assert exported.getvalue() == live.getvalue()
    assert b'"<b>&"' in exported.getvalue()


def test_a_payload_over_the_cap_is_whole_in_the_live_trace_and_truncated_in_the_export(db_path):
    from agentrt import trace

    live = io.BytesIO()
    store = open_store(db_path)
    with store.tx(trace.jsonl(live)) as tx:
        tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) "
                   "VALUES ('r', 'g', 'RUNNING', '{}', 'x')")
        tx.append("r", "", datetime.now(UTC), "run.created", {"text": "x" * 70000})
    exported = io.BytesIO()
    Follower(open_existing(db_path), once=True).follow(JSONLSink(exported))
    whole, capped = json.loads(live.getvalue()), json.loads(exported.getvalue())
    assert whole["payload"] == {"text": "x" * 70000}
    assert capped["payload"]["truncated"] is True
    assert capped["payload"]["length"] == len(json.dumps(whole["payload"], separators=(",", ":")))
    assert {k: v for k, v in capped.items() if k != "payload"} == {
        k: v for k, v in whole.items() if k != "payload"}


def test_a_failing_jsonl_stream_stops_the_follower(db_path):
    make_db(db_path)

    class Broken(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            raise OSError("disk full")

    cursor = MemoryCursor()
    with pytest.raises(OSError):
        Follower(open_existing(db_path), cursor=cursor, once=True).follow(JSONLSink(Broken()))
    assert cursor.load() == 0


def test_follower_reads_with_a_read_only_connection(db_path):
    make_db(db_path)
    reader = open_existing(db_path)
    with pytest.raises(apsw.ReadOnlyError):
        reader.db().execute("DELETE FROM events")


def bound_cursor(db_path, path) -> FileCursor:
    """A cursor file saved by a follower that delivered every event of ``db_path``."""
    cursor = FileCursor(path)
    collect(Follower(open_existing(db_path), cursor=cursor, once=True, page_size=4))
    return cursor


def test_a_file_cursor_keeps_the_chain_hash_of_its_seq_and_a_bare_save_drops_it(db_path,
                                                                                 tmp_path):
    make_db(db_path, runs=2, events_per_run=5).close()
    cursor = bound_cursor(db_path, tmp_path / "cursor")
    assert (tmp_path / "cursor").read_bytes() == b"10\n"  # the reference's format, unchanged
    assert cursor.binding(10) == open_existing(db_path).event_hash(10)
    assert cursor.binding(9) is None  # bound to the seq it was saved with
    cursor.save(10)
    assert cursor.binding(10) is None


def test_a_file_cursor_saved_on_another_database_is_refused_before_anything_is_delivered(
        db_path, tmp_path):
    make_db(db_path, runs=2, events_per_run=5).close()
    cursor = bound_cursor(db_path, tmp_path / "cursor")
    other = str(tmp_path / "other.db")
    store = open_store(other)
    add_run(store, "elsewhere", 20)
    store.close()
    got: list = []
    with pytest.raises(FollowError) as caught:
        Follower(open_existing(other), cursor=cursor, once=True).follow(got.append)
    assert got == []
    assert (tmp_path / "cursor").read_bytes() == b"10\n"
    assert str(caught.value) == (
        f"export: cursor file {cursor.path} was saved after seq 10 of another database: "
        f"{other} has another history up to that event (its chain hash differs), so the "
        "events after it are not the ones the cursor stands before; give this database a "
        f"cursor file of its own, or delete {cursor.path} to export it from the start")


def test_a_file_cursor_goes_on_over_a_restored_copy_of_its_database(db_path, tmp_path):
    make_db(db_path, runs=2, events_per_run=5).close()
    cursor = bound_cursor(db_path, tmp_path / "cursor")
    restored = str(tmp_path / "restored.db")
    with open(db_path, "rb") as src, open(restored, "wb") as dst:
        dst.write(src.read())
    os.chmod(restored, 0o600)
    store = open_store(restored)
    add_run(store, "after", 3)
    store.close()
    got = collect(Follower(open_existing(restored), cursor=cursor, once=True))
    assert [e.seq for e in got] == [11, 12, 13]


def test_a_cursor_file_without_a_binding_is_taken_as_the_reference_takes_it(db_path, tmp_path):
    store = open_store(db_path)
    add_run(store, "elsewhere", 12)
    store.close()
    (tmp_path / "cursor").write_text("10\n")  # written by hand, or by the reference
    got = collect(Follower(open_existing(db_path), cursor=FileCursor(tmp_path / "cursor"),
                           once=True))
    assert [e.seq for e in got] == [11, 12]


class AsyncPageSink:
    async def handle_page(self, events):
        pass


class AsyncCallable:
    async def __call__(self, event):
        pass


async def async_sink(event):
    pass


@pytest.mark.parametrize("sink", [async_sink, AsyncCallable(), AsyncPageSink()],
                         ids=["function", "callable", "page-sink"])
def test_an_async_sink_is_refused_before_the_cursor_could_pass_events_it_never_handled(
        db_path, tmp_path, sink):
    make_db(db_path, runs=1, events_per_run=3).close()
    cursor = FileCursor(tmp_path / "cursor")
    with pytest.raises(FollowError, match=r"an async function: the follower calls its sink "
                                          r"synchronously"):
        Follower(open_existing(db_path), cursor=cursor, once=True).follow(sink)
    assert not (tmp_path / "cursor").exists()


def test_a_seq_written_into_a_bound_cursor_file_by_hand_is_taken(db_path, tmp_path):
    # Writing in place keeps the file (and its extended attribute): the binding
    # names the seq it was saved with, so the hand-written one is unbound.
    make_db(db_path, runs=2, events_per_run=5).close()
    cursor = bound_cursor(db_path, tmp_path / "cursor")
    with open(cursor.path, "r+") as f:
        f.write(" 4\n")
    got = collect(Follower(open_existing(db_path), cursor=cursor, once=True))
    assert [e.seq for e in got] == [5, 6, 7, 8, 9, 10]


def test_a_file_cursor_subclass_with_its_own_save_keeps_the_cursor_protocol(db_path, tmp_path):
    saved: list[int] = []

    class Noting(FileCursor):
        def save(self, seq):  # the Cursor protocol's save(seq), as before bindings
            saved.append(seq)
            super().save(seq)

    make_db(db_path, runs=1, events_per_run=3).close()
    cursor = Noting(tmp_path / "cursor")
    got = collect(Follower(open_existing(db_path), cursor=cursor, once=True))
    assert [e.seq for e in got] == [1, 2, 3] and saved == [3]
    assert cursor.binding(3) is None  # unbound, and taken as such on the next start

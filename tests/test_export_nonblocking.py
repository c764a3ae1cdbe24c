"""`agentrt-export jsonl` on a standard output that a parent made non-blocking.

A parent (Node.js, a shell tool) that set O_NONBLOCK on a pipe it shares with
the exporter makes every write past a full pipe fail with EAGAIN; the export
used to stop there with exit 1. It now waits for room, as on a blocking pipe,
so a slow reader gets every record once, whole and in order. A stop
(SIGTERM, SIGINT) finishes the page in hand while the reader reads; once the
reader pauses past it, the page is given up after the record in hand (torn
only if the reader takes nothing for seconds), and the cursor is saved after
the records written. A reader that has gone (EPIPE) still ends the export
quietly, with the cursor before the page.

Each test runs the exporter as a real process whose stdout is the write end of
a pipe set non-blocking and shrunk to one page, and reads the other end here.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from eventdb import REPO_ROOT, child_env, make_db
from test_trace_pipes import slow_reader, wait_until_full

from agentrt.store import open_existing
from agentrt.trace import OutputStopped, jsonl_record
from agentrt_export import FollowError, JSONLSink

#: The pipe's buffer: one page, so a page of records (some 65 KB) fills it many times.
PIPE_SIZE = 4096
#: Events in each database: four pages of 500.
EVENTS = 2000
#: A stop ends a wait on a full pipe within a tenth of a second unloaded.
EXIT_WITHIN = 15
#: For a reader that never takes more: the grace a stop gives the record in
#: hand (5 s, pinned in test_stop_grace) cut to a second, which such a reader
#: runs out all the same.
SHORT_GRACE = {"AGENTRT_STOP_GRACE_S": "1"}


def nonblocking_pipe(blocking: bool = False) -> tuple[int, int]:
    """A pipe of PIPE_SIZE bytes whose write end is non-blocking, as a parent left it
    (or, ``blocking``, as pipes usually are)."""
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    os.set_blocking(w, blocking)
    return r, w


def start(args: list[str], env: dict[str, str] | None = None,
          blocking: bool = False) -> tuple[subprocess.Popen[bytes], int]:
    """A child whose stdout is a fresh non-blocking (or ``blocking``) pipe; the
    read end, which the caller closes."""
    r, w = nonblocking_pipe(blocking)
    try:
        proc = subprocess.Popen([sys.executable, *args], stdout=w, stderr=subprocess.PIPE,
                                env={**child_env(), **(env or {})}, cwd=REPO_ROOT)
    finally:
        os.close(w)
    return proc, r


def jsonl_exporter(db: str, *args: str,
                   env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """``agentrt-export jsonl`` on a non-blocking stdout, and the pipe's read end."""
    return start(["-m", "agentrt_export.cli", "jsonl", "--db", db, *args], env)


def read_slowly(r: int, size: int | None = None) -> bytes:
    """What the pipe gives, a small chunk at a time: ``size`` bytes, or all of it
    until its writer is gone."""
    got = b""
    while size is None or len(got) < size:
        chunk = os.read(r, 1024 if size is None else min(1024, size - len(got)))
        if not chunk:
            break
        got += chunk
        time.sleep(0.0002)
    return got


def records(db: str) -> bytes:
    """Every event's record, in seq order: what one uninterrupted export writes."""
    with open_existing(db, read_only=True) as store:
        return b"".join(jsonl_record(e) for e in store.list_events_after("", 0, EVENTS))


def exited(proc: subprocess.Popen[bytes], what: str) -> tuple[int, bytes]:
    """The exit code and stderr; fails, killing it, if it did not end in time."""
    try:
        _, err = proc.communicate(timeout=EXIT_WITHIN)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"still running {EXIT_WITHIN}s after {what}") from None
    return proc.returncode, err


@pytest.fixture
def db(tmp_path) -> str:
    path = str(tmp_path / "runs.db")
    make_db(path, runs=EVENTS // 100, events_per_run=100).close()
    return path


@pytest.mark.parametrize("stdout", ["buffered", "PYTHONUNBUFFERED"])
@pytest.mark.parametrize("follow", [False, True], ids=["once", "follow"])
def test_a_slow_reader_of_a_nonblocking_stdout_gets_every_record_once_whole_and_in_order(
        db, tmp_path, follow, stdout):
    # PYTHONUNBUFFERED makes sys.stdout.buffer a raw FileIO, whose write says
    # None when the pipe is full; else it is a BufferedWriter, which raises.
    # Before the change the export stopped at the first full pipe, exit 1.
    cursor = tmp_path / "cursor"
    expected = records(db)
    proc, r = jsonl_exporter(db, "--cursor-file", str(cursor), *(["--follow"] * follow),
                             env={"PYTHONUNBUFFERED": "1" if stdout == "PYTHONUNBUFFERED" else ""})
    try:
        wait_until_full(r, PIPE_SIZE // 2)  # the exporter has met a full pipe
        got = read_slowly(r, len(expected))
        if follow:  # caught up and waiting for commits: a stop ends it
            proc.send_signal(signal.SIGTERM)
        got += read_slowly(r)
        code, err = exited(proc, "the end of the export")
    finally:
        os.close(r)
    assert (code, err) == (0, b"")
    assert len(expected) > 20 * PIPE_SIZE  # the pipe filled many times over
    assert got == expected  # every record once, whole and in order
    assert int(cursor.read_text()) == EVENTS


PYTHON_FOLLOWER = """
import sys, threading
from agentrt.store import open_existing
from agentrt.trace import OutputStopped
from agentrt_export import FileCursor, Follower, JSONLSink, stop_on_signals

store = open_existing(sys.argv[1], read_only=True)
stop = threading.Event()
stop_on_signals(stop)
try:
    Follower(store, cursor=FileCursor(sys.argv[2])).follow(
        JSONLSink(sys.stdout.buffer, stop=stop), stop)
except OutputStopped as exc:
    sys.stderr.write(f"{exc}\\n")
"""


def stopped_while_waiting(db: str, tmp_path, program: str, sig: signal.Signals,
                          reader: str, blocking: bool = False) -> tuple[bytes, bytes, int]:
    """Signal the exporter while it waits on a full pipe whose reader took 10 KB
    and stalled; the ``reader`` then "reads on" (slowly, to the end), "pauses"
    (a third of a second) and then reads on, or reads only once the exporter
    has exited ("never"). What it read, the whole records among it, and the
    cursor saved; the exit is checked here (0, no traceback)."""
    cursor = tmp_path / "cursor"
    env = SHORT_GRACE if reader == "never" else None
    if program == "Follower and JSONLSink":
        proc, r = start(["-c", PYTHON_FOLLOWER, db, str(cursor)], env, blocking=blocking)
    else:
        proc, r = start(["-m", "agentrt_export.cli", "jsonl", "--db", db, "--cursor-file",
                         str(cursor), "--follow"], env, blocking=blocking)
    try:
        wait_until_full(r, PIPE_SIZE // 2)
        got = read_slowly(r, 10_000)
        wait_until_full(r, 1)  # waiting again, on a reader that has stalled
        proc.send_signal(sig)
        if reader == "pauses":
            time.sleep(0.3)
        if reader != "never":
            got += read_slowly(r)
        code, err = exited(proc, f"signal {sig.name} while it waited on a full pipe")
        got += read_slowly(r)  # what sat in the pipe
    finally:
        os.close(r)
    assert code == 0, err
    assert b"Traceback" not in err
    whole = got[:got.rfind(b"\n") + 1]
    return got, whole, int(cursor.read_text())


def restarted(db: str, tmp_path) -> bytes:
    """What a restart on the cursor file writes."""
    restart = subprocess.run([sys.executable, "-m", "agentrt_export.cli", "jsonl", "--db", db,
                              "--cursor-file", str(tmp_path / "cursor")],
                             capture_output=True, env=child_env(), cwd=REPO_ROOT, timeout=60)
    assert restart.returncode == 0, restart.stderr
    return restart.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("program", ["agentrt-export jsonl --follow", "Follower and JSONLSink"])
def test_a_signal_while_a_slow_reader_reads_on_finishes_the_page_in_hand(
        db, tmp_path, program, sig):
    # The stop comes while the exporter waits in its first page (500 records,
    # some 65 KB) and the reader goes on reading: the page in hand is
    # finished, as a stop always finishes it, and the export ends there.
    expected = records(db)
    got, whole, cursor = stopped_while_waiting(db, tmp_path, program, sig, "reads on")
    assert got == whole == expected[:len(got)]
    assert got.count(b"\n") == cursor == 500
    assert got + restarted(db, tmp_path) == expected


@pytest.mark.parametrize("program", ["agentrt-export jsonl --follow", "Follower and JSONLSink"])
def test_a_signal_while_the_reader_pauses_ends_the_page_after_the_record_in_hand(
        db, tmp_path, program):
    # The reader pauses past the stop: the exporter gives up the page, but
    # first finishes the record it was part way through once the reader takes
    # it, so no line is torn. The cursor is exactly the last record written:
    # never past what reached the reader (no loss), never before it (a
    # restart writes nothing twice).
    expected = records(db)
    got, whole, cursor = stopped_while_waiting(db, tmp_path, program, signal.SIGTERM, "pauses")
    assert got == whole == expected[:len(got)]  # whole records, in order, nothing twice
    assert 10_000 // 200 < got.count(b"\n") < 500  # the stop cut the first page short
    assert cursor == got.count(b"\n")
    assert got + restarted(db, tmp_path) == expected


def test_a_signal_ends_a_wait_on_a_reader_that_never_reads_again_within_seconds(db, tmp_path):
    # A reader that takes nothing more cannot be waited for: the record in
    # hand gets a few seconds, then the exporter ends anyway (exit 0), its last
    # line torn. The cursor is the last whole record's seq, and a restart
    # begins with the record cut short, whole.
    expected = records(db)
    began = time.monotonic()
    got, whole, cursor = stopped_while_waiting(
        db, tmp_path, "agentrt-export jsonl --follow", signal.SIGTERM, "never")
    assert time.monotonic() - began < EXIT_WITHIN
    assert got == expected[:len(got)]
    assert 10_000 // 200 < whole.count(b"\n") < 500
    assert cursor == whole.count(b"\n")
    assert whole + restarted(db, tmp_path) == expected


@pytest.mark.parametrize("follow", [False, True], ids=["once", "follow"])
def test_a_reader_that_closes_while_the_exporter_waits_on_a_full_nonblocking_stdout_ends_it_quietly(  # noqa: E501
        db, tmp_path, follow):
    # `| head -n 3` on a non-blocking pipe: the reader takes three lines and
    # closes while the exporter waits in its first page. EPIPE ends the export
    # with exit 0 and nothing on stderr; a pipe's reader that has gone never
    # reads what the pipe held, so the cursor is not saved past the page's
    # start. With --follow the command also watches for the reader leaving,
    # which sets its stop: the export still ends as on a closed pipe, not as
    # on a stop (which would save the cursor past the records in the pipe).
    cursor = tmp_path / "cursor"
    proc, r = jsonl_exporter(db, "--cursor-file", str(cursor), *(["--follow"] * follow))
    try:
        wait_until_full(r, PIPE_SIZE // 2)
        lines = read_slowly(r, 1024).split(b"\n")[:3]
    finally:
        os.close(r)
    code, err = exited(proc, "its reader closed")
    assert [line[:9] for line in lines] == [b'{"seq":1,', b'{"seq":2,', b'{"seq":3,']
    assert (code, err) == (0, b"")
    assert not cursor.exists()


def test_jsonl_sink_called_per_event_waits_out_a_full_nonblocking_pipe_before_its_flush():
    # The sink's per-event calls buffer records until flush(); on a
    # non-blocking pipe the buffer's write raised EAGAIN part way.
    from test_trace_pipes import events

    r, w = nonblocking_pipe()
    sent = events()
    received: list[bytes] = []
    reader = slow_reader(lambda n: os.read(r, n), received, lambda: wait_until_full(r, 2048))
    try:
        with open(w, "wb", closefd=False) as stream:
            sink = JSONLSink(stream)
            for e in sent:
                sink(e)
            sink.flush()
            assert sink.err() is None
    finally:
        os.close(w)
        reader.join(10)
        os.close(r)
    assert b"".join(received) == b"".join(jsonl_record(e) for e in sent)


def test_a_stop_set_while_jsonl_sink_waits_ends_the_page_after_the_record_in_hand():
    # In-process view of the stop the signal tests send: set while the pipe is
    # full and its reader paused, it gives the page up as a PartialPage of
    # the records that reached the pipe, the one part written finished first
    # once the reader takes more.
    from test_trace_pipes import events

    from agentrt_export import PartialPage

    r, w = nonblocking_pipe()
    stop = threading.Event()
    sent = events(30)  # some 45 KB: eleven pipes full
    raised: list[BaseException] = []

    def page() -> None:
        try:
            sink.handle_page(sent)
        except BaseException as exc:  # noqa: BLE001 - looked at below
            raised.append(exc)

    try:
        with open(w, "wb", closefd=False) as stream:
            sink = JSONLSink(stream, stop=stop)
            writer = threading.Thread(target=page, daemon=True)
            writer.start()
            wait_until_full(r, PIPE_SIZE // 2)
            stop.set()
            time.sleep(0.3)  # the wait sees the stop with the pipe still full
            held = read_slowly(r, PIPE_SIZE)
            writer.join(5)
            assert not writer.is_alive(), "the stop did not end the wait on the full pipe"
            os.set_blocking(r, False)
            held += os.read(r, PIPE_SIZE * 4)
    finally:
        os.close(w)
        os.close(r)
    [cut] = raised
    assert isinstance(cut, PartialPage) and isinstance(cut.error, OutputStopped)
    assert str(cut.error) == ("agentrt: the output was full (its reader took no more) "
                              "when the stop came")
    assert 0 < cut.accepted < len(sent)
    assert held == b"".join(jsonl_record(e) for e in sent[:cut.accepted])  # no torn line
    with pytest.raises(OutputStopped):  # the first failure is kept
        sink.handle_page(sent[cut.accepted:])


def test_jsonl_sink_refuses_a_stop_that_is_not_an_event_in_one_sentence():
    with pytest.raises(FollowError) as refused:
        JSONLSink(sys.stdout.buffer, stop=True)  # type: ignore[arg-type]
    assert str(refused.value) == ("export: JSONLSink: stop is a bool (True), not a "
                                  "threading.Event or None: pass the event given to "
                                  "Follower.follow")


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "PYTHONUNBUFFERED"])
def test_the_otel_console_exporter_waits_out_a_full_nonblocking_stdout(tmp_path, unbuffered):
    # `OTEL_TRACES_EXPORTER=console agentrt-export otel` on a non-blocking
    # stdout: the SDK's text stream dropped what a full pipe did not take and
    # the cursor moved past spans never written (PYTHONUNBUFFERED), or the
    # export failed at the first full pipe. Every span now arrives, as on a
    # blocking pipe.
    from test_otel_cli import many_runs_db

    db = str(tmp_path / "runs.db")
    events = many_runs_db(db)
    env = {"OTEL_TRACES_EXPORTER": "console", "PYTHONUNBUFFERED": "1" if unbuffered else ""}
    command = ["-m", "agentrt_export.cli", "otel", "--db", db]
    blocking = subprocess.run([sys.executable, *command], capture_output=True, timeout=60,
                              env={**child_env(), **env}, cwd=REPO_ROOT)
    assert blocking.returncode == 0, blocking.stderr
    proc, r = start([*command, "--cursor-file", str(tmp_path / "cursor")], env)
    try:
        wait_until_full(r, PIPE_SIZE // 2)
        got = read_slowly(r)
        code, err = exited(proc, "the end of the export")
    finally:
        os.close(r)
    assert (code, err) == (0, b"")
    assert len(got) > 20 * PIPE_SIZE
    assert got == blocking.stdout
    assert int((tmp_path / "cursor").read_text()) == events[-1].seq


def test_a_stop_while_the_console_exporters_reader_stalls_names_standard_output(tmp_path):
    # No collector is involved with OTEL_TRACES_EXPORTER=console: the stop
    # that gives up a page standard output would not take says so.
    from test_otel_cli import many_runs_db

    db = str(tmp_path / "runs.db")
    many_runs_db(db)
    proc, r = start(["-m", "agentrt_export.cli", "otel", "--db", db, "--follow",
                     "--cursor-file", str(tmp_path / "cursor")],
                    {"OTEL_TRACES_EXPORTER": "console", **SHORT_GRACE})
    try:
        wait_until_full(r, PIPE_SIZE // 2)
        read_slowly(r, 10_000)
        wait_until_full(r, 1)  # its reader has stalled (a pipe of one page may hold less)
        proc.send_signal(signal.SIGTERM)
        code, err = exited(proc, "SIGTERM while standard output was full")
    finally:
        os.close(r)
    assert code == 0, err
    assert err.startswith(b"stopped: otel: stopped before the page was written to standard "
                          b"output: ") and b"collector" not in err
    assert not (tmp_path / "cursor").exists()  # the page is sent again on restart


@pytest.mark.parametrize("reader", ["reads on", "pauses", "never"])
def test_a_signal_ends_a_wait_on_a_blocking_stdout_pipe_as_on_a_nonblocking_one(
        db, tmp_path, reader):
    # On an ordinary (blocking) pipe a write blocked on a reader that takes
    # nothing held the signal off for as long as the reader did. It is now
    # waited on as a non-blocking one is: the page in hand is finished while
    # the reader reads, else given up after the record in hand (torn only
    # after seconds of a reader taking nothing), the cursor after the records
    # written, exit 0.
    expected = records(db)
    got, whole, cursor = stopped_while_waiting(
        db, tmp_path, "agentrt-export jsonl --follow", signal.SIGTERM, reader, blocking=True)
    assert got == expected[:len(got)]
    if reader == "reads on":
        assert got == whole and got.count(b"\n") == cursor == 500
    elif reader == "pauses":
        assert got == whole and 10_000 // 200 < got.count(b"\n") < 500
    assert cursor == whole.count(b"\n")
    assert whole + restarted(db, tmp_path) == expected

"""How the export behaves where it is deployed: a file written by a sidecar
that may lose power, a systemd unit whose stderr shares the output, a
supervisor that closes stderr, a terminal that hangs up, an asyncio program
around the follower, a sink around an async client, a damaged hash cell, a
history restored while a page fails, a cursor name the save cannot use."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time

import apsw
import pytest
from eventdb import REPO_ROOT, child_env, make_db

from agentrt.events import Event
from agentrt.store import open_existing
from agentrt.trace import jsonl_record
from agentrt_export import FileCursor, Follower, FollowError, JSONLSink, MemoryCursor

EXPORT = [sys.executable, "-m", "agentrt_export.cli"]


def _db(tmp_path, events: int = 3) -> str:
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=events).close()
    return db


def _export(*args: str, **kw) -> subprocess.CompletedProcess[bytes]:
    kw.setdefault("capture_output", True)
    return subprocess.run([*EXPORT, "jsonl", *args], env=child_env(), cwd=REPO_ROOT,
                          timeout=60, **kw)


def test_a_page_written_to_a_file_is_synced_before_the_cursor_moves(tmp_path, monkeypatch):
    """The cursor is fsynced after each page: after a power cut the output file
    must hold at least what the cursor says was delivered."""
    db = _db(tmp_path)
    synced: list[int] = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda fd, real=real: (
            synced.append(os.fstat(fd).st_ino), real(fd))[1])
    out_path = tmp_path / "events.jsonl"
    with open(out_path, "ab") as out:
        Follower(open_existing(db), cursor=FileCursor(str(tmp_path / "c")),
                 once=True).follow(JSONLSink(out))
        out_ino = os.fstat(out.fileno()).st_ino
    assert len(out_path.read_bytes().splitlines()) == 3
    assert out_ino in synced


def test_a_mended_record_stays_whole_when_stderr_shares_the_output_file(tmp_path):
    """systemd's StandardError=inherit (or ``>> f 2>&1``): the note about a record
    an earlier write cut short comes after the write that completes it."""
    db = _db(tmp_path, events=4)
    whole = _export("--db", db, check=True).stdout
    events = tmp_path / "events.jsonl"
    first = whole.index(b"\n") + 1
    events.write_bytes(whole[:first + 30])  # record 2 cut short by an earlier write
    with open(events, "ab") as out:
        _export("--db", db, "--after-seq", "1", stdout=out, stderr=out, capture_output=False,
                check=True)
    seqs = []
    for line in events.read_bytes().splitlines():
        try:
            seqs.append(json.loads(line)["seq"])
        except ValueError:
            assert line.startswith(b"agentrt-export: "), line  # the note, on a line of its own
    assert seqs == [1, 2, 3, 4]


def test_jsonl_exports_when_stderr_is_closed(tmp_path):
    db = _db(tmp_path)
    done = _export("--db", db, stdout=subprocess.PIPE, capture_output=False,
                   preexec_fn=lambda: os.close(2))
    assert done.returncode == 0
    assert len(done.stdout.splitlines()) == 3


def test_a_terminal_that_hangs_up_during_a_backlog_stops_with_exit_0(tmp_path):
    """SIGHUP finishes the page in hand, saves and exits 0, though the progress
    line on that terminal can no longer be drawn (EIO)."""
    db = str(tmp_path / "big.db")
    make_db(db, runs=40, events_per_run=1000).close()
    leader, follower = pty.openpty()
    name = os.ttyname(follower)

    def on_the_terminal() -> None:
        os.setsid()
        os.dup2(os.open(name, os.O_RDWR), 2)  # the controlling terminal, on stderr

    with open(tmp_path / "out.jsonl", "wb") as out:
        proc = subprocess.Popen(
            [*EXPORT, "jsonl", "--db", db, "--cursor-file", str(tmp_path / "c"),
             "--page-size", "10", "--follow"],
            stdout=out, stdin=subprocess.DEVNULL, preexec_fn=on_the_terminal, cwd=REPO_ROOT,
            env=child_env())
    os.close(follower)
    deadline = time.monotonic() + 20
    seen = b""
    while b"exported through" not in seen and time.monotonic() < deadline:
        seen += os.read(leader, 4096)
    os.close(leader)  # hang up
    assert proc.wait(timeout=30) == 0
    lines = (tmp_path / "out.jsonl").read_bytes().splitlines()
    assert int((tmp_path / "c").read_text()) == len(lines)


_ASYNCIO_THEN_SIGTERM = """
import asyncio, os, signal, threading
from agentrt_export import stop_on_signals
stop = threading.Event()
stop_on_signals(stop)
async def setup():  # any asyncio code that handles a signal of its own, then ends
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, lambda: None)
asyncio.run(setup())
os.kill(os.getpid(), signal.SIGTERM)
print(stop.wait(5))
"""


def test_stop_on_signals_survives_an_asyncio_loop_that_handled_a_signal():
    """asyncio takes the process's wakeup fd over and leaves it unset when its
    loop closes; the stop must still come."""
    done = subprocess.run([sys.executable, "-c", _ASYNCIO_THEN_SIGTERM], capture_output=True,
                          timeout=30, env=child_env(), cwd=REPO_ROOT)
    assert done.stdout.strip() == b"True", done.stderr[-300:]


def test_a_sink_that_returns_a_coroutine_is_refused_and_the_cursor_stays(tmp_path):
    db = _db(tmp_path)
    sent: list[int] = []

    async def send(event) -> None:
        sent.append(event.seq)

    cursor = MemoryCursor()
    with pytest.raises(FollowError, match="has not run: the event was not handled"):
        Follower(open_existing(db), cursor=cursor, once=True).follow(lambda e: send(e))
    assert sent == [] and cursor.seq == 0


def test_a_non_ascii_hash_cell_leaves_the_cursor_unbound_not_a_traceback(tmp_path):
    db = _db(tmp_path)
    conn = apsw.Connection(db)
    conn.execute("UPDATE events SET hash = 'é' WHERE seq = 3")
    conn.close()
    cursor = str(tmp_path / "c")
    runs = [_export("--db", db, "--cursor-file", cursor) for _ in range(2)]
    for done in runs:
        assert done.returncode == 0, done.stderr.decode()[-400:]
    assert [len(d.stdout.splitlines()) for d in runs] == [3, 0]  # exactly once


def test_a_history_rewritten_while_a_failing_sink_runs_does_not_bind_the_cursor(tmp_path):
    """The binding saved on a sink's failure is the hash read with the page: a
    history restored meanwhile must not bind the cursor to the new file."""
    db = _db(tmp_path)
    cursor_path = str(tmp_path / "c")

    def sink(event) -> None:
        if event.seq == 2:  # the file restored in place while the page is in hand
            conn = apsw.Connection(db)
            conn.execute("UPDATE events SET hash = lower(hex(randomblob(32)))")
            conn.close()
            raise RuntimeError("collector refused")

    with pytest.raises(RuntimeError) as raised:
        Follower(open_existing(db), cursor=FileCursor(cursor_path), once=True).follow(sink)
    assert any("changed while the page was in hand" in n
               for n in getattr(raised.value, "__notes__", []))
    assert FileCursor(cursor_path).load() == 0


def test_a_cursor_name_the_save_cannot_use_is_refused_before_anything_is_exported(tmp_path):
    db = _db(tmp_path)
    name = "c" * 248  # a legal name, and so is its lock's; ".c…c.XXXXXXXX" is 258 bytes
    done = _export("--db", db, "--cursor-file", str(tmp_path / name))
    assert done.returncode == 1
    assert done.stdout == b""
    assert b"too long" in done.stderr and done.stderr.count(b"\n") == 1


def test_an_output_that_fails_before_any_save_says_no_position_was_saved(tmp_path):
    db = _db(tmp_path)
    cursor = tmp_path / "c"
    with open("/dev/full", "wb") as full:
        done = _export("--db", db, "--cursor-file", str(cursor), stdout=full,
                       stderr=subprocess.PIPE, capture_output=False)
    assert done.returncode == 1
    assert f"no position was saved yet in {cursor}, so the next start writes every event " \
           "again" in done.stderr.decode()
    assert not cursor.exists()


_AT = "2026-09-25T14:03:04.5Z"


def _events(n: int) -> list[Event]:
    return [Event(i, "run-1", "", _AT, "run.created", b'{"goal":"a"}') for i in range(1, n + 1)]


def test_an_event_sink_tells_a_mend_only_after_the_mended_record_is_flushed(tmp_path):
    """Per event (``sink(e)`` then ``flush()``) the record is buffered: a note told
    before the flush would land inside it on a stderr that shares the file."""
    events = _events(2)
    whole = b"".join(jsonl_record(e) for e in events)
    path = tmp_path / "out.jsonl"
    path.write_bytes(whole[:10])
    err = os.open(path, os.O_WRONLY | os.O_APPEND)  # stderr inherited onto the same file
    try:
        with open(path, "ab") as out:
            sink = JSONLSink(out, on_mend=lambda s: os.write(err, f"note: {s}\n".encode()))
            for e in events:
                sink(e)
            sink.flush()
    finally:
        os.close(err)
    lines = path.read_bytes().splitlines(keepends=True)
    assert lines[:2] == [jsonl_record(e) for e in events]
    assert lines[2].startswith(b"note: ")


_CUT_SHORT = """
import resource, signal, sys
from agentrt.events import Event
from agentrt.trace import jsonl_record
from agentrt_export import JSONLSink
from agentrt_export.follower import PartialPage
events = [Event(i, "run-1", "", "2026-09-25T14:03:04.5Z", "run.created", b'{"goal":"a"}')
          for i in range(1, 6)]
path = sys.argv[1]
with open(path, "wb") as f:
    f.write(jsonl_record(events[0])[:10])  # the first record torn by an earlier write
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = len(jsonl_record(events[0])) * 2 + 5  # room for 2 records, not 5
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
notes = []
with open(path, "ab") as out:
    try:
        JSONLSink(out, on_mend=notes.append).handle_page(events)
    except PartialPage as cut:
        print(cut.accepted, len(notes))
"""


def test_a_page_cut_short_after_its_mend_still_tells_the_mend(tmp_path):
    done = subprocess.run([sys.executable, "-c", _CUT_SHORT, str(tmp_path / "out.jsonl")],
                          capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.stdout.split() == ["2", "1"], done.stderr[-500:]


def test_an_output_that_fails_before_any_save_of_one_run_says_which_events_go_again(tmp_path):
    db = _db(tmp_path)
    with open_existing(db) as store:
        run = store.list_events_after("", 0, 1)[0].run_id
    cursor = tmp_path / "c"
    with open("/dev/full", "wb") as full:
        done = _export("--db", db, "--cursor-file", str(cursor), "--run", run, stdout=full,
                       stderr=subprocess.PIPE, capture_output=False)
    assert done.returncode == 1
    assert f"writes every event of run {run} again" in done.stderr.decode()


_IGNORED_SIGINT_THEN_SIGNALS = """
import os, signal, threading
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell's `cmd &` starts a job
from agentrt_export import stop_on_signals
stop = threading.Event()
stop_on_signals(stop)
os.kill(os.getpid(), signal.SIGINT)
print(stop.wait(0.5), signal.getsignal(signal.SIGINT) == signal.SIG_IGN)
os.kill(os.getpid(), signal.SIGTERM)
print(stop.wait(5))
"""


def test_stop_on_signals_leaves_a_sigint_ignored_on_the_way_in_ignored():
    """A script run as `cmd &` was stopped by the Ctrl-C meant for the job in
    the foreground (the command itself already kept it ignored)."""
    done = subprocess.run([sys.executable, "-c", _IGNORED_SIGINT_THEN_SIGNALS],
                          capture_output=True, timeout=30, env=child_env(), cwd=REPO_ROOT)
    assert done.stdout.split() == [b"False", b"True", b"True"], done.stderr[-300:]

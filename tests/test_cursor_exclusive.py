"""One exporter per cursor file: a second one on the same file is refused.

Two followers on one cursor would each deliver every event and save over each
other's position, so it could move back. The hold is a kernel lock on a file
beside the cursor, so these are claims about processes: a real exporter holds
the file while another (CLI or library) tries it, and SIGKILL must free it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from eventdb import REPO_ROOT, add_run, child_env, make_db
from store_helpers import file_state
from test_export_processes import exporter, one_error_line, run_cli, wait_for_cursor

from agentrt.store import open_existing, open_store
from agentrt_export import CursorError, CursorHeldError, FileCursor, Follower

COMMANDS = ["jsonl", "otel"]
#: otel's "none" exporter maps each page and drops it: no collector needed.
ENV = {"jsonl": {}, "otel": {"OTEL_TRACES_EXPORTER": "none"}}


def refusal(path: str, pid: int) -> str:
    return (f"export: cursor file {path} is held by another exporter (pid {pid}), which "
            "delivers the same events and saves its own position there: stop it, or give "
            "this exporter a cursor file of its own (--cursor-file)")


def wait_for_hold(cursor: Path, pid: int, timeout: float = 20) -> None:
    """Until the process ``pid`` holds the cursor file (its lock file names it)."""
    lock = Path(f"{cursor}.lock")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lock.exists() and lock.read_bytes() == b"pid %d\n" % pid:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not hold {cursor} within {timeout}s")


def follower(db: str, cursor: str, command: str) -> subprocess.Popen[bytes]:
    """An exporter following ``db`` with ``cursor``, its stdout discarded."""
    return exporter(db, "--cursor-file", cursor, "--follow", command=command,
                    env=ENV[command], stdout=subprocess.DEVNULL)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a clean stop, exit 0) or, if already gone, reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_second_exporter_on_the_same_cursor_file_is_refused_with_its_pid(tmp_path, command):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=5).close()
    cursor = tmp_path / "cursor"
    first = follower(db, str(cursor), command)
    try:
        wait_for_cursor(cursor, 10)  # delivered everything; now waits for more
        before = file_state(cursor)
        second = run_cli(command, "--db", db, "--cursor-file", str(cursor), env=ENV[command])
        assert one_error_line(second) == refusal(str(cursor), first.pid)
        assert file_state(cursor) == before
        assert FileCursor(cursor).load() == 10  # reading a held cursor is fine
        assert first.poll() is None  # the holder goes on
    finally:
        stop(first)
    assert not Path(f"{cursor}.lock").exists()  # a clean stop removes the lock file


@pytest.mark.parametrize("command", COMMANDS)
def test_a_cursor_file_that_does_not_exist_yet_is_held_too(tmp_path, command):
    db = str(tmp_path / "runs.db")
    open_store(db).close()  # no events: the first exporter saves no cursor
    cursor = tmp_path / "cursor"
    first = follower(db, str(cursor), command)
    try:
        wait_for_hold(cursor, first.pid)
        second = run_cli(command, "--db", db, "--cursor-file", str(cursor), env=ENV[command])
        assert one_error_line(second) == refusal(str(cursor), first.pid)
        assert not cursor.exists()
    finally:
        stop(first)


@pytest.mark.parametrize("command", COMMANDS)
def test_after_the_holder_is_sigkilled_a_second_exporter_takes_the_cursor_file(tmp_path,
                                                                                 command):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=5).close()
    cursor = tmp_path / "cursor"
    first = follower(db, str(cursor), command)
    try:
        wait_for_cursor(cursor, 10)
        first.kill()  # SIGKILL: no handler runs; the kernel lets go of the lock
        assert first.wait(timeout=20) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert Path(f"{cursor}.lock").exists()  # left behind, and taken over
    store = open_store(db)
    add_run(store, "later", 3)
    store.close()
    second = run_cli(command, "--db", db, "--cursor-file", str(cursor), env=ENV[command])
    assert second.returncode == 0, second.stderr
    assert second.stderr == b""
    if command == "jsonl":
        assert [json.loads(line)["seq"] for line in second.stdout.splitlines()] == [11, 12, 13]
    assert cursor.read_text() == "13\n"
    assert not Path(f"{cursor}.lock").exists()


@pytest.mark.parametrize("way", ["linked directory", "relative path"])
@pytest.mark.parametrize("command", COMMANDS)
def test_the_same_cursor_file_reached_by_another_path_is_refused(tmp_path, command, way):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=5).close()
    real = tmp_path / "real"
    real.mkdir()
    cursor = real / "cursor"
    if way == "linked directory":
        (tmp_path / "link").symlink_to(real, target_is_directory=True)
        other = str(tmp_path / "link" / "cursor")
    else:
        other = os.path.relpath(cursor, REPO_ROOT)  # the exporter runs in REPO_ROOT
    first = follower(db, str(cursor), command)
    try:
        wait_for_cursor(cursor, 10)
        before = file_state(cursor)
        second = run_cli(command, "--db", db, "--cursor-file", other, env=ENV[command])
        assert one_error_line(second) == refusal(other, first.pid)
        assert file_state(cursor) == before
    finally:
        stop(first)


def test_a_library_follower_is_refused_a_cursor_file_an_exporter_holds(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=5).close()
    cursor = tmp_path / "cursor"
    first = follower(db, str(cursor), "jsonl")
    delivered = []
    try:
        wait_for_cursor(cursor, 10)
        before = file_state(cursor)
        with open_existing(db, read_only=True) as store, \
                pytest.raises(CursorHeldError) as caught:
            Follower(store, cursor=FileCursor(cursor), once=True).follow(delivered.append)
        assert str(caught.value) == refusal(str(cursor), first.pid)
        assert caught.value.pid == first.pid
        assert isinstance(caught.value, CursorError)
        with pytest.raises(CursorHeldError, match=f"another exporter \\(pid {first.pid}\\)"), \
                FileCursor(cursor):
            pass
        assert delivered == []
        assert file_state(cursor) == before
    finally:
        stop(first)


def test_a_follow_holds_its_cursor_file_until_it_returns(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    path = tmp_path / "cursor"
    cursor = FileCursor(path)
    refused = []

    def sink(event):
        try:
            FileCursor(path).acquire()
        except CursorHeldError as exc:
            refused.append(str(exc))

    with open_existing(db, read_only=True) as store:
        Follower(store, cursor=cursor, once=True).follow(sink)
        assert refused == [
            f"export: cursor file {path} is held by another follower in this process (pid "
            f"{os.getpid()}), which delivers the same events and saves its own position "
            "there: stop it, or give this exporter a cursor file of its own (--cursor-file)"
        ] * 3
        assert not cursor.held
        assert not Path(f"{path}.lock").exists()
        with FileCursor(path) as held:  # a caller's hold outlives the follow
            Follower(store, cursor=held, once=True).follow(sink)
            assert held.held
            assert Path(f"{path}.lock").read_text() == f"pid {os.getpid()}\n"
            assert os.stat(f"{path}.lock").st_mode & 0o777 == 0o600
        assert not held.held
        assert not Path(f"{path}.lock").exists()


FORK = r"""
import os, sys, time
from agentrt_export import CursorHeldError, FileCursor
cursor = FileCursor(sys.argv[1])
cursor.acquire()
child = os.fork()
if child == 0:
    try:
        FileCursor(sys.argv[1]).acquire()
        os.write(1, b"child took it\n")
    except CursorHeldError as exc:
        os.write(1, f"child refused, held {cursor.held}, holder {exc.pid}\n".encode())
    time.sleep(60)
    os._exit(0)
os.write(1, b"%d\n" % child)
time.sleep(60)
"""


def test_a_forked_child_does_not_inherit_the_hold_nor_keep_it_past_its_parent(tmp_path):
    cursor = tmp_path / "cursor"
    parent = subprocess.Popen([sys.executable, "-c", FORK, str(cursor)], stdout=subprocess.PIPE,
                              env=child_env(), cwd=REPO_ROOT)
    child = 0
    try:
        assert parent.stdout is not None
        said = sorted([parent.stdout.readline(), parent.stdout.readline()])  # either order
        child = int(said[0])
        assert said[1] == f"child refused, held False, holder {parent.pid}\n".encode()
        parent.kill()
        parent.wait(timeout=20)
        os.kill(child, 0)  # the child outlives its parent...
        with FileCursor(cursor) as taken:  # ...and does not keep the hold alive
            assert taken.held
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child:
            os.kill(child, signal.SIGKILL)


def test_a_lock_file_that_is_a_link_or_another_file_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "cursor"
    target = tmp_path / "target"
    target.write_bytes(b"precious\n")
    lock = Path(f"{path}.lock")
    lock.symlink_to(target)
    with pytest.raises(CursorError) as caught:
        FileCursor(path).acquire()
    assert str(caught.value) == (
        f"export: cannot hold cursor file {path}: its lock file {lock} is a symbolic link, "
        f"which is never followed: remove {lock}, or name another cursor file")
    lock.unlink()
    lock.write_bytes(b"42\n")  # another exporter's cursor file, named cursor.lock
    with pytest.raises(CursorError) as caught:
        FileCursor(path).acquire()
    assert str(caught.value) == (
        f"export: cannot hold cursor file {path}: its lock file {lock} is a file holding "
        "something other than a pid, not a lock file, and is left alone; move it away, or "
        "name another cursor file")
    assert lock.read_bytes() == b"42\n"
    assert target.read_bytes() == b"precious\n"
    assert sorted(os.listdir(tmp_path)) == ["cursor.lock", "target"]


def test_a_second_follow_on_the_same_cursor_object_is_refused_and_the_hold_outlives_the_first(
        tmp_path):
    # One FileCursor object handed to two followers (a follower thread restarted
    # while the old one winds down): the second was not refused and delivered
    # every event again, and the first, ending, let go of the file while the
    # second still followed, so a third exporter was let in.
    import threading

    db = str(tmp_path / "runs.db")
    make_db(db).close()
    path = str(tmp_path / "cursor")
    cursor = FileCursor(path)
    stop_a, busy, release = threading.Event(), threading.Event(), threading.Event()
    errors: list[Exception] = []

    def slow_sink(event) -> None:  # A is busy with its first page when B starts
        busy.set()
        release.wait(5)

    def follow(sink, stop) -> None:
        try:
            with open_existing(db, read_only=True) as store:
                Follower(store, cursor=cursor, interval=0.01).follow(sink, stop)
        except Exception as exc:  # noqa: BLE001 - looked at below
            errors.append(exc)

    a = threading.Thread(target=follow, args=(slow_sink, stop_a))
    a.start()
    assert busy.wait(5)
    got_b: list = []
    stop_b = threading.Event()
    threading.Timer(3, stop_b.set).start()  # refused at once; else it follows until then
    follow(got_b.append, stop_b)
    assert got_b == [] and len(errors) == 1 and isinstance(errors[0], CursorHeldError)
    assert "another follower in this process" in str(errors[0])
    with pytest.raises(CursorHeldError):  # A still holds the file
        FileCursor(path).acquire()
    release.set()
    stop_a.set()
    a.join(5)
    assert errors == [errors[0]]
    with FileCursor(path):  # A's end let go of it
        pass


def test_a_holder_whose_pid_equals_ours_in_another_namespace_is_another_exporter(tmp_path):
    # The lock file's pid is the holder's in its own PID namespace: two
    # containers sharing a cursor volume both run their exporter as pid 1.
    # Only a hold of this process is said to be one.
    lock = tmp_path / "cursor.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "os.write(fd, b'pid %d\\n' % int(sys.argv[2]))\n"
         "print('held', flush=True)\n"
         "time.sleep(60)\n", str(lock), str(os.getpid())],
        stdout=subprocess.PIPE, env=child_env(), cwd=REPO_ROOT)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(CursorHeldError) as refused:
            FileCursor(str(tmp_path / "cursor")).acquire()
    finally:
        holder.kill()
        holder.wait()
    assert refused.value.pid == os.getpid()
    assert f"held by another exporter (pid {os.getpid()})" in str(refused.value)

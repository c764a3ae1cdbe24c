"""`agentrt-export jsonl` as a real process: signals, kills, pipes and bad input.

Delivery guarantees are claims about processes, so they are tested with
processes: a writer process keeps committing while the exporter is stopped
with SIGTERM/SIGINT (exactly once) or SIGKILL (at least once, at most one
page again per kill). A follower that has caught up prints each new commit
as it lands, and neither `jsonl` nor `otel` changes the database file.
"""

from __future__ import annotations

import json
import os
import pty
import queue
import random
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from eventdb import REPO_ROOT, add_run, child_env, child_process, make_db, read_terminal
from store_helpers import file_state, raw, without_file_privileges
from stress import rounds

from agentrt.store import open_existing, open_store
from agentrt_export import DEFAULT_PAGE_SIZE, Follower
from agentrt_export.follower import MAX_INTERVAL

posix_modes = pytest.mark.skipif(sys.platform == "win32", reason="modes mean nothing there")


def exporter(db: str, *args: str, stdout=None, stderr=subprocess.PIPE, command: str = "jsonl",
             env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "agentrt_export.cli", command, "--db", db, *args],
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=stderr,
        env={**child_env(), **(env or {})},
        cwd=REPO_ROOT,
    )


def writer(db: str, runs: int, per_run: int, pause: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, os.path.join(REPO_ROOT, "tests", "eventdb.py"), db, str(runs),
         str(per_run), str(pause)],
        stdout=subprocess.DEVNULL,
        env=child_env(),
    )


def seqs_of(path: Path) -> list[int]:
    """Seqs of the complete lines in an output file (a torn last line was not delivered)."""
    data = path.read_bytes()
    lines = data.split(b"\n")[:-1]  # whatever follows the last newline is incomplete
    return [json.loads(line)["seq"] for line in lines]


def wait_for_output(path: Path, min_bytes: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size >= min_bytes:
            return
        time.sleep(0.01)
    raise AssertionError(f"no output in {path} after {timeout}s")


def head_seq(db: str) -> int:
    with open_existing(db) as store:
        return store.chain_head()[0]


def wait_for_cursor(path: Path, seq: int, timeout: float = 20) -> None:
    """Until the cursor file holds ``seq``: everything through it was delivered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text() == f"{seq}\n":
            return
        time.sleep(0.01)
    held = path.read_text() if path.exists() else None
    raise AssertionError(f"cursor {path} holds {held!r}, not {seq}, after {timeout}s")


class Lines:
    """The lines a process writes to a pipe, read by a thread so that every wait
    for them ends within its timeout instead of hanging the suite."""

    def __init__(self, stream) -> None:
        self._queue: queue.Queue[bytes | None] = queue.Queue()
        self.ended = False
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in iter(stream.readline, b""):
            self._queue.put(line)
        self._queue.put(None)

    def _next(self, deadline: float, waiting: Callable[[], str]) -> bytes | None:
        """The next line, or None at the end of the stream; fails at ``deadline``."""
        try:
            line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(waiting()) from None
        if line is None:
            self.ended = True
        return line

    def take(self, n: int, timeout: float = 10) -> list[bytes]:
        """The next ``n`` lines; fails if they are not all there within ``timeout``."""
        deadline = time.monotonic() + timeout
        got: list[bytes] = []
        while len(got) < n:
            if self.ended:
                raise AssertionError(f"stdout ended after {len(got)} of {n} lines")
            line = self._next(deadline, lambda: f"{len(got)} of {n} lines after {timeout}s")
            if line is not None:
                got.append(line)
        return got

    def rest(self, timeout: float = 20) -> list[bytes]:
        """Every line until the end of the stream (the process closed it)."""
        deadline = time.monotonic() + timeout
        got: list[bytes] = []
        while not self.ended:
            line = self._next(deadline, lambda: f"stdout still open after {timeout}s")
            if line is not None:
                got.append(line)
        return got


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_export_is_exactly_once_across_a_signal_and_a_restart(tmp_path, sig):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=40, events_per_run=50).close()
    cursor = str(tmp_path / "cursor")
    live = writer(db, runs=30, per_run=20, pause=0.02)
    outputs = []
    try:
        for round_ in range(3):
            out = tmp_path / f"out{round_}.jsonl"
            with open(out, "wb") as f:
                proc = exporter(db, "--cursor-file", cursor, "--follow", "--page-size", "25",
                                stdout=f)
                wait_for_output(out, 2000)
                proc.send_signal(sig)
                _, err = proc.communicate(timeout=20)
            assert proc.returncode == 0, err
            assert err == b""
            outputs.append(out)
    finally:
        live.wait(timeout=60)
    out = tmp_path / "final.jsonl"
    with open(out, "wb") as f:
        assert exporter(db, "--cursor-file", cursor, stdout=f).wait(timeout=60) == 0
    outputs.append(out)
    seqs = [s for o in outputs for s in seqs_of(o)]
    assert seqs == list(range(1, head_seq(db) + 1))


def _follow_ignoring(tmp_path: Path, ignored: signal.Signals):
    """``jsonl --follow`` of a 6-event database with a cursor file, started with
    ``ignored`` ignored, once it has delivered all six: (process, cursor path)."""
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=3).close()
    cursor = tmp_path / "cursor"
    proc = child_process(
        [sys.executable, "-m", "agentrt_export.cli", "jsonl", "--db", db,
         "--cursor-file", str(cursor), "--follow"],
        stdout=subprocess.DEVNULL, preexec_fn=lambda: signal.signal(ignored, signal.SIG_IGN))
    return proc, cursor


def test_a_sigint_ignored_on_the_way_in_stays_ignored_and_sigterm_still_stops_cleanly(tmp_path):
    """``agentrt-export ... &`` in a script: the shell starts the job with SIGINT
    ignored, so the Ctrl-C meant for the foreground must not stop the exporter."""
    started, cursor = _follow_ignoring(tmp_path, signal.SIGINT)
    with started as proc:
        wait_for_cursor(cursor, 6)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None, "a SIGINT ignored on the way in stopped the exporter"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert (proc.returncode, err) == (0, b"")


def test_a_sigterm_ignored_on_the_way_in_still_stops_the_command_cleanly(tmp_path):
    """A wrapper's ``trap '' TERM`` (or a supervisor that ignores it for its
    children): left ignored, the command ran on until a SIGKILL."""
    started, cursor = _follow_ignoring(tmp_path, signal.SIGTERM)
    with started as proc:
        wait_for_cursor(cursor, 6)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert (proc.returncode, err) == (0, b"")
    assert cursor.read_text() == "6\n"


def test_export_follow_prints_each_new_commit_live_and_stops_cleanly_while_waiting(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=5).close()
    cursor = tmp_path / "cursor"
    err_file = tmp_path / "stderr"
    with open(err_file, "wb") as err:
        proc = exporter(db, "--cursor-file", str(cursor), "--follow", stderr=err)
    assert proc.stdout is not None
    lines = Lines(proc.stdout)
    try:
        printed = lines.take(10)
        wait_for_cursor(cursor, 10)  # caught up: the page is saved, the wait begins
        store = open_store(db)
        try:
            for batch, size in enumerate([1, 4, 3]):
                # Well past the follower's short polling after a wake-up: it is asleep.
                time.sleep(0.3)
                assert proc.poll() is None, "the follower exited instead of waiting"
                add_run(store, f"live-{batch}", size)
                printed += lines.take(size, timeout=10)
        finally:
            store.close()
        last = head_seq(db)
        assert last == 18
        wait_for_cursor(cursor, last)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        printed += lines.rest()
    finally:
        proc.kill()
        proc.wait()
    assert err_file.read_bytes() == b""
    assert [json.loads(line)["seq"] for line in printed] == list(range(1, last + 1))
    assert [json.loads(line)["run_id"] for line in printed[10:]] == (
        ["live-0"] + ["live-1"] * 4 + ["live-2"] * 3)
    assert cursor.read_text() == f"{last}\n"


@posix_modes
@pytest.mark.parametrize("follow", [False, True], ids=["once", "follow"])
@pytest.mark.parametrize("command", ["jsonl", "otel"])
def test_export_leaves_the_database_bytes_mtime_and_mode_as_they_were(tmp_path, command, follow):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=3, events_per_run=5).close()  # checkpoints and removes the WAL
    assert os.listdir(tmp_path) == ["runs.db"]
    os.chmod(db, 0o644)  # a read-write open would tighten this to 0600
    an_hour_ago = time.time_ns() - 3600 * 10**9  # any write would move it to now
    os.utime(db, ns=(an_hour_ago, an_hour_ago))
    before = file_state(db)
    cursor = tmp_path / "cursor"
    out = tmp_path / "out"
    # otel: "none" maps each page and discards it, so no collector is needed.
    env = {"OTEL_TRACES_EXPORTER": "none"} if command == "otel" else {}
    with open(out, "wb") as f:
        proc = exporter(db, "--cursor-file", str(cursor), *(["--follow"] if follow else []),
                        command=command, env=env, stdout=f)
        try:
            if follow:
                wait_for_cursor(cursor, 15)  # it delivered everything and waits
                assert proc.poll() is None
                proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert err == b""
    assert cursor.read_text() == "15\n"
    if command == "jsonl":
        assert seqs_of(out) == list(range(1, 16))
    else:
        assert out.read_bytes() == b""
    assert file_state(db) == before
    # To read a WAL database SQLite may create an empty -wal and the -shm beside
    # it; they get the database's mode and owner (docs/security.md).
    sidecars = set(os.listdir(tmp_path)) - {"runs.db", "cursor", "out"}
    assert sidecars <= {"runs.db-wal", "runs.db-shm"}
    for name in sidecars:
        st = os.stat(tmp_path / name)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o644, os.stat(db).st_uid), name
    wal = tmp_path / "runs.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0


@pytest.mark.slow
def test_export_redelivers_at_most_one_page_per_sigkill(tmp_path):
    kills = rounds(6, 40)
    page = 20
    db = str(tmp_path / "runs.db")
    # A backlog of 100 pages, more than the CI kills consume together, so each
    # process is killed with events still to write (the live writer adds more).
    make_db(db, runs=40, events_per_run=50).close()
    cursor = str(tmp_path / "cursor")
    live = writer(db, runs=rounds(300, 2000), per_run=7, pause=0.005)
    rng = random.Random(7)
    segments: list[list[int]] = []
    mid_export = 0  # kills after some output, with committed events it had not yet written
    try:
        with open_existing(db) as reader:
            for k in range(kills):
                out = tmp_path / f"kill{k}.jsonl"
                with open(out, "wb") as f:
                    proc = exporter(db, "--cursor-file", cursor, "--follow", "--page-size",
                                    str(page), stdout=f, stderr=subprocess.DEVNULL)
                    try:
                        # Records are about 140 bytes: kill from just after the
                        # first page to some four pages in (or a little later).
                        wait_for_output(out, rng.randint(1, 4 * page * 140))
                        head = reader.chain_head()[0]
                    finally:
                        proc.kill()
                        proc.wait(timeout=20)
                segment = seqs_of(out)
                segments.append(segment)
                mid_export += bool(segment) and segment[-1] < head
    finally:
        live.wait(timeout=120)
    # Otherwise the kills below proved nothing about a kill during an export.
    assert mid_export * 3 >= kills, f"only {mid_export} of {kills} kills came mid-export"
    out = tmp_path / "drain.jsonl"
    with open(out, "wb") as f:
        assert exporter(db, "--cursor-file", cursor, stdout=f).wait(timeout=60) == 0
    segments.append(seqs_of(out))

    delivered_through = 0
    repeats = 0
    for segment in segments:
        if not segment:
            continue
        # Each process delivers a contiguous, increasing run of seqs...
        assert segment == list(range(segment[0], segment[0] + len(segment)))
        # ...starting no more than one page before where the last one got to, and no gap.
        assert delivered_through - page < segment[0] <= delivered_through + 1
        repeats += max(0, delivered_through - segment[0] + 1)
        delivered_through = max(delivered_through, segment[-1])
    assert delivered_through == head_seq(db)
    assert repeats <= page * kills


def test_closed_pipe_ends_quietly_without_saving_past_what_was_written(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=50, events_per_run=100).close()
    cursor = tmp_path / "cursor"
    proc = exporter(db, "--cursor-file", str(cursor), "--page-size", "2000")
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    proc.stdout.close()  # what `| head -n 3` does
    _, err = proc.communicate(timeout=20)
    assert [json.loads(line)["seq"] for line in lines] == [1, 2, 3]
    assert proc.returncode == 0
    assert err == b""
    # The first page (more than a pipe buffer) never fully reached the reader.
    assert not cursor.exists()


def run_cli(*args: str, env_db: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    extra = env or {}
    env = child_env()
    env.pop("AGENTRT_DB", None)
    env.update(extra)
    if env_db is not None:
        env["AGENTRT_DB"] = env_db
    return subprocess.run([sys.executable, "-m", "agentrt_export.cli", *args],
                          capture_output=True, env=env, cwd=REPO_ROOT, timeout=60)


def test_export_reads_the_database_from_the_environment(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    done = run_cli("jsonl", env_db=db)
    assert done.returncode == 0
    assert [json.loads(line)["seq"] for line in done.stdout.splitlines()] == [1, 2, 3]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["jsonl"], 2, b"no database: pass --db or set AGENTRT_DB"),
        (["jsonl", "--db", "{missing}"], 1, b"does not exist"),
        (["jsonl", "--db", "{db}", "--cursor-file", "c", "--after-seq", "1"], 2,
         b"not both"),
        (["jsonl", "--db", "{db}", "--page-size", "0"], 2, b"--page-size"),
        # As Go's flag parsing (before: Python's int() took these).
        (["jsonl", "--db", "{db}", "--page-size", " 5"], 2, b"not a whole number in ASCII digits"),
        (["jsonl", "--db", "{db}", "--after-seq", "\u0663"], 2,
         "'\u0663' is not a whole number in ASCII digits".encode()),
        (["jsonl", "--db", "{db}", "--cursor-file", "{garbage}"], 1,
         b"does not hold a sequence number"),
        (["jsonl", "--db", "{db}", "--after-seq", "999"], 1,
         b"--after-seq 999 is past the last event"),
        (["nonsense"], 2, b"No such command"),
    ],
)
def test_export_bad_input_gets_one_sentence_and_an_exit_code(tmp_path, args, code, message):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    garbage = tmp_path / "garbage"
    garbage.write_text("not a number\n")
    subs = {"{db}": db, "{missing}": str(tmp_path / "nope.db"), "{garbage}": str(garbage)}
    done = run_cli(*[subs.get(a, a) for a in args])
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert b"Traceback" not in done.stderr
    assert done.stdout == b""


def test_export_of_a_huge_payload_arrives_as_the_truncation_object(tmp_path):
    db = str(tmp_path / "runs.db")
    store = make_db(db, runs=1, events_per_run=1)
    size = 100 * 1024 * 1024
    with store.tx() as tx:
        # Bypass append to write one 100 MB payload quickly; the chain is not the point.
        tx.execute(
            "INSERT INTO events (seq, run_id, step_id, at, type, payload_json) VALUES "
            "(2, 'run-0', '', '2026-10-01T09:00:00Z', 'step.decided', "
            "'{\"x\":\"' || replace(hex(zeroblob(?)), '0', 'a') || '\"}')",
            (size // 2,),
        )
    store.close()
    done = run_cli("jsonl", "--db", db)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    payload = records[1]["payload"]
    assert payload["truncated"] is True
    assert payload["length"] == size + 8
    assert len(done.stdout) < 200_000


def test_a_progress_line_shows_while_a_backlog_drains_at_a_terminal(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=24, events_per_run=500).close()
    leader, follower_tty = pty.openpty()
    with open(os.devnull, "wb") as sink:
        proc = exporter(db, stdout=sink, stderr=follower_tty)
        os.close(follower_tty)
        seen = read_terminal(leader)
        assert proc.wait(timeout=60) == 0
    os.close(leader)
    assert b"exported through seq 12000 of 12000" in seen
    # Without a terminal, stderr stays empty (see the bad-input tests' empty stdout).
    quiet = run_cli("jsonl", "--db", db)
    assert quiet.returncode == 0 and quiet.stderr == b""


def test_the_follower_reads_pages_of_500_by_default():
    assert DEFAULT_PAGE_SIZE == 500
    assert Follower(open_store(":memory:"), once=True).page_size == 500


# -- refusals before anything is exported, and failures in one sentence -----------------


def one_error_line(done: subprocess.CompletedProcess[bytes]) -> str:
    """The single ``error: ...`` line of a failed run, checked to be just that."""
    assert done.returncode == 1, done.stderr
    assert done.stdout == b""
    assert b"Traceback" not in done.stderr
    assert done.stderr.startswith(b"error: ") and done.stderr.count(b"\n") == 1, done.stderr
    return done.stderr.decode()[len("error: "):-1]


def test_a_cursor_in_a_missing_directory_is_refused_before_anything_is_exported(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=3).close()
    cursor = str(tmp_path / "nodir" / "cur")
    sentence = one_error_line(run_cli("jsonl", "--db", db, "--cursor-file", cursor))
    assert sentence == (f"export: the directory of cursor file {cursor} does not exist: create "
                        f"{tmp_path / 'nodir'}, or name a cursor file in an existing directory")
    assert not (tmp_path / "nodir").exists()


@pytest.mark.parametrize("command", ["jsonl", "otel"])
def test_a_cursor_file_saved_on_another_database_is_refused_before_anything_is_exported(
        tmp_path, command):
    first, other = str(tmp_path / "first.db"), str(tmp_path / "other.db")
    make_db(first, runs=2, events_per_run=5).close()
    store = open_store(other)
    add_run(store, "elsewhere", 20)
    store.close()
    cursor = str(tmp_path / "cursor")
    env = {"OTEL_TRACES_EXPORTER": "none"} if command == "otel" else {}
    done = run_cli(command, "--db", first, "--cursor-file", cursor, env=env)
    assert done.returncode == 0 and Path(cursor).read_text() == "10\n"
    sentence = one_error_line(run_cli(command, "--db", other, "--cursor-file", cursor, env=env))
    assert sentence.startswith(f"export: cursor file {cursor} was saved after seq 10 of another "
                               f"database: {other} has another history up to that event")
    assert Path(cursor).read_text() == "10\n"


@posix_modes
def test_a_cursor_in_a_directory_this_user_cannot_write_is_refused_before_exporting(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=3).close()
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    cursor = str(locked / "cur")
    env = child_env()
    env.pop("AGENTRT_DB", None)
    prefix = without_file_privileges()  # root, too, meets the directory's mode
    try:
        done = subprocess.run(
            [*prefix, sys.executable, "-m", "agentrt_export.cli", "jsonl", "--db", db,
             "--cursor-file", cursor], capture_output=True, env=env, cwd=REPO_ROOT, timeout=60)
    finally:
        locked.chmod(0o700)
    sentence = one_error_line(done)
    assert sentence == (f"export: cannot save cursor file {cursor}: this user cannot write its "
                        f"directory {locked}; make the directory writable, or name a cursor "
                        "file in a directory this user can write")
    assert os.listdir(locked) == []


FOREIGN = ("so it is not the agentrt schema its version says: another program changed it; "
           "open a backup, or a copy agentrt made")


@pytest.mark.parametrize("command", ["jsonl", "otel"])
@pytest.mark.parametrize(
    ("damage", "args", "message"),
    [
        ("page", [], "reading {db}: database disk image is malformed"),
        ("table", [], "agentrt: open store: {db} has no table events, " + FOREIGN),
        ("column", ["--after-seq", "3"],
         "agentrt: open store: {db} has a table events without its column hash, " + FOREIGN),
    ],
)
def test_a_database_that_cannot_be_read_is_one_sentence_not_a_traceback(
        tmp_path, command, damage, args, message):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=3, events_per_run=50).close()
    conn = raw(db)
    if damage == "page":
        root = conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'events'").fetchone()
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.close()
        with open(db, "r+b") as f:
            f.seek((root[0] - 1) * size)
            f.write(b"\xff" * size)
    else:
        conn.execute("DROP TABLE events" if damage == "table"
                     else "ALTER TABLE events DROP COLUMN hash")
        conn.close()
    env = child_env()
    env.pop("AGENTRT_DB", None)
    env["OTEL_TRACES_EXPORTER"] = "none"
    done = subprocess.run([sys.executable, "-m", "agentrt_export.cli", command, "--db", db,
                           *args], capture_output=True, env=env, cwd=REPO_ROOT, timeout=60)
    # The operator command's wording for what SQLite could not read, and the
    # opener's for a table another program changed.
    assert one_error_line(done) == message.format(db=db)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "0.0001", "-1", "soon"])
def test_an_interval_that_is_not_a_wait_is_a_usage_error(tmp_path, value):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    done = run_cli("jsonl", "--db", db, "--interval", value)
    assert done.returncode == 2, done.stderr
    assert done.stdout == b""
    assert done.stderr.splitlines()[0].decode() == (
        f"usage: Invalid value for '--interval': {value} is not a wait this follower can keep: "
        "give a number of seconds from 0.001 up (a wait over 60 s is cut to 60 s)")
    assert MAX_INTERVAL == 60


def test_an_interval_above_the_cap_is_accepted_and_waits_at_most_60_s(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    for value in ("0.001", "3600"):
        done = run_cli("jsonl", "--db", db, "--interval", value)
        assert (done.returncode, done.stderr, len(done.stdout.splitlines())) == (0, b"", 3)


@pytest.mark.parametrize("events", [3, 0])
def test_after_seq_past_the_last_event_names_the_flag_not_a_cursor_file(tmp_path, events):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1 if events else 0, events_per_run=events).close()
    sentence = one_error_line(run_cli("jsonl", "--db", db, "--after-seq", "9999"))
    if events:
        assert sentence == (f"--after-seq 9999 is past the last event of {db} (seq 3); give a "
                            "seq up to 3, or leave --after-seq out to start at the first event")
    else:
        assert sentence == (f"--after-seq 9999 is past the end of {db}, which holds no events "
                            "yet; leave --after-seq out to start at the first event")
    assert "cursor" not in sentence
    # The head itself is a place to start after: nothing new, no error.
    done = run_cli("jsonl", "--db", db, "--after-seq", str(events))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


@pytest.mark.parametrize("which", ["itself", "hard link", "-wal", "-shm", "-journal"])
def test_a_cursor_file_that_is_the_database_is_refused_without_advice_to_delete_it(
        tmp_path, which):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    cursor = db
    if which == "hard link":
        cursor = str(tmp_path / "export.cursor")
        os.link(db, cursor)
    elif which != "itself":
        cursor = db + which
        if which == "-shm":
            Path(cursor).write_bytes(b"")  # SQLite's, as a reader leaves it
    before = file_state(db)
    sentence = one_error_line(run_cli("jsonl", "--db", db, "--cursor-file", cursor))
    what = {"-wal": "the write-ahead log of the database", "-shm": "the shared-memory index "
            "of the database", "-journal": "the rollback journal of the database"}
    assert sentence == (f"export: cursor file {cursor} is {what.get(which, 'the database')} "
                        f"{db}; the cursor needs a file of its own: name another one, such as "
                        f"{db}.cursor")
    assert file_state(db) == before


@pytest.mark.parametrize("kind", ["character device", "directory"])
def test_a_cursor_path_that_is_not_a_regular_file_is_refused_as_such(tmp_path, kind):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    cursor = os.devnull if kind == "character device" else str(tmp_path)
    sentence = one_error_line(run_cli("jsonl", "--db", db, "--cursor-file", cursor))
    assert sentence == (f"export: cursor file {cursor} is not a regular file (a {kind}); name a "
                        "file that holds only the cursor (it is created on the first save)")


def test_a_cursor_file_holding_no_number_is_not_met_with_advice_to_delete_it(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    notes = tmp_path / "notes.txt"
    notes.write_text("not a number\n")
    sentence = one_error_line(run_cli("jsonl", "--db", db, "--cursor-file", str(notes)))
    assert sentence == (f"export: load cursor: {notes} does not hold a sequence number; name "
                        "another cursor file, or remove it if it is a stale cursor, or restore "
                        "it from a backup")
    assert notes.read_text() == "not a number\n"


def test_a_newer_schema_gets_the_operator_commands_sentence(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    conn = raw(db)
    conn.execute("INSERT INTO schema_migrations VALUES (99, '2030-01-01T00:00:00Z')")
    conn.close()
    exported = one_error_line(run_cli("jsonl", "--db", db))
    env = child_env()
    env.pop("AGENTRT_DB", None)
    operator = subprocess.run([sys.executable, "-m", "agentrt.cli", "--db", db, "runs"],
                              capture_output=True, env=env, cwd=REPO_ROOT, timeout=60)
    assert exported == one_error_line(operator)
    assert exported.startswith(f"{db} is at schema version 99, which is newer than this build")


def test_a_cursor_path_with_control_characters_is_shown_escaped_on_one_line(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    odd = tmp_path / "x\x1b[31mred\nline"
    odd.mkdir()
    (odd / "cur").write_text("garbage\n")
    sentence = one_error_line(run_cli("jsonl", "--db", db, "--cursor-file", str(odd / "cur")))
    assert "\x1b" not in sentence
    shown = str(tmp_path / "x\\x1b[31mred line" / "cur")
    assert sentence.startswith(f"export: load cursor: {shown} does not hold a sequence number")


def test_a_run_without_events_gets_a_note_and_exit_0(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=3).close()
    done = run_cli("jsonl", "--db", db, "--run", "nosuch")
    assert (done.returncode, done.stdout) == (0, b"")
    assert done.stderr == f"no events of run nosuch in {db}\n".encode()
    done = run_cli("jsonl", "--db", db, "--run", "run-1")
    assert (done.returncode, done.stderr) == (0, b"")
    assert [json.loads(line)["run_id"] for line in done.stdout.splitlines()] == ["run-1"] * 3
    long_id = "x" * 100_000  # quoted cut, as the operator command quotes ids
    done = run_cli("jsonl", "--db", db, "--run", long_id)
    assert done.stderr == f"no events of run {'x' * 80}…(100000 characters) in {db}\n".encode()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--run", "usage: --run is empty: give a run id, or leave --run out to export every run"),
        ("--cursor-file", "usage: --cursor-file is empty: name the file that keeps the "
                          "position, or leave --cursor-file out"),
    ],
)
def test_an_empty_run_or_cursor_file_is_a_usage_error(tmp_path, option, message):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    done = run_cli("jsonl", "--db", db, option, "")
    assert (done.returncode, done.stdout) == (2, b""), done.stderr
    assert done.stderr.decode().splitlines()[0] == message


def _file_size_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails, EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_disk_that_fills_mid_page_moves_the_cursor_past_the_whole_records_written(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=4, events_per_run=100).close()
    cursor = tmp_path / "cursor"
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    # The limit falls inside the first page of 400 records (and above the 32 KiB
    # a read-only open of the WAL database needs for its -shm).
    limit = 40_000
    with open(first, "wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", "agentrt_export.cli", "jsonl", "--db", db,
             "--cursor-file", str(cursor), "--page-size", "400"],
            stdout=out, stderr=subprocess.PIPE, env=child_env(), cwd=REPO_ROOT, timeout=60,
            preexec_fn=_file_size_limit(limit))
    assert done.returncode == 1
    assert done.stderr.decode().strip() == (
        f"error: writing events to standard output: File too large; {cursor} holds seq "
        f"{seqs_of(first)[-1]}: the next start writes the events after it, completing a "
        "record cut short in a file it appends to")
    written = seqs_of(first)
    assert first.stat().st_size == limit and 0 < len(written) < 400
    assert cursor.read_text() == f"{written[-1]}\n"  # after the whole records, not before the page
    with open(second, "wb") as out:
        again = subprocess.run(
            [sys.executable, "-m", "agentrt_export.cli", "jsonl", "--db", db,
             "--cursor-file", str(cursor)],
            stdout=out, stderr=subprocess.PIPE, env=child_env(), cwd=REPO_ROOT, timeout=60)
    assert again.returncode == 0, again.stderr
    assert written + seqs_of(second) == list(range(1, 401))  # each once: the torn one again


def _export(db: str, out_path: Path, *args: str, mode: str = "ab",
            limit: int | None = None) -> subprocess.CompletedProcess[bytes]:
    with open(out_path, mode) as out:
        return subprocess.run(
            [sys.executable, "-m", "agentrt_export.cli", "jsonl", "--db", db, *args],
            stdout=out, stderr=subprocess.PIPE, env=child_env(), cwd=REPO_ROOT, timeout=60,
            preexec_fn=None if limit is None else _file_size_limit(limit))


def test_a_restart_appending_to_a_file_completes_the_record_a_full_disk_cut_short(tmp_path):
    """`agentrt-export jsonl >> file` after a write cut a record short: the file
    ends up byte for byte what one uninterrupted export writes, not a record
    glued to the torn one (which a line-based shipper would lose)."""
    db = str(tmp_path / "runs.db")
    make_db(db, runs=4, events_per_run=100).close()
    cursor, out, whole = tmp_path / "cursor", tmp_path / "out.jsonl", tmp_path / "whole.jsonl"
    assert _export(db, whole, mode="wb").returncode == 0
    cut = _export(db, out, "--cursor-file", str(cursor), "--page-size", "400", limit=40_000)
    assert cut.returncode == 1 and not out.read_bytes().endswith(b"\n")
    torn = len(out.read_bytes()) - out.read_bytes().rindex(b"\n") - 1
    again = _export(db, out, "--cursor-file", str(cursor))
    assert again.returncode == 0, again.stderr
    assert again.stderr.decode() == (
        f"agentrt-export: the output ended in the first {torn} bytes of the next record, cut "
        "short by an earlier write; wrote the rest of it\n")
    assert out.read_bytes() == whole.read_bytes()


@pytest.mark.parametrize(("earlier", "said"), [
    (b'{"seq":1,"other":', "agentrt-export: the output ended in an unfinished line of 17 bytes "
                           "that is not the next record; ended it with a newline\n"),
    (b'{"earlier":true}\n', ""),
])
def test_an_unfinished_line_that_is_not_the_next_record_is_ended_before_it(
        tmp_path, earlier, said):
    """A file ending in a newline is appended to as it is."""
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    out, whole = tmp_path / "out.jsonl", tmp_path / "whole.jsonl"
    assert _export(db, whole, mode="wb").returncode == 0
    out.write_bytes(earlier)
    done = _export(db, out)
    assert (done.returncode, done.stderr.decode()) == (0, said)
    assert out.read_bytes() == earlier.rstrip(b"\n") + b"\n" + whole.read_bytes()


def _follow_through(db: str, change: Callable[[], None]) -> tuple[list[int], bytes, bytes, int]:
    """Follow the 15 events of ``db`` live, make ``change`` to its file, and end:
    (the seqs delivered first, what came after, stderr, exit code)."""
    with child_process([sys.executable, "-m", "agentrt_export.cli", "jsonl", "--db", db,
                        "--follow"]) as proc:
        assert proc.stdout is not None
        seqs = [json.loads(proc.stdout.readline())["seq"] for _ in range(15)]
        change()
        out, err = proc.communicate(timeout=30)
    return seqs, out, err, proc.returncode


def test_a_database_replaced_while_followed_stops_the_follower_before_any_of_its_events(
        tmp_path):
    """A restore or a copy over the file: the old -wal beside it would make the
    new file's events after the old cursor look like the next ones. None of
    them reaches the sink; the follower stops with one sentence."""
    db, backup = str(tmp_path / "runs.db"), str(tmp_path / "backup.db")
    make_db(backup, runs=1, events_per_run=3).close()
    make_db(db, runs=3, events_per_run=5).close()

    def restore() -> None:
        os.replace(backup, db)
        with open_store(db) as store:
            add_run(store, "after-the-restore", 20)

    seqs, out, err, code = _follow_through(db, restore)
    assert (seqs, out, code) == (list(range(1, 16)), b"", 1)
    assert err.decode() == (
        f"error: export: {db} was replaced by another file while it was followed; nothing "
        "of the new file was delivered (the last event delivered is seq 15): start again to "
        "follow the new file, with a cursor that belongs to it\n")


@pytest.mark.parametrize("how", ["restored without its sidecars", "removed and made again"])
def test_a_database_replaced_with_its_wal_and_shm_stops_an_idle_follower(tmp_path, how):
    """A restore that removes the old -wal and -shm too (or rm runs.db* and a new
    database): the follower's connection stays on the old, unlinked files, whose
    data_version never moves, so it used to wait for ever, saying nothing. The
    name is checked at each wake-up as well."""
    db, other = str(tmp_path / "runs.db"), str(tmp_path / "other.db")
    make_db(other, runs=1, events_per_run=3).close()
    make_db(db, runs=3, events_per_run=5).close()

    def replace() -> None:
        if how == "removed and made again":
            os.remove(db)
        os.replace(other, db)
        for sidecar in ("-wal", "-shm"):
            os.remove(db + sidecar)
        with open_store(db) as store:
            add_run(store, "in-the-new-file", 20)

    seqs, out, err, code = _follow_through(db, replace)
    assert (seqs, out, code) == (list(range(1, 16)), b"", 1)
    assert err.decode() == (
        f"error: export: {db} was replaced by another file while it was followed; nothing "
        "of the new file was delivered (the last event delivered is seq 15): start again to "
        "follow the new file, with a cursor that belongs to it\n")


def test_a_database_emptied_while_followed_is_said_as_such(tmp_path):
    """SQLite calls the emptied file malformed; the sentence says what happened."""
    db = str(tmp_path / "runs.db")
    make_db(db, runs=3, events_per_run=5).close()
    _, _, err, code = _follow_through(db, lambda: os.truncate(db, 0))
    assert code == 1
    assert err.decode().startswith(f"error: reading {db}: ")
    assert err.decode().endswith("; the file was emptied while it was followed\n")


def test_a_database_removed_while_followed_stops_the_follower_saying_so(tmp_path):
    db = str(tmp_path / "runs.db")
    make_db(db, runs=3, events_per_run=5).close()

    def remove() -> None:
        with open_store(db) as writer:  # a writer that still holds the removed file
            os.remove(db)
            add_run(writer, "after-the-removal", 3)

    _, out, err, code = _follow_through(db, remove)
    assert (code, out) == (1, b"")
    assert err.decode() == (f"error: export: {db} was removed while it was followed (the last "
                            "event delivered is seq 15)\n")

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
from pathlib import Path

import pytest
from eventdb import REPO_ROOT, add_run, child_env, make_db
from store_helpers import file_state
from stress import rounds

from agentrt.store import open_existing, open_store
from agentrt_export import DEFAULT_PAGE_SIZE, Follower

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

    def take(self, n: int, timeout: float = 10) -> list[bytes]:
        """The next ``n`` lines; fails if they are not all there within ``timeout``."""
        deadline = time.monotonic() + timeout
        got: list[bytes] = []
        while len(got) < n:
            if self.ended:
                raise AssertionError(f"stdout ended after {len(got)} of {n} lines")
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{len(got)} of {n} lines after {timeout}s") from None
            if line is None:
                self.ended = True
            else:
                got.append(line)
        return got

    def rest(self, timeout: float = 20) -> list[bytes]:
        """Every line until the end of the stream (the process closed it)."""
        deadline = time.monotonic() + timeout
        got: list[bytes] = []
        while not self.ended:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"stdout still open after {timeout}s") from None
            if line is None:
                self.ended = True
            else:
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


def run_cli(*args: str, env_db: str | None = None) -> subprocess.CompletedProcess[bytes]:
    env = child_env()
    env.pop("AGENTRT_DB", None)
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
        (["jsonl", "--db", "{db}", "--cursor-file", "{garbage}"], 1,
         b"does not hold a sequence number"),
        (["jsonl", "--db", "{db}", "--after-seq", "999"], 1, b"replaced or restored"),
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
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(timeout=60) == 0
    os.close(leader)
    assert b"exported through seq 12000 of 12000" in seen
    # Without a terminal, stderr stays empty (see the bad-input tests' empty stdout).
    quiet = run_cli("jsonl", "--db", db)
    assert quiet.returncode == 0 and quiet.stderr == b""


def test_the_follower_reads_pages_of_500_by_default():
    assert DEFAULT_PAGE_SIZE == 500
    assert Follower(open_store(":memory:"), once=True).page_size == 500

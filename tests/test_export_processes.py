"""`agentrt-export jsonl` as a real process: signals, kills, pipes and bad input.

Delivery guarantees are claims about processes, so they are tested with
processes: a writer process keeps committing while the exporter is stopped
with SIGTERM/SIGINT (exactly once) or SIGKILL (at least once, at most one
page again per kill).
"""

from __future__ import annotations

import json
import os
import pty
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from eventdb import REPO_ROOT, child_env, make_db
from stress import rounds

from agentrt.store import open_existing, open_store
from agentrt_export import DEFAULT_PAGE_SIZE, Follower


def exporter(db: str, *args: str, stdout=None, stderr=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "agentrt_export.cli", "jsonl", "--db", db, *args],
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=stderr,
        env=child_env(),
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


@pytest.mark.slow
def test_export_redelivers_at_most_one_page_per_sigkill(tmp_path):
    kills = rounds(6, 40)
    page = 20
    db = str(tmp_path / "runs.db")
    make_db(db, runs=10, events_per_run=30).close()
    cursor = str(tmp_path / "cursor")
    live = writer(db, runs=rounds(300, 2000), per_run=7, pause=0.005)
    rng = random.Random(7)
    segments: list[list[int]] = []
    try:
        for k in range(kills):
            out = tmp_path / f"kill{k}.jsonl"
            with open(out, "wb") as f:
                proc = exporter(db, "--cursor-file", cursor, "--follow", "--page-size",
                                str(page), stdout=f, stderr=subprocess.DEVNULL)
                time.sleep(rng.uniform(0.2, 0.8))
                proc.kill()
                proc.wait(timeout=20)
            segments.append(seqs_of(out))
    finally:
        live.wait(timeout=120)
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

"""The store shared by real processes: first open, concurrent writers, live readers."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from store_helpers import T0, fill, insert_run, worker
from stress import rounds

from agentrt import open_existing, open_store

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes and modes")


def finish(proc, timeout: float = 60) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


def read_line(proc) -> str:
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(proc.stderr.read())
    return line.strip()


@pytest.mark.slow
def test_two_processes_opening_one_new_file_both_succeed(tmp_path):
    for attempt in range(rounds(3, 30)):  # several races, each on a fresh file
        path = str(tmp_path / f"new{attempt}.db")
        go = str(tmp_path / f"go{attempt}")
        procs = [worker("open", path, go) for _ in range(2)]
        time.sleep(0.3)  # both interpreters started and waiting
        Path(go).touch()
        assert [finish(p) for p in procs] == ["version 6\n", "version 6\n"]
        with open_existing(path) as store:
            versions = store.db().execute("SELECT version FROM schema_migrations").fetchall()
            assert [v for (v,) in versions] == [1, 2, 3, 4, 5, 6]  # applied once


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(rounds(1, 10)))
def test_four_processes_appending_at_once_leave_one_intact_chain(tmp_path, attempt):
    path = str(tmp_path / "busy.db")
    open_store(path).close()
    go = str(tmp_path / "go")
    names = ["w0", "w1", "w2", "w3"]
    procs = [worker("append", path, go, name, "6", "20") for name in names]
    time.sleep(0.3)
    Path(go).touch()
    for p in procs:
        assert finish(p) == "done\n"
    with open_existing(path) as store:
        events = store.list_events_after("", 0, 10_000)
        assert [e.seq for e in events] == list(range(1, 4 * 6 * 20 + 1))  # no gap, no reuse
        report = store.verify_events()
        assert report.intact and report.checked == 480
        for name in names:
            for r in range(6):
                mine = store.list_events(f"{name}-r{r}")
                assert [json.loads(e.payload)["n"] for e in mine] == list(range(20))
        writers = [json.loads(e.payload)["worker"] for e in events]
        switches = sum(1 for a, b in zip(writers, writers[1:], strict=False) if a != b)
        assert switches > 3  # the writers really interleaved


def test_read_only_open_reads_while_a_writer_in_another_process_is_live(tmp_path):
    path = str(tmp_path / "live.db")
    open_store(path).close()
    proc = worker("writer", path)
    try:
        assert read_line(proc) == "ready 5"
        assert os.path.exists(path + "-wal")
        with open_existing(path) as reader:
            assert len(reader.list_runs()) == 5
            seen = reader.list_events_after("", 0, 100)
            version = reader.data_version()
            proc.stdin.write("more\n")
            proc.stdin.flush()
            assert read_line(proc) == "wrote 10"
            assert reader.data_version() != version  # the reader notices new commits
            more = reader.list_events_after("", seen[-1].seq, 100)
            assert [e.seq for e in seen + more] == list(range(1, 11))
            assert reader.verify_events().intact
        proc.stdin.close()
        assert read_line(proc) == "bye"
    finally:
        proc.kill()
        proc.wait()


def test_read_then_write_transaction_waits_for_the_other_process_writer(tmp_path):
    path = str(tmp_path / "wait.db")
    with open_store(path) as store:
        fill(store, runs=1, events=0)
        proc = worker("hold", path, "0.6")
        try:
            assert read_line(proc).startswith("locked")
            started = time.monotonic()
            with store.tx() as tx:  # waits for the lock instead of failing to upgrade
                (count,) = tx.one("SELECT COUNT(*) FROM runs") or (0,)
                insert_run(tx, f"run-{count}")
            waited = time.monotonic() - started
            assert read_line(proc).startswith("committing")
            assert read_line(proc) == "committed"
            assert proc.wait(timeout=30) == 0
        finally:
            proc.kill()
            proc.wait()
        assert waited > 0.3
        # The read came after the other writer's commit, so the count saw its run.
        assert {r.id for r in store.list_runs()} == {"r0", "held", "run-2"}


def test_read_only_open_in_a_directory_it_cannot_write(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    path = str(folder / "a.db")
    with open_store(path) as store:
        fill(store, runs=2, events=1)
    assert sorted(os.listdir(folder)) == ["a.db"]  # a clean close leaves no -wal or -shm
    os.chmod(folder, 0o500)
    try:
        proc = worker("read-unwritable", path)
        out = finish(proc).splitlines()
    finally:
        os.chmod(folder, 0o700)
    assert out[0] == "directory unwritable", out  # the test means what it says
    assert out[1:] == ['runs ["r0", "r1"]', 'files ["a.db"]']


def test_read_only_opener_leaves_the_file_alone_while_another_process_writes(tmp_path):
    path = str(tmp_path / "both.db")
    with open_store(path) as store, store.tx() as tx:
        insert_run(tx, "r")
        tx.append("r", "", T0, "run.created", {})
    proc = worker("writer", path)
    try:
        assert read_line(proc) == "ready 5"
        mode = os.stat(path).st_mode
        with open_existing(path) as reader:
            reader.list_events_after("", 0, 100)
        assert os.stat(path).st_mode == mode
        proc.stdin.close()
        assert read_line(proc) == "bye"
    finally:
        proc.kill()
        proc.wait()


FORKING_PROGRAM = r"""
import os, sys, threading, time
sys.path.insert(0, sys.argv[2])
from _driver_kit import call, limits, make
from agentrt.driver import FuncTool, ToolResult
from agentrt.records import Decision
from agentrt.store import ForkedStoreError, open_store

store = open_store(sys.argv[1])
forked = threading.Event()

def fork_mid_run(c):
    # The run is live: its lease is held and renewed by the heartbeat thread.
    pid = os.fork()
    if pid == 0:
        said = []
        for use in (store.list_runs, lambda: store.tx().__enter__(), store.db,
                    lambda: store.get_run("r")):
            try:
                use()
                said.append("used")
            except ForkedStoreError as exc:
                said.append(str(exc))
        store.close()  # returns, though the fork may have left its lock held
        again = open_store(sys.argv[1])
        said.append(again.get_run("r").status)
        again.close()
        print("\n".join(said), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    return ToolResult(b"{}", "forked")

d, _, _, _ = make(store=store, script=[call("fork"), Decision.complete()],
                  tools=[FuncTool("fork", fork_mid_run, side_effect="read_only", timeout=30)])
print(d.start("g", limits(), run_id="r").status, flush=True)
"""


def test_a_store_used_in_a_forked_child_is_refused_and_the_parent_goes_on(tmp_path):
    """A connection carried across a fork believes it holds file locks that
    stayed with the parent; it was used as if nothing happened."""
    from eventdb import REPO_ROOT, child_process

    path = str(tmp_path / "runs.db")
    with child_process([sys.executable, "-c", FORKING_PROGRAM, path,
                        os.path.join(REPO_ROOT, "tests")]) as proc:
        out, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (0, b""), err
    lines = out.decode().splitlines()
    refusal = (f"agentrt: the store was opened before this process forked: {path} (opened in "
               f"process {proc.pid}); an SQLite connection must not cross a fork, as its file "
               "locks stay with that process: open the store again in this process")
    assert lines == [refusal] * 4 + ["RUNNING", "COMPLETED"]
    with open_existing(path) as store:
        assert store.verify_events(0, 0).broken is None

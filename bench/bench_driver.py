"""Driver step cost against its reference, measured in one process on the same disk.

A step of a scripted agent with a trivial tool makes four synced transactions
(start, decision, policy with tool start, outcome), so its reference is four
synced single-row commits on the same disk. The bar is 1.3x. The second and
third rows check that a step costs the same with 100 or 400 steps behind it
as with 10 (within 20%). A fourth row, without a bar, replays the step's own
SQL bare (``StepSQL``): what the four transactions cost on this disk with this
schema and none of the runtime's Python, so the first row's gap splits into
what the schema costs and what the interpreter does.

This machine is shared and its speed drifts by 2x within a minute, so nothing
is compared across time: three runs are first brought to 10, 100 and 400
steps, then stepped in turn, a few steps each, round after round (each burst
ends on a tool that needs approval; the bench approves and resumes). The
agent itself takes a reference sample between steps. A step's cost is the
time from the agent's return to its next call, which covers exactly one
step's four transactions, the policy and the tool.

    python -m bench.bench_driver [--quick] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import time
from typing import cast

import apsw

from agentrt.driver import (
    DefaultPolicy,
    Driver,
    FuncTool,
    StepInput,
    ToolCall,
    ToolResult,
    approve,
)
from agentrt.records import Decision, Limits
from agentrt.store import Store, open_store
from bench.common import Bar, Figure, log, print_table, scratch_dir

DEPTHS = (10, 100, 400)


def settle_wal(conn: apsw.Connection) -> None:
    """Write past the WAL's first checkpoint, unsynced, so that the commits
    measured next overwrite a WAL file of settled size, as the driver's store
    does after its set-up steps. A new WAL grows with every commit, and on
    ext4 its fdatasync then also commits the file's new size: measured by a
    review of this benchmark at about twice the time of a commit into a
    settled WAL (1,075 against 552 µs), which made the reference slow and the
    step's ratio look better than it is."""
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("CREATE TABLE IF NOT EXISTS wal_filler (v BLOB)")
    for _ in range(1100):  # more frames than the 1,000-page auto-checkpoint
        conn.execute("INSERT INTO wal_filler (v) VALUES (zeroblob(16))")
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    conn.execute("PRAGMA synchronous=FULL")


class Reference:
    """Four synced single-row commits on the same disk, with the store's own
    pragmas, into a WAL of settled size (see :func:`settle_wal`)."""

    def __init__(self, directory: str) -> None:
        self.conn = apsw.Connection(os.path.join(directory, "reference.db"))
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        settle_wal(self.conn)
        self.samples: list[float] = []

    def sample(self) -> None:
        started = time.perf_counter()
        for _ in range(4):
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute("INSERT INTO t (v) VALUES (?)", ("x" * 64,))
            self.conn.execute("COMMIT")
        self.samples.append(time.perf_counter() - started)


class StepSQL:
    """One ordinary step's statements, captured from a real driver, replayed
    bare in their synced transactions, with the same pragmas.

    The replay renews what must change (the new step's id and index, each
    event's seq, the run's step count) and keeps everything else as the
    driver wrote it, payloads and hashes included. Each replay updates the
    step the previous one inserted, so every UPDATE writes a row as the
    driver's do.
    """

    def __init__(self, directory: str) -> None:
        path = os.path.join(directory, "replay.db")
        self.statements, step_id, next_id, owner = _capture_step(path)
        self.conn = apsw.Connection(path)
        self.conn.execute("PRAGMA journal_mode=WAL")
        settle_wal(self.conn)
        # The tool start's step write requires the lease expiry the driver read.
        expires = next((b[-1] for sql, b in self.statements
                        if b and sql.startswith("UPDATE steps") and "lease_expires_at = ?" in sql),
                       "")
        self.conn.execute("UPDATE runs SET status = 'RUNNING', lease_owner = ?, "
                          "lease_expires_at = ? WHERE id = 'r'", (owner, expires))
        head, count = self.conn.execute(
            "SELECT (SELECT max(seq) FROM events), step_count FROM runs WHERE id = 'r'"
        ).fetchall()[0]
        self.seq, self.count = int(cast(int, head)), int(cast(int, count))
        self.ids = {step_id: step_id, next_id: next_id}
        self.step_id, self.next_id = step_id, next_id
        self.samples: list[float] = []
        self._replay(record=False)  # the step the first measured replay updates

    def _replay(self, record: bool = True) -> None:
        current, new = self.ids[self.next_id], secrets.token_hex(16)
        started = time.perf_counter()
        for sql, bindings in self.statements:
            if bindings is None:
                self.conn.execute(sql)
                continue
            b = [current if v == self.step_id else new if v == self.next_id else v
                 for v in bindings]
            if sql.startswith("INSERT INTO events"):
                self.seq += 1
                b[0] = self.seq
            elif sql.startswith("INSERT INTO steps"):
                b[2] = self.count
            elif "step_count = step_count + 1" in sql:
                b[1] = self.count
            self.conn.execute(sql, b)
            if record and sql.startswith("UPDATE") and self.conn.changes() != 1:
                raise RuntimeError(f"replayed step: {sql[:40]}... changed no row")
        if record:
            self.samples.append(time.perf_counter() - started)
        self.count += 1
        self.ids[self.next_id] = new

    def sample(self) -> None:
        self._replay()


def _capture_step(path: str) -> tuple[list[tuple[str, tuple[object, ...] | None]], str, str,
                                      str]:
    """(statements of step 2 of a short run, that step's id, the next step's id,
    the lease owner), traced from a driver."""
    log: list[tuple[str, tuple[object, ...] | None]] = []
    marks: list[int] = []

    class Agent:
        def decide(self, step: StepInput) -> Decision:
            marks.append(len(log))
            if step.index >= 3:
                return Decision.tool_call("hold", b"{}")
            return Decision.tool_call("noop", b'{"n":%d}' % step.index)

    def trace(_cursor: apsw.Cursor, sql: str, bindings: object) -> bool:
        log.append((sql, tuple(bindings) if isinstance(bindings, tuple | list) else None))
        return True

    store = open_store(path)
    store.db().exec_trace = trace
    tools = [FuncTool("noop", _noop, input_schema=b'{"type":"object"}', side_effect="read_only",
                      timeout=5),
             FuncTool("hold", _noop, side_effect="remote_mutation", timeout=5)]
    driver = Driver(store, Agent(), DefaultPolicy(), tools)
    driver.start("bench", Limits(max_steps=10, max_consecutive_tool_failures=3,
                                 loop_threshold=10), run_id="r")
    store.db().exec_trace = None
    steps = store.list_steps("r")
    owner = next(b[-1] for sql, b in log[marks[2]:marks[3]]
                 if b and "step_count = step_count + 1" in sql)
    store.close()
    return log[marks[2]:marks[3]], steps[2].id, steps[3].id, str(owner)


class _Bursts:
    """Calls ``noop`` until the run's current stop, then ``hold`` (which pauses it).

    Records, per run, the gap before each call that follows a ``noop`` call of
    the same burst: one ordinary step's cost.
    """

    def __init__(self, ref: Reference, bare: StepSQL | None = None) -> None:
        self.ref = ref
        self.bare = bare
        self.stop: dict[str, int] = {}
        self.gaps: dict[str, list[float]] = {}
        self.measuring = False
        self._out = 0.0
        self._last: tuple[str, int] | None = None

    def decide(self, step: StepInput) -> Decision:
        now = time.perf_counter()
        run_id, index = step.run.id, step.index
        if self.measuring and self._last == (run_id, index - 1):
            self.gaps.setdefault(run_id, []).append(now - self._out)
        if self.measuring and index % 2 == 0:
            self.ref.sample()
            if self.bare is not None:
                self.bare.sample()
        if index >= self.stop[run_id]:
            decision = Decision.tool_call("hold", b"{}")
            self._last = None
        else:
            decision = Decision.tool_call("noop", b'{"n":%d}' % index)
            self._last = (run_id, index)
        self._out = time.perf_counter()
        return decision


def _noop(call: ToolCall) -> ToolResult:
    return ToolResult(b'{"ok":true}', "ok")


def _continue(store: Store, driver: Driver, run_id: str) -> None:
    for a in store.list_approvals(run_id):
        if a.status == "pending":
            approve(store, run_id, a.id, "bench")
    run = driver.resume(run_id)
    if run.status != "WAITING_FOR_APPROVAL":
        raise SystemExit(f"bench run ended {run.status} ({run.reason}): {run.reason_detail}")


def measure(directory: str, rounds: int, burst: int
            ) -> tuple[list[float], list[float], dict[int, list[float]]]:
    """(reference samples, bare step SQL samples, step costs by depth)."""
    ref = Reference(directory)
    bare = StepSQL(directory)
    store = open_store(os.path.join(directory, "driver.db"))
    agent = _Bursts(ref, bare)
    tools = [
        FuncTool("noop", _noop, input_schema=b'{"type":"object"}', side_effect="read_only",
                 timeout=5),
        FuncTool("hold", _noop, side_effect="remote_mutation", timeout=5),
    ]
    driver = Driver(store, agent, DefaultPolicy(), tools)
    big = DEPTHS[-1] + rounds * (burst + 1) + 10
    limits = Limits(max_steps=big, max_consecutive_tool_failures=3, loop_threshold=big)
    runs: dict[int, str] = {}
    for depth in DEPTHS:
        run_id = f"depth-{depth}"
        agent.stop[run_id] = depth
        driver.start("bench", limits, run_id=run_id)
        runs[depth] = run_id
    agent.measuring = True
    for _ in range(rounds):
        for run_id in runs.values():
            agent.stop[run_id] = store.get_run(run_id).step_count + burst
            _continue(store, driver, run_id)
    store.close()
    return ref.samples, bare.samples, {d: agent.gaps.get(r, []) for d, r in runs.items()}


def run(quick: bool, directory: str | None = None) -> list[Figure]:
    """The bench's figures (the contract in ``bench/__init__.py``)."""
    rounds, burst = (8, 6) if quick else (30, 6)
    work = tempfile.mkdtemp(prefix="bench-driver-", dir=directory or scratch_dir())
    log(f"driver: {rounds} rounds of {burst}-step bursts on runs at "
        f"{'/'.join(map(str, DEPTHS))} steps")
    try:
        ref, bare, by_depth = measure(work, rounds, burst)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    us = 1e6
    steps = [g * us for gaps in by_depth.values() for g in gaps]
    base = [g * us for g in by_depth[DEPTHS[0]]]
    figures = [Figure(
        bench="driver",
        what="driver step (scripted agent, trivial tool)",
        unit="us",
        values=steps,
        reference="4 synced single-row commits",
        refs=[r * us for r in ref],
        bar=Bar("<=", 1.3),
    )]
    figures.append(Figure(
        bench="driver",
        what="the step's own SQL replayed bare (no bar)",
        unit="us",
        values=[b * us for b in bare],
        reference="4 synced single-row commits",
        refs=[r * us for r in ref],
        bar=None,
        note="the schema's and the disk's share of a step; the rest of the first row is Python",
    ))
    for depth in DEPTHS[1:]:
        figures.append(Figure(
            bench="driver",
            what=f"step after {depth} steps",
            unit="us",
            values=[g * us for g in by_depth[depth]],
            reference=f"step after {DEPTHS[0]} steps",
            refs=base,
            bar=Bar("<=", 1.2),
        ))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_driver")
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--dir", default=None,
                        help="where to put the databases (default: bench/out)")
    args = parser.parse_args(argv)
    figures = run(args.quick, args.dir)
    print_table(figures)
    return 0 if all(f.ok for f in figures) else 1


if __name__ == "__main__":
    sys.exit(main())

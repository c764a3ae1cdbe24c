"""Driver step cost against its reference, in one run on the same disk.

A step of a scripted agent with a trivial tool makes four synced transactions
(start, decision, policy with tool start, outcome), so its reference is four
synced single-row commits on the same disk, sampled by the agent itself
between steps, so both are measured under the same load (this machine is
shared; wall times drift by 2x within a minute). The bar is 1.3x. The second
and third rows check that a step costs the same with 100 or 400 steps behind
it as with 10 (within 20%); they compare process CPU time per step, which
measures the work a step does rather than the other processes on the host.

    python -m bench.bench_driver [--quick] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

import apsw

from agentrt.driver import DefaultPolicy, Driver, FuncTool, StepInput, ToolCall, ToolResult
from agentrt.records import Decision, Limits
from agentrt.store import open_store

WINDOWS = (10, 100, 400)
WINDOW = 30


class Reference:
    """Four synced single-row commits on the same disk, with the store's own pragmas."""

    def __init__(self, directory: str) -> None:
        self.conn = apsw.Connection(os.path.join(directory, "reference.db"))
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        self.samples: list[float] = []

    def sample(self) -> None:
        started = time.perf_counter()
        for _ in range(4):
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute("INSERT INTO t (v) VALUES (?)", ("x" * 64,))
            self.conn.execute("COMMIT")
        self.samples.append(time.perf_counter() - started)


class _Timed:
    """A scripted agent that measures the driver between its own calls.

    A step's cost is the time from the agent's previous return to its next
    call: everything the driver does for one step (four transactions, the
    policy, the tool). Every other step the agent also takes a reference
    sample, outside that window, so the reference runs under the same
    conditions as the steps it is compared with.
    """

    def __init__(self, steps: int, ref: Reference | None) -> None:
        self.steps = steps
        self.ref = ref
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self._out = (0.0, 0.0)

    def decide(self, step: StepInput) -> Decision:
        wall, cpu = time.perf_counter(), time.process_time()
        if step.index:
            self.wall.append(wall - self._out[0])
            self.cpu.append(cpu - self._out[1])
        if self.ref is not None and step.index % 2 == 0:
            self.ref.sample()
        decision = (Decision.complete(b'{"done":true}') if step.index >= self.steps
                    else Decision.tool_call("noop", b'{"n":%d}' % step.index))
        self._out = (time.perf_counter(), time.process_time())
        return decision


def _noop(call: ToolCall) -> ToolResult:
    return ToolResult(b'{"ok":true}', "ok")


def driver_steps(directory: str, steps: int, round_: int,
                 ref: Reference | None) -> tuple[list[float], list[float]]:
    """(wall, cpu) seconds per step of one run of ``steps`` tool steps; entry i is the
    step after i+1 earlier steps."""
    store = open_store(os.path.join(directory, f"driver-{round_}.db"))
    agent = _Timed(steps, ref)
    tool = FuncTool("noop", _noop, input_schema=b'{"type":"object"}', side_effect="read_only",
                    timeout=5)
    driver = Driver(store, agent, DefaultPolicy(), [tool])
    limits = Limits(max_steps=steps + 10, max_consecutive_tool_failures=3,
                    loop_threshold=steps + 10)
    run = driver.start("bench", limits)
    store.close()
    if run.status != "COMPLETED":
        raise SystemExit(f"bench run ended {run.status} ({run.reason}): {run.reason_detail}")
    return agent.wall, agent.cpu


def _spread(values: Sequence[float]) -> str:
    q = statistics.quantiles(values, n=4)
    return f"p25-p75 {q[0] * 1e6:.0f}-{q[2] * 1e6:.0f} us"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_driver")
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--dir", default=None,
                        help="where to put the databases (default: a temp dir here)")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else 5
    steps = WINDOWS[-1] + WINDOW + 5
    directory = tempfile.mkdtemp(prefix="bench-driver-", dir=args.dir or os.getcwd())
    try:
        ref = Reference(directory)
        per_window: dict[int, list[float]] = {w: [] for w in WINDOWS}
        all_steps: list[float] = []
        for r in range(rounds):
            wall, cpu = driver_steps(directory, steps, r, ref)
            for w in WINDOWS:
                per_window[w] += cpu[w - 1:w - 1 + WINDOW]
            all_steps += wall[WINDOWS[0]:]
        ref_samples = ref.samples
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    ref_med = statistics.median(ref_samples)
    step_med = statistics.median(all_steps)
    base = statistics.median(per_window[WINDOWS[0]])
    rows = [("driver step (scripted agent, trivial tool)", "4 synced single-row commits",
             step_med / ref_med, 1.3, step_med, ref_med, _spread(all_steps))]
    for w in WINDOWS[1:]:
        med = statistics.median(per_window[w])
        rows.append((f"step CPU after {w} steps", f"step CPU after {WINDOWS[0]} steps",
                     med / base, 1.2, med, base, _spread(per_window[w])))
    print(f"driver bench: {rounds} round(s), {len(ref_samples)} reference samples, "
          f"{len(all_steps)} steps, disk of {directory}")
    header = ("figure", "reference", "ratio", "bar", "median", "spread", "")
    print(f"{header[0]:<44} {header[1]:<30} {header[2]:>6} {header[3]:>7}  "
          f"{header[4]:<22} {header[5]}")
    missed = 0
    for figure, refname, ratio, bar, med, refmed, spread in rows:
        ok = ratio <= bar
        missed += not ok
        print(f"{figure:<44} {refname:<30} {ratio:>5.2f}x {'<=' + f'{bar:.1f}x':>7}  "
              f"{med * 1e6:>6.0f} vs {refmed * 1e6:>5.0f} us   {spread}"
              f"  {'ok' if ok else 'MISSED'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

"""``agentrt runs --limit 50`` on 100,000 runs against the same on 1,000 runs.

The command reads a page, not the table, so a database a hundred times larger
should cost it about the same: the bar is 2x. Both databases are built with
SQL in one transaction (a tenth of the runs waiting on a pending approval, so
the page's pending lookup has work to do), and the two sizes are measured in
alternating order within each round, so drift on this shared machine falls on
both alike. The command runs in this process (its import and interpreter start
would hide a table scan), with stdout sent to /dev/null; a second row times
the whole process as an operator starts it. The bar is held by the CPU time
this process spends (SQLite's reads included, as system time): on a shared
host the wall times of a 5 ms command move by 2x from one second to the next,
and the wall rows are printed to show it.

    python -m bench.bench_cli [--quick] [--dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TypeVar

from agentrt.cli import cli
from agentrt.clitools import run_click
from agentrt.store import open_store
from bench import common

SMALL, LARGE = 1_000, 100_000
ARGS = ["runs", "--limit", "50"]
BAR = 2.0
T = TypeVar("T")


def make_db(path: str, runs: int) -> None:
    """``runs`` runs, newest first as the page reads them; every tenth waits on a
    pending approval."""
    store = open_store(path)
    try:
        with store.tx() as tx:
            tx.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
                "INSERT INTO runs (id, goal, status, reason, limits_json, step_count, "
                "created_at, started_at, finished_at) SELECT "
                "lower(hex(randomblob(16))), 'triage the failing build number ' || i || "
                "' and open a pull request with the fix', "
                "CASE WHEN i % 10 = 0 THEN 'WAITING_FOR_APPROVAL' WHEN i % 7 = 0 THEN 'FAILED' "
                "ELSE 'COMPLETED' END, "
                "CASE WHEN i % 10 = 0 THEN '' WHEN i % 7 = 0 THEN 'limit_steps' "
                "ELSE 'goal_completed' END, "
                "'{\"max_steps\":50,\"max_consecutive_tool_failures\":3,\"loop_threshold\":3}', "
                "i % 13, '2026-10-01T09:00:00Z', '2026-10-01T09:00:00Z', "
                "CASE WHEN i % 10 = 0 THEN '' ELSE '2026-10-01T09:05:00.25Z' END FROM n",
                (runs,),
            )
            tx.execute(
                "INSERT INTO approvals (id, run_id, step_id, kind, capability_json, "
                "presentation_json, request_json, hash, status, created_at) "
                "SELECT lower(hex(randomblob(16))), id, lower(hex(randomblob(16))), "
                "'remote_mutation', '{}', '{}', '{}', '', 'pending', created_at "
                "FROM runs WHERE status = 'WAITING_FOR_APPROVAL'"
            )
    finally:
        store.close()


def in_process(path: str) -> tuple[float, float]:
    """(wall, CPU) seconds for one ``agentrt runs --limit 50``, output to /dev/null."""
    with open(os.devnull, "wb") as sink:
        out = io.TextIOWrapper(sink, write_through=True)
        with contextlib.redirect_stdout(out):
            wall, cpu = time.perf_counter(), time.process_time()
            code = run_click(cli, "agentrt", ["--db", path, *ARGS])
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        out.detach()
    if code != 0:
        raise SystemExit(f"agentrt runs failed on {path} with exit {code}")
    return wall, cpu


def whole_process(path: str) -> float:
    """Seconds for ``python -m agentrt.cli runs --limit 50`` from start to exit."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "agentrt.cli", "--db", path, *ARGS], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def measure(fn: Callable[[str], T], small: str, large: str, rounds: int) -> tuple[
        list[T], list[T]]:
    """Alternate the two sizes, starting with each in turn, after one warm-up each."""
    fn(small)
    fn(large)
    s: list[T] = []
    big: list[T] = []
    for r in range(rounds):
        if r % 2:
            big.append(fn(large))
            s.append(fn(small))
        else:
            s.append(fn(small))
            big.append(fn(large))
    return s, big


def _spread(values: list[float]) -> str:
    if len(values) < 4:
        return f"min-max {min(values) * 1e3:.1f}-{max(values) * 1e3:.1f} ms"
    q = statistics.quantiles(values, n=4)
    return f"p25-p75 {q[0] * 1e3:.1f}-{q[2] * 1e3:.1f} ms"


def measure_all(rounds: int, process_rounds: int, base: str) -> list[
        tuple[str, int, list[float], list[float]]]:
    """(figure, rounds, times on the small database, on the large one) per row."""
    directory = tempfile.mkdtemp(prefix="bench-cli-", dir=base)
    try:
        small, large = os.path.join(directory, "small.db"), os.path.join(directory, "large.db")
        make_db(small, SMALL)
        make_db(large, LARGE)
        small_in, large_in = measure(in_process, small, large, rounds)
        small_proc, large_proc = measure(whole_process, small, large, process_rounds)
        results = [
            ("agentrt runs --limit 50, in process, CPU", rounds,
             [c for _, c in small_in], [c for _, c in large_in]),
            ("agentrt runs --limit 50, in process, wall", rounds,
             [w for w, _ in small_in], [w for w, _ in large_in]),
            ("agentrt runs --limit 50, whole process, wall", process_rounds,
             small_proc, large_proc),
        ]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_cli")
    parser.add_argument("--quick", action="store_true", help="a few rounds only")
    parser.add_argument("--dir", default=None,
                        help="where to put the databases (default: a temp dir here)")
    args = parser.parse_args(argv)
    rounds, process_rounds = (6, 3) if args.quick else (40, 10)
    results = measure_all(rounds, process_rounds, args.dir or os.getcwd())
    print(f"cli bench: {LARGE:,} runs against {SMALL:,} runs, rounds alternating sizes; "
          "the bar holds the CPU row (this process's work, not the host's other load)")
    print(f"{'figure':<58} {'reference':<12} {'ratio':>6} {'bar':>6}  {'median':<22} spread")
    missed = 0
    for figure, n, small_t, large_t in results:
        med_large, med_small = statistics.median(large_t), statistics.median(small_t)
        ratio = med_large / med_small
        ok = ratio <= BAR
        if "CPU" in figure:
            missed += not ok
        print(f"{figure + f' ({n} rounds)':<58} {f'{SMALL:,} runs':<12} {ratio:>5.2f}x "
              f"{'<=' + f'{BAR:.0f}x':>6}  {med_large * 1e3:>6.1f} vs {med_small * 1e3:>5.1f} ms  "
              f"{_spread(large_t)}  {'ok' if ok else 'MISSED'}")
    return 1 if missed else 0


def run(quick: bool) -> list[common.Figure]:
    """The figures for ``python -m bench`` (the contract in ``bench/__init__.py``):
    the CPU row holds the bar, the wall rows are shown beside it."""
    rounds, process_rounds = (6, 3) if quick else (40, 10)
    figures = []
    for figure, _, small_t, large_t in measure_all(rounds, process_rounds,
                                                   common.scratch_dir()):
        figures.append(common.Figure(
            bench="cli",
            what=figure.replace("agentrt runs --limit 50", f"agentrt runs, {LARGE:,} runs"),
            unit="ms",
            values=[t * 1e3 for t in large_t],
            reference=f"same, {SMALL:,} runs",
            refs=[t * 1e3 for t in small_t],
            bar=common.Bar("<=", BAR) if "CPU" in figure else None,
        ))
    return figures


if __name__ == "__main__":
    sys.exit(main())

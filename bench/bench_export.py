"""JSONL export against ``sqlite3 -json`` on the same file, both as processes.

``agentrt-export jsonl --db FILE > /dev/null`` (the console script's entry
point, run as ``python -m agentrt_export.cli`` so the checkout's code is what
runs) against ``sqlite3 -json FILE "SELECT <the six columns> FROM events
ORDER BY seq" > /dev/null``: rows per second over the whole table, process
start included on both sides. The two alternate within each round. Bar: at
least 1.0x the reference's rows/s (DESIGN.md), by each process's CPU time
(user + system): both are single-threaded and CPU-bound, and CPU time does not
count the moments another process on this shared host had the core. The wall
rates are shown beside.

    python -m bench.bench_export [--quick]
"""

from __future__ import annotations

import shutil
import sys

from bench.common import Bar, Figure, child_env, event_db, log, main, paired_rounds, run_measured

SQLITE3 = shutil.which("sqlite3") or "/usr/bin/sqlite3"
QUERY = "SELECT seq, run_id, step_id, at, type, payload_json FROM events ORDER BY seq"


def run(quick: bool) -> list[Figure]:
    n, rounds = (100_000, 3) if quick else (1_000_000, 3)
    db = event_db(n)
    env = child_env()
    export = [sys.executable, "-m", "agentrt_export.cli", "jsonl", "--db", db]
    wall: dict[str, list[float]] = {"export": [], "sqlite3": []}

    def measured() -> float:
        done = run_measured(export, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"agentrt-export jsonl exited {done.returncode}")
        wall["export"].append(n / done.seconds)
        return n / done.cpu_seconds

    def reference() -> float:
        done = run_measured([SQLITE3, "-json", db, QUERY])
        if done.returncode != 0:
            raise RuntimeError(f"sqlite3 exited {done.returncode}")
        wall["sqlite3"].append(n / done.seconds)
        return n / done.cpu_seconds

    log(f"export: {rounds} rounds of agentrt-export jsonl and sqlite3 -json over {n:,} events")
    values, refs = paired_rounds(rounds, measured, reference)
    what = f"agentrt-export jsonl, {n // 1000:,}k events to /dev/null"
    return [
        Figure(bench="export", what=what + ", CPU", unit="rows/s", values=values,
               reference="sqlite3 -json, same file", refs=refs, bar=Bar(">=", 1.0)),
        Figure(bench="export", what=what + ", wall", unit="rows/s", values=wall["export"],
               reference="sqlite3 -json, same file", refs=wall["sqlite3"], bar=None),
    ]


if __name__ == "__main__":
    sys.exit(main(run))

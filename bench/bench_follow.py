"""Live follow: commit-to-sink latency and idle CPU of ``agentrt-export jsonl --follow``.

Three processes: a writer appending events through the store's own
transaction helper (``Store.tx`` + ``Tx.append``, synced commits, one event per
transaction), the exporter as users run it (``agentrt-export jsonl --follow``,
default options), and this harness reading the exporter's stdout. The writer
notes ``time.monotonic()`` when each COMMIT has returned; the harness notes it
when the event's line arrives. ``CLOCK_MONOTONIC`` is one clock for every
process on the machine, so their difference is the latency from commit to
sink, pipe included.

Two writing phases: busy (a commit every 5-15 ms) and sparse (every
200-400 ms, so the follower has gone back to sleeping on inotify before each
commit). Bar: p99 over both <= 10 ms. The reference column is the writer's own
transaction time (BEGIN IMMEDIATE to COMMIT returned, fsync included): what a
commit costs on this disk at that moment.

Idle: once caught up and nothing is written, the exporter's CPU time (from
``/proc/<pid>/stat``) over a 10 s window. Bar: <= 1% of a core. The reference
is a Python process polling ``PRAGMA data_version`` every 5 ms during the same
window (what DESIGN.md decision 7 says polling would cost).

    python -m bench.bench_follow [--quick]
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

from bench.common import REPO_ROOT, Bar, Figure, child_env, log, main, scratch_dir

RUN_ID = "follow-bench"


def writer_main(db: str, phases: list[tuple[int, float, float]]) -> None:
    """Append one event per transaction; print ``seq before after`` per commit."""
    from agentrt.store import open_store

    store = open_store(db)
    rng = random.Random(7)
    out = []
    for count, low, high in phases:
        for _ in range(count):
            time.sleep(rng.uniform(low, high))
            before = time.monotonic()
            with store.tx() as tx:
                event = tx.append(RUN_ID, "", datetime.now(UTC), "step.decided",
                                  b'{"kind":"tool_call","tool":"read_file"}')
            out.append(f"{event.seq} {before} {time.monotonic()}")
    store.close()
    print("\n".join(out), flush=True)


def poller_main(db: str) -> None:
    """The reference for idle CPU: check ``PRAGMA data_version`` every 5 ms, forever."""
    from agentrt.store import open_existing

    store = open_existing(db)
    while True:
        store.data_version()
        time.sleep(0.005)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _setup(db: str) -> None:
    from agentrt.store import open_store

    store = open_store(db)
    with store.tx() as tx:
        tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) "
                   "VALUES (?, 'follow bench', 'RUNNING', '{}', '2026-10-01T09:00:00Z')",
                   (RUN_ID,))
        tx.append(RUN_ID, "", datetime.now(UTC), "run.created", b"{}")
    store.close()


def run(quick: bool) -> list[Figure]:
    busy, sparse, idle = (150, 8, 3.0) if quick else (1000, 40, 10.0)
    db = os.path.join(scratch_dir(), "follow.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    _setup(db)
    env = child_env()
    seen: dict[int, float] = {}
    exporter = subprocess.Popen(
        [sys.executable, "-m", "agentrt_export.cli", "jsonl", "--db", db, "--follow"],
        stdout=subprocess.PIPE, env=env, cwd=REPO_ROOT)

    def read() -> None:
        assert exporter.stdout is not None
        for line in exporter.stdout:
            now = time.monotonic()
            seen[int(line[7:line.index(b",")])] = now

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 30
        while 1 not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
        log(f"follow: {busy} commits 5-15 ms apart, then {sparse} commits 200-400 ms apart")
        phases = f"{busy}:0.005:0.015,{sparse}:0.2:0.4"
        out = subprocess.run([sys.executable, "-m", "bench.bench_follow", "--writer", db, phases],
                             env=env, cwd=REPO_ROOT, check=True, capture_output=True,
                             text=True).stdout
        commits = [line.split() for line in out.splitlines()]
        last = int(commits[-1][0])
        deadline = time.monotonic() + 10
        while last not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
        latencies = [(seen[int(s)] - float(after)) * 1000 for s, _, after in commits
                     if int(s) in seen]
        missing = len(commits) - len(latencies)
        tx_times = [(float(after) - float(before)) * 1000 for _, before, after in commits]

        log(f"follow: idle CPU over {idle:.0f} s, beside a 5 ms data_version poller")
        poller = subprocess.Popen([sys.executable, "-m", "bench.bench_follow", "--poller", db],
                                  env=env, cwd=REPO_ROOT)
        try:
            time.sleep(1.0)
            cpu0, ref0, t0 = _cpu_seconds(exporter.pid), _cpu_seconds(poller.pid), time.monotonic()
            time.sleep(idle)
            cpu1, ref1, t1 = _cpu_seconds(exporter.pid), _cpu_seconds(poller.pid), time.monotonic()
        finally:
            poller.terminate()
            poller.wait(10)
    finally:
        exporter.terminate()
        exporter.wait(10)
    if missing:
        raise RuntimeError(f"{missing} committed events never reached the sink")
    p99 = statistics.quantiles(latencies, n=100)[98]
    tx_p99 = statistics.quantiles(tx_times, n=100)[98]
    return [
        Figure(
            bench="follow",
            what=f"commit to sink p99, {len(latencies)} commits "
                 f"(p50 {statistics.median(latencies):.2f} ms, max {max(latencies):.1f} ms)",
            unit="ms",
            values=[p99],
            reference="writer's transaction p99",
            refs=[tx_p99],
            bar=Bar("<=", 10, on="value"),
        ),
        Figure(
            bench="follow",
            what=f"idle CPU, caught up, {t1 - t0:.0f} s window",
            unit="%",
            values=[(cpu1 - cpu0) / (t1 - t0) * 100],
            reference="5 ms data_version poll",
            refs=[(ref1 - ref0) / (t1 - t0) * 100],
            bar=Bar("<=", 1, on="value"),
        ),
    ]


def _phases(text: str) -> list[tuple[int, float, float]]:
    out = []
    for part in text.split(","):
        count, low, high = part.split(":")
        out.append((int(count), float(low), float(high)))
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--writer":
        writer_main(sys.argv[2], _phases(sys.argv[3]))
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--poller":
        poller_main(sys.argv[2])
    sys.exit(main(run))

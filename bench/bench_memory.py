"""Follower memory: peak RSS of ``agentrt-export jsonl`` over 1M events and over 16 MB rows.

Each export runs as its own process to /dev/null; its peak RSS is the
kernel's ``ru_maxrss`` from ``wait4``. The 16 MB rows are JSON payloads
spread through a table of ordinary events: the capped page read hands each
over as the truncation object (64 Ki characters of head), so what a big row
costs is SQLite reading it, not Python holding it. The reference is the same
command over 10,000 events (interpreter, imports, one page): what the
follower adds on top of starting up. Bar: <= 80 MB (DESIGN.md).

    python -m bench.bench_memory [--quick]
"""

from __future__ import annotations

import sys

from bench.common import Bar, Figure, child_env, event_db, log, main, run_measured


def _peak_rss(db: str) -> float:
    done = run_measured([sys.executable, "-m", "agentrt_export.cli", "jsonl", "--db", db],
                        env=child_env())
    if done.returncode != 0:
        raise RuntimeError(f"agentrt-export jsonl exited {done.returncode}")
    return done.peak_rss_mb


def run(quick: bool) -> list[Figure]:
    n, rounds = (100_000, 2) if quick else (1_000_000, 2)
    big_rows = 4 if quick else 8
    small = event_db(10_000)
    many = event_db(n)
    big = event_db(20_000, big_rows=big_rows)
    log(f"memory: peak RSS of agentrt-export jsonl over {n:,} events and over "
        f"{big_rows} rows of 16 MB")
    ref, values_many, values_big = [], [], []
    for _ in range(rounds):
        ref.append(_peak_rss(small))
        values_many.append(_peak_rss(many))
        values_big.append(_peak_rss(big))
    return [
        Figure(
            bench="memory",
            what=f"follower peak RSS, {n // 1000:,}k events",
            unit="MB",
            values=values_many,
            reference="same over 10k events",
            refs=ref,
            bar=Bar("<=", 80, on="value"),
        ),
        Figure(
            bench="memory",
            what=f"follower peak RSS, {big_rows} rows of 16 MB among 20k",
            unit="MB",
            values=values_big,
            reference="same over 10k events",
            refs=ref,
            bar=Bar("<=", 80, on="value"),
        ),
    ]


if __name__ == "__main__":
    sys.exit(main(run))

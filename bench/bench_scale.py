"""Cost per event as the table grows: the follower over 10k, 100k and 1M events.

In this process, a ``Follower`` (default page size, ``once``) hands every
event of the table to a ``JSONLSink`` writing to /dev/null; the figure is
microseconds of this process's CPU time per event over the whole table.
Process start-up is left out, so only what grows with the table could show.
The three sizes are exported in turn within each round (the order reversed
every other round); the 10k table is exported several times per round so its
time is not lost in the clock's noise. Bar: 100k and 1M within 20% of 10k
(DESIGN.md).

    python -m bench.bench_scale [--quick]
"""

from __future__ import annotations

import sys
import time

from bench.common import Bar, Figure, event_db, log, main


def per_event_us(db: str, n: int, repeat: int = 1) -> float:
    from agentrt.store import open_existing
    from agentrt_export import Follower, JSONLSink

    with open("/dev/null", "wb") as out, open_existing(db) as store:
        started = time.process_time()
        for _ in range(repeat):
            sink = JSONLSink(out)
            Follower(store, once=True).follow(sink)
        return (time.process_time() - started) / (n * repeat) * 1e6


def run(quick: bool) -> list[Figure]:
    sizes = (10_000, 100_000) if quick else (10_000, 100_000, 1_000_000)
    rounds = 3 if quick else 5
    dbs = {n: event_db(n) for n in sizes}
    log(f"scale: {rounds} rounds over {', '.join(f'{n:,}' for n in sizes)} events")
    costs: dict[int, list[float]] = {n: [] for n in sizes}
    for i in range(rounds):
        for n in sizes if i % 2 == 0 else reversed(sizes):
            costs[n].append(per_event_us(dbs[n], n, repeat=max(1, 50_000 // n)))
    base = sizes[0]
    return [
        Figure(
            bench="scale",
            what=f"follower cost per event, {n // 1000:,}k events",
            unit="us/event",
            values=costs[n],
            reference=f"same, {base // 1000:,}k events",
            refs=costs[base],
            bar=Bar("<=", 1.2),
        )
        for n in sizes[1:]
    ]


if __name__ == "__main__":
    sys.exit(main(run))

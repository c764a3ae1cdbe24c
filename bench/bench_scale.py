"""Cost per event as the table grows: the follower over 10k, 100k and 1M events.

In this process, a ``Follower`` (default page size, ``once``) hands every
event of the table to a ``JSONLSink`` writing to /dev/null; the figure is
microseconds of this process's CPU time per event over the whole table.
Process start-up is left out, so only what grows with the table could show.
The three sizes are exported in turn within each round (the order reversed
every other round); the 10k table is exported several times per round so its
time is not lost in the clock's noise, each time from a newly opened store so
that it does not keep SQLite's page cache warm where the larger tables cannot.
Bar: 100k and 1M within 20% of 10k (DESIGN.md). A last row, shown beside,
exports only the newest 10k events of the 1M table: what a live follower
reads as its table grows.

    python -m bench.bench_scale [--quick]
"""

from __future__ import annotations

import sys
import time

from bench.common import Bar, Figure, event_db, log, main


def per_event_us(db: str, repeat: int = 1, after: int = 0) -> float:
    """CPU microseconds per event of a follower exporting ``db`` after seq ``after``."""
    from agentrt.store import open_existing
    from agentrt_export import Follower, JSONLSink, MemoryCursor

    delivered = 0

    def count(seq: int, n: int) -> None:
        nonlocal delivered
        delivered += n

    with open("/dev/null", "wb") as out:
        started = time.process_time()
        for _ in range(repeat):  # a fresh store each time: no page cache carried over
            with open_existing(db) as store:
                Follower(store, cursor=MemoryCursor(after), once=True,
                         on_page=count).follow(JSONLSink(out))
        return (time.process_time() - started) / delivered * 1e6


def run(quick: bool) -> list[Figure]:
    sizes = (10_000, 100_000) if quick else (10_000, 100_000, 1_000_000)
    rounds = 3 if quick else 7
    small, large = sizes[0], sizes[-1]
    dbs = {n: event_db(n) for n in sizes}
    log(f"scale: {rounds} rounds over {', '.join(f'{n:,}' for n in sizes)} events")
    costs: dict[int, list[float]] = {n: [] for n in sizes}
    newest: list[float] = []
    for i in range(rounds):
        for n in sizes if i % 2 == 0 else reversed(sizes):
            costs[n].append(per_event_us(dbs[n], repeat=max(1, 50_000 // n)))
        newest.append(per_event_us(dbs[large], repeat=5, after=large - small))
    figures = [
        Figure(
            bench="scale",
            what=f"follower cost per event, {n // 1000:,}k events",
            unit="us/event",
            values=costs[n],
            reference=f"same, {small // 1000:,}k events",
            refs=costs[small],
            bar=Bar("<=", 1.2),
        )
        for n in sizes[1:]
    ]
    figures.append(Figure(
        bench="scale",
        what=f"follower cost per event, newest {small // 1000:,}k of {large // 1000:,}k",
        unit="us/event",
        values=newest,
        reference=f"same, {small // 1000:,}k events",
        refs=costs[small],
        bar=None,
        note="what a live follower reads: the end of a large table",
    ))
    return figures


if __name__ == "__main__":
    sys.exit(main(run))

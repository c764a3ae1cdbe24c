"""Store benchmarks: each figure is a ratio against a reference run in the same process.

    python -m bench.bench_store            # 1M events, 5 rounds
    python -m bench.bench_store --quick    # 100k events, 3 rounds

(a) Paging: ``Store.list_events_after`` over every event, page after page, against
    a bare apsw loop of ``SELECT seq, run_id, step_id, at, type, payload_json FROM
    events WHERE seq > ? ORDER BY seq LIMIT ?`` on the same file, pages of 500
    (the follower's default). Rows per second of this process's CPU time: the
    file sits in the page cache, so paging is CPU-bound, and CPU time does not
    count the moments another process on a shared machine had the core.
    Bar: at least 0.9x the reference.
(b) Appending: one transaction with one appended event (``with store.tx() as tx:
    tx.append(...)``), against a bare single-row insert in its own synced
    transaction (WAL, synchronous=FULL, BEGIN IMMEDIATE) in another file on the
    same disk. Time per commit; bar: at most 1.3x the reference. Two references:
    the same row inserted into a table of the events schema (AUTOINCREMENT and
    the events_run index, fixed by compatibility, so three pages per commit),
    which isolates the store's own cost (head read, hash, Python), and a row in
    a one-column table (one page per commit), which also shows the schema's.

Rounds alternate the sides so drift on a shared machine hits all of them; a
round's append figure is the median commit of that round (a WAL checkpoint
lands in one commit of a thousand). The table gives the median over rounds and
the spread (min-max) of each side, and the ratio of the medians. These are wall
times on a real disk: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import apsw

from agentrt import open_existing, open_store
from agentrt.timefmt import format_time
from bench import common

PAGE = 500  # the export follower's default page size
T0 = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)
TYPES = ("step.started", "step.decided", "step.policy", "step.tool_started",
         "step.tool_finished", "model.dispatched", "model.completed")


@dataclass
class Figure:
    name: str
    unit: str
    ours: list[float]
    reference: list[float]
    bar: float
    higher_is_better: bool

    @property
    def ratio(self) -> float:
        return statistics.median(self.ours) / statistics.median(self.reference)

    @property
    def passes(self) -> bool:
        return self.ratio >= self.bar if self.higher_is_better else self.ratio <= self.bar


def _netstring(data: bytes) -> bytes:
    return b"%d:%b," % (len(data), data)


def _rows(n: int, runs: int) -> Iterator[tuple[int, str, str, str, str, str, str]]:
    """n events over ``runs`` runs, each chained to the one before (spec 4.6)."""
    prev = b""
    for seq in range(1, n + 1):
        run_id = f"run-{seq % runs:05d}"
        step_id = f"step-{seq // 7:08d}" if seq % 7 else ""
        at = format_time(T0 + timedelta(microseconds=seq * 1500))
        type_ = TYPES[seq % len(TYPES)]
        payload = (f'{{"step_id":"{step_id}","index":{seq // 7},"tool":"search",'
                   f'"observation":{{"kind":"tool_result","content_hash":'
                   f'"{seq:064x}"}}}}')
        h = hashlib.sha256()
        for part in (prev, str(seq).encode(), run_id.encode(), step_id.encode(), at.encode(),
                     type_.encode(), payload.encode()):
            h.update(_netstring(part))
        digest = h.hexdigest()
        prev = digest.encode()
        yield seq, run_id, step_id, at, type_, payload, digest


def build_events(path: str, n: int, runs: int = 1000) -> float:
    """A store with ``n`` chained events over ``runs`` runs; seconds it took."""
    started = time.perf_counter()
    with open_store(path) as store:
        conn = store.db()
        conn.execute("PRAGMA synchronous=OFF")  # building a fixture, not measuring
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO runs (id, goal, status, limits_json, created_at) "
            "VALUES (?, 'bench', 'COMPLETED', '{}', '2026-10-01T09:00:00Z')",
            ((f"run-{r:05d}",) for r in range(runs)))
        conn.executemany(
            "INSERT INTO events (seq, run_id, step_id, at, type, payload_json, hash) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)", _rows(n, runs))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        check = store.verify_events(max(1, n - 999), 0)  # the chain is the runtime's
        if not check.intact or check.to_seq != n:
            raise SystemExit(f"generated chain does not verify: {check}")
    return time.perf_counter() - started


def page_ours(path: str) -> float:
    with open_existing(path) as store:
        started = time.process_time()
        seq, n = 0, 0
        while True:
            page = store.list_events_after("", seq, PAGE)
            if not page:
                break
            n += len(page)
            seq = page[-1].seq
        return n / (time.process_time() - started)


def page_reference(path: str) -> float:
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        started = time.process_time()
        seq, n = 0, 0
        while True:
            rows = conn.execute(
                "SELECT seq, run_id, step_id, at, type, payload_json FROM events "
                "WHERE seq > ? ORDER BY seq LIMIT ?", (seq, PAGE)).fetchall()
            if not rows:
                break
            n += len(rows)
            seq = cast(int, rows[-1][0])
        return n / (time.process_time() - started)
    finally:
        conn.close()


def append_ours(path: str, count: int) -> float:
    with open_store(path) as store:
        with store.tx() as tx:
            tx.execute("INSERT OR IGNORE INTO runs (id, goal, status, limits_json, "
                       "created_at) VALUES ('r', 'g', 'RUNNING', '{}', '')")
        times = []
        for i in range(count):
            started = time.perf_counter()
            with store.tx() as tx:
                tx.append("r", "s", T0, "step.started", {"index": i, "tool": "search"})
            times.append(time.perf_counter() - started)
        return statistics.median(times)


_EVENTS_SHAPE = (
    "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    "run_id TEXT NOT NULL, step_id TEXT NOT NULL DEFAULT '', at TEXT NOT NULL, "
    "type TEXT NOT NULL, payload_json TEXT NOT NULL, hash TEXT NOT NULL DEFAULT '');"
    "CREATE INDEX IF NOT EXISTS events_run ON events(run_id, seq)"
)
_EVENT_ROW = ("r", "s", "2026-10-01T09:00:00Z", "step.started", "{}", "0" * 64)


def append_reference(path: str, count: int, events_shape: bool) -> float:
    conn = apsw.Connection(path)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        if events_shape:
            conn.execute(_EVENTS_SHAPE)
            sql = ("INSERT INTO events (run_id, step_id, at, type, payload_json, hash) "
                   "VALUES (?, ?, ?, ?, ?, ?)")
        else:
            conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body TEXT)")
            sql = "INSERT INTO t (body) VALUES (?)"
        times = []
        for i in range(count):
            started = time.perf_counter()
            row = (*_EVENT_ROW[:4], f'{{"index":{i},"tool":"search"}}', _EVENT_ROW[5])
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(sql, row if events_shape else row[4:5])
            conn.execute("COMMIT")
            times.append(time.perf_counter() - started)
        return statistics.median(times)
    finally:
        conn.close()


def alternate(rounds: int, ours: Callable[[], float],
              reference: Callable[[], float]) -> tuple[list[float], list[float]]:
    a: list[float] = []
    b: list[float] = []
    for i in range(rounds):
        if i % 2:
            a.append(ours())
            b.append(reference())
        else:
            b.append(reference())
            a.append(ours())
    return a, b


def _cell(values: list[float], scale: float, fmt: str) -> str:
    med = statistics.median(values) * scale
    lo, hi = min(values) * scale, max(values) * scale
    return f"{med:{fmt}} ({lo:{fmt}}-{hi:{fmt}})"


def report(figures: list[Figure]) -> str:
    head = f"{'figure':<34} {'ours (spread)':<28} {'reference (spread)':<28} ratio  bar"
    lines = [head, "-" * len(head)]
    for f in figures:
        scale, fmt = (1.0, ",.0f") if f.unit == "rows/s" else (1e6, ",.0f")
        unit = f.unit if f.unit == "rows/s" else "us/commit"
        bar = f"{'>=' if f.higher_is_better else '<='} {f.bar}x"
        verdict = "ok" if f.passes else "MISSED"
        lines.append(
            f"{f.name + ' (' + unit + ')':<34} {_cell(f.ours, scale, fmt):<28} "
            f"{_cell(f.reference, scale, fmt):<28} {f.ratio:.2f}x {bar} {verdict}")
    return "\n".join(lines)


def measure_all(events: int, rounds: int, commits: int,
                directory: str | None) -> tuple[Figure, Figure, Figure]:
    """Paging, then appending against both references (see the module doc)."""
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        db = os.path.join(tmp, "events.db")
        took = build_events(db, events)
        size = Path(db).stat().st_size
        print(f"built {events:,} chained events ({size / 2**20:,.0f} MiB) in {took:.1f} s",
              file=sys.stderr)
        ours, ref = alternate(rounds, lambda: page_ours(db), lambda: page_reference(db))
        paging = Figure(f"list_events_after, {events // 1000}k", "rows/s", ours, ref,
                        0.9, True)
        print(report([paging]), file=sys.stderr)

        store_db = os.path.join(tmp, "append.db")
        shaped_db, bare_db = os.path.join(tmp, "shaped.db"), os.path.join(tmp, "bare.db")
        ours, shaped, bare = [], [], []
        for i in range(rounds):  # the three sides in a rotating order
            sides = [lambda: ours.append(append_ours(store_db, commits)),
                     lambda: shaped.append(append_reference(shaped_db, commits, True)),
                     lambda: bare.append(append_reference(bare_db, commits, False))]
            for k in range(3):
                sides[(i + k) % 3]()
        appending = Figure("append vs same-schema insert", "s/commit", ours, shaped, 1.3,
                           False)
        plain = Figure("append vs one-column insert", "s/commit", ours, bare, 1.3, False)
    return paging, appending, plain


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_store",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, fewer rounds")
    parser.add_argument("--events", type=int, help="events to page over")
    parser.add_argument("--rounds", type=int, help="rounds per figure")
    parser.add_argument("--dir", help="directory for the files (default: a temporary one)")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when a bar is missed (the default only reports)")
    args = parser.parse_args(argv)
    events = args.events or (100_000 if args.quick else 1_000_000)
    rounds = args.rounds or (3 if args.quick else 7)
    commits = 100 if args.quick else 300

    paging, appending, plain = measure_all(events, rounds, commits, args.dir)
    print(report([paging, appending, plain]))
    return 1 if args.strict and not (paging.passes and appending.passes) else 0


def run(quick: bool) -> list[common.Figure]:
    """The figures for ``python -m bench`` (the contract in ``bench/__init__.py``)."""
    events, rounds, commits = (100_000, 3, 100) if quick else (1_000_000, 7, 300)
    paging, appending, plain = measure_all(events, rounds, commits, common.scratch_dir())
    sides = (
        (paging, f"list_events_after, {events // 1000:,}k events, CPU", "bare apsw page loop",
         common.Bar(">=", 0.9)),
        (appending, "append one event (Store.tx)", "synced insert, events schema",
         common.Bar("<=", 1.3)),
        (plain, "append one event (Store.tx)", "synced insert, one column",
         None),  # shown beside it, not a bar
    )
    figures = []
    for f, what, reference, bar in sides:
        scale = 1.0 if f.unit == "rows/s" else 1e6
        figures.append(common.Figure(
            bench="store",
            what=what,
            unit="rows/s" if f.unit == "rows/s" else "us/commit",
            values=[v * scale for v in f.ours],
            reference=reference,
            refs=[v * scale for v in f.reference],
            bar=bar,
        ))
    return figures


if __name__ == "__main__":
    sys.exit(main())

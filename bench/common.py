"""What every benchmark shares: figures, timing in rounds, the table, child processes,
and the event databases the exporter benchmarks read.

Timing. Each figure is measured over several rounds, the measured side and its
reference alternating within a round (and swapping order every round), so a host
whose speed drifts slows both alike. A :class:`Figure` keeps every round; its
ratio is the median of the per-round ratios, and the spread is their range.

Event databases. :func:`event_db` writes a database of ``n`` events with the
schema the store creates (``open_store`` makes the file, so migrations, version
and mode are the real ones) and a valid hash chain (``agentrt.chain.chain_hash``
over every event in seq order, as the writer computes it). The events are not
made up: a template of two runs is recorded by the real driver (tool calls, a
malformed request, a denial, an approval pause and resume, model calls with a
429 retried, completion), and the database holds copies of those runs with their
ids made unique, several runs open at once, their events interleaved in seq
order. Times advance 1.037 ms per event. The chain is checked with
``verify_events`` over its first and last thousand events. Only the ``events`` and ``runs`` tables
are filled: an export from seq 0 sees every run start, so it reads nothing else.
Writing through the store's own transaction helper costs about 25 µs an event
(half a minute per million); this writes the same rows with one ``executemany``.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import IO

import apsw

__all__ = [
    "Bar",
    "Figure",
    "REPO_ROOT",
    "child_env",
    "event_db",
    "main",
    "paired_rounds",
    "print_table",
    "run_measured",
    "scratch_dir",
]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- figures -------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """``value <op> limit`` where value is the ratio (``on="ratio"``) or the figure."""

    op: str  # ">=" or "<="
    limit: float
    on: str = "ratio"

    def met(self, x: float) -> bool:
        return x >= self.limit if self.op == ">=" else x <= self.limit

    def __str__(self) -> str:
        limit = f"{self.limit:.1f}" if round(self.limit, 1) == self.limit else f"{self.limit:g}"
        return f"{self.op} {limit}x" if self.on == "ratio" else f"{self.op} {limit}"


@dataclass
class Figure:
    """One bar's measurement: every round of the figure and of its reference.

    ``values`` and ``refs`` are per round, in ``unit``. ``higher_is_better``
    decides how the ratio reads: for a rate it is figure / reference, for a
    time or a size figure / reference too (the bar's direction says which way
    is good). A figure without a reference has no ratio; its bar is on the value.
    """

    bench: str
    what: str
    unit: str
    values: list[float]
    bar: Bar | None  # None: shown beside the others, not a bar
    reference: str = ""
    refs: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def ref_median(self) -> float | None:
        return statistics.median(self.refs) if self.refs else None

    @property
    def ratios(self) -> list[float]:
        if not self.refs:
            return []
        if len(self.refs) == len(self.values):  # paired rounds
            return [v / r for v, r in zip(self.values, self.refs, strict=True) if r]
        ref = statistics.median(self.refs)
        return [v / ref for v in self.values] if ref else []

    @property
    def ratio(self) -> float | None:
        r = self.ratios
        return statistics.median(r) if r else None

    @property
    def ok(self) -> bool:
        if self.bar is None:
            return True
        x = self.ratio if self.bar.on == "ratio" else self.median
        return x is not None and self.bar.met(x)

    def spread(self) -> str:
        """Of the ratio when the bar is on it, else of the figure: the range over
        at most five rounds, the interquartile range over more samples."""
        r = self.ratios
        if r and (self.bar is None or self.bar.on == "ratio"):
            lo, hi = _range(r)
            return f"{lo:.2f}-{hi:.2f}x"
        lo, hi = _range(self.values)
        return f"{_num(lo)}-{_num(hi)}"


def _range(values: Sequence[float]) -> tuple[float, float]:
    if len(values) <= 5:
        return min(values), max(values)
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def _num(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 0.01:
        return f"{x:.2f}"
    return f"{x:.2g}"


_COLUMNS = ("figure", "median", "reference", "ref median", "ratio", "spread", "bar", "")


def table_rows(figures: Sequence[Figure]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for f in figures:
        ratio = f.ratio
        ref = f.ref_median
        rows.append((
            f.what,
            f"{_num(f.median)} {f.unit}",
            f.reference or "-",
            f"{_num(ref)} {f.unit}" if ref is not None else "-",
            f"{ratio:.2f}x" if ratio is not None else "-",
            f"{f.spread()} ({len(f.values)})",
            _bar(f),
            "info" if f.bar is None else "ok" if f.ok else "MISSED",
        ))
    return rows


def _bar(f: Figure) -> str:
    if f.bar is None:
        return "-"
    return str(f.bar) if f.bar.on == "ratio" else f"{f.bar} {f.unit}"


def print_table(figures: Sequence[Figure], out: IO[str] | None = None) -> None:
    """One aligned table; a note under a figure is indented below it."""
    stream = out if out is not None else sys.stdout
    rows = table_rows(figures)
    widths = [max(len(c[i]) for c in [_COLUMNS, *rows]) for i in range(len(_COLUMNS))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    print(line(_COLUMNS), file=stream)
    for f, row in zip(figures, rows, strict=True):
        print(line(row), file=stream)
        if f.note:
            print(f"    {f.note}", file=stream)


def main(run: Callable[[bool], list[Figure]], argv: list[str] | None = None) -> int:
    """``python -m bench.bench_<name> [--quick]``: one module's table and exit code."""
    args = sys.argv[1:] if argv is None else argv
    quick = "--quick" in args
    figures = run(quick)
    print_table(figures)
    return 0 if all(f.ok for f in figures) else 1


def log(message: str) -> None:
    """Progress on stderr, so stdout holds only the table."""
    print(message, file=sys.stderr, flush=True)


# -- timing --------------------------------------------------------------------


def paired_rounds(
    rounds: int,
    measured: Callable[[], float],
    reference: Callable[[], float],
) -> tuple[list[float], list[float]]:
    """Run both sides ``rounds`` times, alternating which goes first; their results."""
    values: list[float] = []
    refs: list[float] = []
    for i in range(rounds):
        if i % 2 == 0:
            values.append(measured())
            refs.append(reference())
        else:
            refs.append(reference())
            values.append(measured())
    return values, refs


@dataclass(frozen=True)
class Measured:
    """A finished child process: exit code, wall time and its own resource use."""

    returncode: int
    seconds: float
    cpu_seconds: float
    peak_rss_mb: float


def run_measured(
    cmd: Sequence[str],
    *,
    stdout: int | None = subprocess.DEVNULL,
    env: dict[str, str] | None = None,
) -> Measured:
    """Run ``cmd`` to completion; its wall time, CPU time and peak RSS.

    Through ``bench/_launch.py``, which forks it from a small process, so the
    peak RSS is the command's own and not this harness's (see there). Wall time
    is taken by the launcher around the fork and the wait, for every command alike.
    """
    fd, report = tempfile.mkstemp(prefix="rusage-", dir=scratch_dir())
    os.close(fd)
    try:
        subprocess.run([sys.executable, _LAUNCH, report, *cmd], stdout=stdout,
                       stdin=subprocess.DEVNULL, env=env, cwd=REPO_ROOT, check=True)
        with open(report) as f:
            seconds, cpu, maxrss_kb, code = f.read().split()
    finally:
        os.remove(report)
    return Measured(int(code), float(seconds), float(cpu), int(maxrss_kb) / 1024)


_LAUNCH = os.path.join(REPO_ROOT, "bench", "_launch.py")


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child running this checkout's code (not an installed copy)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


# -- scratch space ---------------------------------------------------------------


_SCRATCH: list[str] = []


def scratch_dir() -> str:
    """A directory for this invocation's databases, on the checkout's disk, removed at exit."""
    if not _SCRATCH:
        base = os.path.join(REPO_ROOT, "bench", "out")
        os.makedirs(base, exist_ok=True)
        path = tempfile.mkdtemp(prefix="run-", dir=base)
        _SCRATCH.append(path)
        atexit.register(shutil.rmtree, path, True)
    return _SCRATCH[0]


# -- the template runs -------------------------------------------------------------

#: Replaced by a run's own number in every id of a copied run (24 characters,
#: so ids stay 32: the mark plus an 8-digit counter).
MARK = "Z" * 24
BASE_TIME = datetime(2026, 10, 1, 9, 0, 0, tzinfo=UTC)


@dataclass(frozen=True)
class TemplateEvent:
    step_id: str
    type: str
    payload: bytes


def _record_template() -> list[tuple[str, list[TemplateEvent]]]:
    """Two runs recorded by the real driver into a scratch database, as event lists."""
    from agentrt.demo import DEMO_SCRIPT, demo_tools
    from agentrt.driver import (
        DefaultPolicy,
        Driver,
        ModelConfig,
        ModelResponse,
        Price,
        ToolUse,
        approve,
    )
    from agentrt.records import Limits, Usage
    from agentrt.store import open_store
    from agentrt.testing import (
        FakeClock,
        ModelToolAgent,
        ScriptedAgent,
        ScriptedModel,
        rate_limited,
    )

    tools = demo_tools()
    script = list(DEMO_SCRIPT)
    counter = itertools.count(1)
    clock = FakeClock(BASE_TIME, step=timedelta(microseconds=1037))
    limits = Limits(max_steps=20, max_consecutive_tool_failures=3, loop_threshold=3,
                    max_model_calls=10)
    runs = []
    with tempfile.TemporaryDirectory(dir=scratch_dir()) as tmp:
        store = open_store(os.path.join(tmp, "template.db"))
        with store:
            driver = Driver(store, ScriptedAgent(script), DefaultPolicy(), tools,
                            now=clock, new_id=lambda: f"{MARK}{next(counter):08d}",
                            lease_owner="bench")
            run_id = f"{MARK}00000000"
            run = driver.start("deploy the service to staging", limits, run_id=run_id)
            for a in store.list_approvals(run_id):
                if a.status == "pending":
                    approve(store, run_id, a.id, "operator", "staging only, go ahead")
            driver.resume(run_id)
            runs.append(run_id)

            # Text beyond ASCII, as agents write it: arguments from json.dumps
            # (an emoji as an escaped surrogate pair), a reply in UTF-8.
            arguments = json.dumps({"path": "notes/réunion 🚀.md"}).encode()
            model = ScriptedModel([
                rate_limited(),
                ModelResponse(tool_uses=[ToolUse("t1", "read_file", arguments)],
                              usage=Usage(1200, 40)),
                ModelResponse(text="the notes say: ship on Friday — déjà vu ✅",
                              usage=Usage(1350, 12, 900)),
            ])
            prices = {"scripted-model": Price(input=3_000_000, output=15_000_000,
                                              cached_input=300_000)}
            config = ModelConfig(model, prices=prices, max_retries=1,
                                 backoff=timedelta(milliseconds=1))
            driver2 = Driver(store, ModelToolAgent(), DefaultPolicy(), tools, now=clock,
                             new_id=lambda: f"{MARK}{next(counter):08d}", model=config,
                             lease_owner="bench")
            run_id2 = f"{MARK}00000001"
            run = driver2.start("what do the notes say?", limits, run_id=run_id2)
            if run.status != "COMPLETED":
                raise RuntimeError(f"template run ended {run.status}: {run.reason_detail}")
            runs.append(run_id2)
            return [(r, [TemplateEvent(e.step_id, e.type, e.payload)
                         for e in store.list_events(r)]) for r in runs]


_TEMPLATE: list[tuple[str, list[TemplateEvent]]] = []


def template() -> list[tuple[str, list[TemplateEvent]]]:
    """(run id, events) of the template runs, recorded once per invocation."""
    if not _TEMPLATE:
        _TEMPLATE.extend(_record_template())
    return _TEMPLATE


# -- event databases -----------------------------------------------------------------


def _interleaved(n: int, open_runs: int, big: Callable[[int], bytes | None]) -> Iterator[
        tuple[int, str, str, str, bytes]]:
    """``n`` events (run number, run id, step id, type, payload) of template copies,
    ``open_runs`` runs at a time in round robin, in the order they are written."""
    runs = template()
    lanes: list[Iterator[tuple[int, str, str, str, bytes]]] = []
    next_run = 0
    mark = MARK.encode()

    def copy(k: int) -> Iterator[tuple[int, str, str, str, bytes]]:
        run_id, events = runs[k % len(runs)]
        tag = f"{k:024x}"
        run_id, btag = run_id.replace(MARK, tag), tag.encode()
        for e in events:
            yield (k, run_id, e.step_id.replace(MARK, tag), e.type, e.payload.replace(mark, btag))

    produced = 0
    while produced < n:
        while len(lanes) < open_runs:
            lanes.append(copy(next_run))
            next_run += 1
        for lane in list(lanes):
            if produced >= n:
                break
            item = next(lane, None)
            if item is None:
                lanes.remove(lane)
                continue
            payload = big(produced + 1)
            if payload is not None:
                item = (*item[:4], payload)
            produced += 1
            yield item


def _times() -> Callable[[int], str]:
    """Stored time text of the event with a given seq: BASE_TIME + seq * 1037 µs."""
    base = int(BASE_TIME.timestamp())
    prefixes: dict[int, str] = {}

    def at(seq: int) -> str:
        total = seq * 1037
        sec, micro = divmod(total, 1_000_000)
        prefix = prefixes.get(sec)
        if prefix is None:
            prefixes.clear()
            prefix = datetime.fromtimestamp(base + sec, UTC).strftime("%Y-%m-%dT%H:%M:%S")
            prefixes[sec] = prefix
        if not micro:
            return prefix + "Z"
        return prefix + f".{micro:06d}".rstrip("0") + "Z"

    return at


_DBS: dict[tuple[int, int, int, int], str] = {}


def event_db(n: int, *, open_runs: int = 8, big_rows: int = 0, big_size: int = 16 << 20) -> str:
    """The path of a database of ``n`` chained events, made once per invocation.

    ``open_runs`` runs are open at once (their events interleave). ``big_rows``
    events spread evenly through the table carry a ``big_size``-byte JSON
    payload instead of their own.
    """
    key = (n, open_runs, big_rows, big_size)
    if key in _DBS:
        return _DBS[key]
    from agentrt.chain import chain_hash
    from agentrt.store import open_existing, open_store

    started = time.perf_counter()
    path = os.path.join(scratch_dir(), f"events-{n}-{open_runs}-{big_rows}.db")
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)
    open_store(path).close()  # the real schema, version and file mode

    every = n // big_rows if big_rows else 0
    blob = (b'{"blob":"' + b"x" * (big_size - 12) + b'"}') if big_rows else b""

    def big(seq: int) -> bytes | None:
        return blob if every and seq % every == every // 2 else None

    at = _times()
    conn = apsw.Connection(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    prev = ""
    seen: set[int] = set()
    run_rows: list[tuple[str, str, str]] = []
    batch: list[tuple[int, str, str, str, str, str, str]] = []
    insert = ("INSERT INTO events (seq, run_id, step_id, at, type, payload_json, hash) "
              "VALUES (?, ?, ?, ?, ?, ?, ?)")
    with conn:
        for seq, (k, run_id, step_id, type_, payload) in enumerate(
                _interleaved(n, open_runs, big), start=1):
            when = at(seq)
            prev = chain_hash(prev, seq, run_id, step_id, when, type_, payload)
            batch.append((seq, run_id, step_id, when, type_, payload.decode(), prev))
            if k not in seen:
                seen.add(k)
                run_rows.append((run_id, "bench", when))
            if len(batch) >= 50_000:
                conn.executemany(insert, batch)
                batch.clear()
        conn.executemany(insert, batch)
        conn.executemany(
            "INSERT INTO runs (id, goal, status, limits_json, created_at) "
            "VALUES (?, ?, 'COMPLETED', '{}', ?)", run_rows)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with open_existing(path) as store:  # the chain as the runtime checks it, at both ends
        for lo, hi in ((1, min(n, 1000)), (max(1, n - 999), n)):
            report = store.verify_events(lo, hi)
            if report.broken is not None:
                raise RuntimeError(f"the generated chain is broken: {report.broken}")
    log(f"  made {os.path.basename(path)}: {n:,} events, {len(seen):,} runs, "
        f"{os.path.getsize(path) / 1e6:,.0f} MB in {time.perf_counter() - started:.1f} s")
    _DBS[key] = path
    return path


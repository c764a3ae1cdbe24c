"""Instructions a unit of work executes (a driver step, an appended event, an
event read or exported), counted by valgrind.

Wall-clock ratios on a shared host move by a third from one run to the next;
the instruction count of a deterministic workload does not, so it shows the
effect of a change to the Python a unit runs. Each figure is the difference
between two runs of the same workload, N2 and N1 units long, divided by
N2 - N1, so start-up and imports cancel out. Commits are not synced here
(synchronous=OFF): the disk is the other benchmarks' business. Valgrind's CPU
lacks SHA extensions, so sha256 weighs more here than on the real CPU.

    python -m bench.instructions [--what step,append,bare]     # needs valgrind
    python -m bench.instructions --what page-bare,page-cast,page-events,page
    python -m bench.instructions --what export,follow,sqlite3-json
    python -m bench.instructions --what otel,otel-encode

``step``: a step of the scripted agent with a trivial tool, as in
``bench_driver``; ``append``: ``with store.tx() as tx: tx.append(...)``, as in
``bench_store`` (b); ``bare``: the same-schema insert in its own transaction.
``page``: one event read by ``list_events_after`` in pages of 500, as in
``bench_store`` (a); ``page-bare``: the bare apsw loop it is compared with;
``page-cast``: that loop with the store's select list; ``page-events``: that
loop building the store's events from the rows. ``export``: one event
through a ``Follower`` into a ``JSONLSink`` writing to /dev/null (what
``agentrt-export jsonl`` does per event); ``follow``: the same into a sink
that does nothing; ``sqlite3-json``: one row of
``sqlite3 -json`` selecting the same columns. The paging workloads read a
database of 60,000 events (``bench_store``'s), the export workloads one of
the runtime's own payloads (``bench.common.event_db``), each made once
before counting; a workload of n units reads the table's last n rows.
``otel``: one event read, mapped to spans (``SpanMapper``) and built into
the SDK's ``ReadableSpan`` objects a page of 500 at a time, as
``agentrt-export otel`` does before it hands a page to the exporter;
``otel-encode``: that and the SDK's OTLP encoding of the spans, serialised,
in batches of 512 (the part both sides of ``bench_otel`` pay). These read the
export database's first n events, so every run is mapped from its start.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from typing import cast

import apsw

T0 = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)
UNITS = {"step": (100, 300), "append": (1000, 3000), "bare": (1000, 3000),
         "page": (20_000, 60_000), "page-bare": (20_000, 60_000),
         "page-cast": (20_000, 60_000), "page-events": (20_000, 60_000),
         "export": (20_000, 60_000), "follow": (20_000, 60_000),
         "sqlite3-json": (20_000, 60_000), "otel": (20_000, 60_000),
         "otel-encode": (10_000, 30_000)}
#: Where the paging and export workloads find their databases (made by the parent).
_PAGE_DB = "BENCH_INSTRUCTIONS_PAGE_DB"
_EXPORT_DB = "BENCH_INSTRUCTIONS_EXPORT_DB"
_PAGE = 500
_TABLE = 60_000 + _PAGE
_COLUMNS = "seq, run_id, step_id, at, type, payload_json"


def _steps(directory: str, n: int) -> None:
    from agentrt.driver import DefaultPolicy, Driver, FuncTool, StepInput, ToolResult
    from agentrt.records import Decision, Limits
    from agentrt.store import open_store

    class Agent:
        def decide(self, step: StepInput) -> Decision:
            if step.index >= n:
                return Decision.tool_call("hold", b"{}")
            return Decision.tool_call("noop", b'{"n":%d}' % step.index)

    def noop(call: object) -> ToolResult:
        return ToolResult(b'{"ok":true}', "ok")

    tools = [FuncTool("noop", noop, input_schema=b'{"type":"object"}', side_effect="read_only",
                      timeout=5),
             FuncTool("hold", noop, side_effect="remote_mutation", timeout=5)]
    with open_store(os.path.join(directory, "steps.db")) as store:
        store.db().execute("PRAGMA synchronous=OFF")
        Driver(store, Agent(), DefaultPolicy(), tools).start(
            "bench", Limits(max_steps=n + 10, max_consecutive_tool_failures=3,
                            loop_threshold=n + 10))


def _appends(directory: str, n: int) -> None:
    from agentrt.store import open_store

    with open_store(os.path.join(directory, "append.db")) as store:
        store.db().execute("PRAGMA synchronous=OFF")
        with store.tx() as tx:
            tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) "
                       "VALUES ('r', 'g', 'RUNNING', '{}', '')")
        for i in range(n):
            with store.tx() as tx:
                tx.append("r", "s", T0, "step.started", {"index": i, "tool": "search"})


def _bare(directory: str, n: int) -> None:
    from bench.bench_store import _EVENTS_SHAPE

    conn = apsw.Connection(os.path.join(directory, "bare.db"))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute(_EVENTS_SHAPE)
    sql = ("INSERT INTO events (run_id, step_id, at, type, payload_json, hash) "
           "VALUES (?, ?, ?, ?, ?, ?)")
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(sql, ("r", "s", "2026-10-01T09:00:00Z", "step.started",
                           f'{{"index":{i},"tool":"search"}}', "0" * 64))
        conn.execute("COMMIT")
    conn.close()


def _pages(how: str) -> Callable[[str, int], None]:
    """A workload reading ``n`` events of the parent's database, ``how`` it says."""

    def read(directory: str, n: int) -> None:
        from agentrt.store import open_existing
        from agentrt.store.rows import EVENT_COLUMNS, events_from_rows

        path = os.environ[_PAGE_DB]
        if how == "store":
            with open_existing(path) as store:
                seq = _TABLE - n
                while seq < _TABLE:
                    seq = store.list_events_after("", seq, _PAGE)[-1].seq
            return
        sql = (f"SELECT {EVENT_COLUMNS.fast if how != 'bare' else _COLUMNS} "
               "FROM events WHERE seq > ? ORDER BY seq LIMIT ?")
        conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
        seq = _TABLE - n
        while seq < _TABLE:
            cursor = conn.execute(sql, (seq, _PAGE))
            rows = events_from_rows(cursor) if how == "events" else cursor.fetchall()
            seq = cast(int, rows[-1][0])
        conn.close()

    return read


def _exports(sink: str) -> Callable[[str, int], None]:
    """A workload following ``n`` events into a JSONL sink on /dev/null, or a null sink."""

    def export(directory: str, n: int) -> None:
        from agentrt.store import open_existing
        from agentrt_export import Follower, JSONLSink, MemoryCursor

        with open_existing(os.environ[_EXPORT_DB]) as store, open(os.devnull, "wb") as out:
            follower = Follower(store, cursor=MemoryCursor(_TABLE - n), once=True)
            follower.follow(JSONLSink(out) if sink == "jsonl" else lambda event: None)

    return export


def _otel(encode: bool) -> Callable[[str, int], None]:
    """A workload mapping the export database's first ``n`` events to SDK spans,
    and encoding them as the OTLP exporter does when ``encode``."""

    def spans(directory: str, n: int) -> None:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        from agentrt.store import open_existing
        from agentrt_otel import SpanMapper, resolve_config, to_readable_spans

        resource = resolve_config().resource()
        with open_existing(os.environ[_EXPORT_DB]) as store:
            mapper = SpanMapper(store)
            seq = 0
            while seq < n:
                page = store.list_events_after("", seq, min(_PAGE, n - seq))
                built = to_readable_spans(mapper.map_all(page), resource)
                if encode:
                    for i in range(0, len(built), 512):
                        encode_spans(built[i:i + 512]).SerializePartialToString()
                seq = page[-1].seq

    return spans


WORKLOADS: dict[str, Callable[[str, int], None]] = {
    "step": _steps, "append": _appends, "bare": _bare,
    "page": _pages("store"), "page-bare": _pages("bare"),
    "page-cast": _pages("cast"), "page-events": _pages("events"),
    "export": _exports("jsonl"), "follow": _exports("null"),
    "otel": _otel(False), "otel-encode": _otel(True),
}
#: Every workload: the Python ones above, and the sqlite3 CLI counted as itself.
NAMES = (*WORKLOADS, "sqlite3-json")


def _count(what: str, n: int) -> int:
    """Instructions of one child running ``n`` units of ``what`` under cachegrind."""
    if what == "sqlite3-json":
        query = f"SELECT {_COLUMNS} FROM events WHERE seq > {_TABLE - n} ORDER BY seq"
        child = [shutil.which("sqlite3") or "sqlite3", "-json", os.environ[_EXPORT_DB], query]
    else:
        child = [sys.executable, "-m", "bench.instructions", "--child", what, str(n)]
    out = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         *child], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
    m = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if m is None:
        raise SystemExit(f"no instruction count from valgrind:\n{out.stderr[-2000:]}")
    return int(m.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--what", default="step,append,bare")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        what, n = args.child[0], int(args.child[1])
        directory = tempfile.mkdtemp(prefix="bench-instr-", dir=os.getcwd())
        try:
            WORKLOADS[what](directory, n)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return 0
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    wanted = args.what.split(",")
    unknown = [w for w in wanted if w not in NAMES]
    if unknown:
        parser.error(f"unknown workload {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    with tempfile.TemporaryDirectory(prefix="bench-instr-", dir=os.getcwd()) as directory:
        if any(w.startswith("page") for w in wanted):
            from bench.bench_store import build_events

            os.environ[_PAGE_DB] = os.path.join(directory, "events.db")
            build_events(os.environ[_PAGE_DB], _TABLE)
        if {"export", "follow", "sqlite3-json", "otel", "otel-encode"} & set(wanted):
            from bench.common import event_db

            os.environ[_EXPORT_DB] = event_db(_TABLE)
        for what in wanted:
            n1, n2 = UNITS[what]
            per = (_count(what, n2) - _count(what, n1)) / (n2 - n1)
            unit = {"step": "step", "append": "commit", "bare": "commit"}.get(what, "event")
            print(f"{what:<12} {per:>12,.0f} instructions per {unit}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

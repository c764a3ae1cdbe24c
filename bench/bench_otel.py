"""OTel export against the SDK's OTLP exporter sending pre-built spans, and its memory.

A local OTLP/HTTP receiver runs in its own process (``bench._receiver``: it
decodes every request, as a collector does, and counts spans), so neither side
shares a GIL with it.

- Measured: ``agentrt-export otel --db FILE --endpoint <receiver>`` as a
  process (``python -m agentrt_export.cli``): it reads the events, maps them to
  spans, builds the SDK's ``ReadableSpan`` objects and exports a page at a
  time. Spans per second over the whole run, start-up included; the count is
  what the receiver got.
- Reference: a process that maps the first events of the same file to the same
  spans and builds them before the clock starts (so the spans have exactly our
  shape: names, attributes, events, ids), then times only the SDK's
  ``OTLPSpanExporter.export()`` sending them in batches of 512 (the batch size
  the SDK's ``BatchSpanProcessor`` uses) until as many spans as the measured
  side sent have gone out. Bar: at least 0.8x the reference's spans/s.

Memory: the peak RSS of the measured process over the same events (8 runs open
at once), and of one over a table where 10,000 runs are open at once, so the
mapper holds 10,000 runs' open spans. The mapper keeps state for open spans
only; the bar is the follower's (<= 80 MB).

    python -m bench.bench_otel [--quick]
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from bench.common import (
    Bar,
    Figure,
    child_env,
    event_db,
    log,
    main,
    paired_rounds,
    run_measured,
)

BATCH = 512


class Receiver:
    """The receiver process; ``spans()`` is how many it has decoded so far."""

    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc = proc
        self.endpoint = f"http://127.0.0.1:{port}/v1/traces"
        self._count = f"http://127.0.0.1:{port}/count"

    def spans(self) -> int:
        with urllib.request.urlopen(self._count, timeout=10) as reply:
            return int(reply.read().split()[0])


@contextmanager
def receiver() -> Iterator[Receiver]:
    proc = subprocess.Popen([sys.executable, "-m", "bench._receiver"], stdout=subprocess.PIPE,
                            text=True, env=child_env())
    try:
        assert proc.stdout is not None
        yield Receiver(proc, int(proc.stdout.readline()))
    finally:
        proc.terminate()
        proc.wait(10)


def _export_cmd(db: str, rx: Receiver) -> list[str]:
    return [sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db,
            "--endpoint", rx.endpoint, "--protocol", "http/protobuf"]


def reference_main(db: str, events: int, spans: int, endpoint: str) -> None:
    """The reference process: build the spans of the first ``events`` events, then
    time sending ``spans`` of them (cycling) in batches; prints ``spans seconds``."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from agentrt.store import open_existing
    from agentrt_otel import SpanMapper, resolve_config, to_readable_spans

    store = open_existing(db)
    mapper = SpanMapper(store)
    records = []
    seq = 0
    while seq < events:
        page = store.list_events_after("", seq, 500)
        if not page:
            break
        for event in page:
            records.extend(mapper.map(event))
        seq = page[-1].seq
    store.close()
    built = to_readable_spans(records, resolve_config().resource())
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=10)
    batches = [built[i:i + BATCH] for i in range(0, len(built), BATCH)]
    sent = 0
    started = time.perf_counter()
    while sent < spans:
        for batch in batches:
            batch = batch[:spans - sent]
            if not batch:
                break
            exporter.export(batch)
            sent += len(batch)
    seconds = time.perf_counter() - started
    exporter.shutdown()  # type: ignore[no-untyped-call]
    print(sent, seconds)


def run(quick: bool) -> list[Figure]:
    n, rounds = (50_000, 2) if quick else (1_000_000, 3)
    many_open = 10_000
    many_events = 30_000 if quick else 300_000
    db = event_db(n)
    crowded = event_db(many_events, open_runs=many_open)
    env = child_env()
    rss: list[float] = []
    sent: list[int] = []
    with receiver() as rx:
        def measured() -> float:
            before = rx.spans()
            done = run_measured(_export_cmd(db, rx), env=env)
            if done.returncode != 0:
                raise RuntimeError(f"agentrt-export otel exited {done.returncode}")
            count = rx.spans() - before
            sent.append(count)
            rss.append(done.peak_rss_mb)
            return count / done.seconds

        def reference() -> float:
            target = sent[-1] if sent else n // 3
            out = subprocess.run(
                [sys.executable, "-m", "bench.bench_otel", "--reference", db,
                 str(min(n, 200_000)), str(target), rx.endpoint],
                env=env, check=True, capture_output=True, text=True).stdout.split()
            return int(out[0]) / float(out[1])

        log(f"otel: {rounds} rounds of agentrt-export otel and the SDK exporter over "
            f"{n:,} events")
        values, refs = paired_rounds(rounds, measured, reference)
        log(f"otel: peak RSS with {many_open:,} runs open over {many_events:,} events")
        crowded_rss = []
        for _ in range(2 if quick else 3):
            done = run_measured(_export_cmd(crowded, rx), env=env)
            if done.returncode != 0:
                raise RuntimeError(f"agentrt-export otel exited {done.returncode}")
            crowded_rss.append(done.peak_rss_mb)
    spans = max(sent) if sent else 0
    return [
        Figure(
            bench="otel",
            what=f"agentrt-export otel, {n // 1000:,}k events ({spans:,} spans) over HTTP",
            unit="spans/s",
            values=values,
            reference="SDK exporter, pre-built spans",
            refs=refs,
            bar=Bar(">=", 0.8),
        ),
        Figure(
            bench="otel",
            what=f"agentrt-export otel peak RSS, {n // 1000:,}k events",
            unit="MB",
            values=rss,
            bar=Bar("<=", 80, on="value"),
        ),
        Figure(
            bench="otel",
            what=f"agentrt-export otel peak RSS, {many_open:,} runs open",
            unit="MB",
            values=crowded_rss,
            bar=Bar("<=", 80, on="value"),
        ),
    ]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--reference":
        reference_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        sys.exit(0)
    sys.exit(main(run))

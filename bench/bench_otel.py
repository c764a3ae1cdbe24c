"""OTel export against the SDK's OTLP exporter sending pre-built spans, and its memory.

A local OTLP/HTTP receiver runs in its own process (``bench._receiver``: it
decodes every request, as a collector does, and counts spans), so neither side
shares a GIL with it.

- Measured: ``agentrt-export otel --db FILE --endpoint <receiver>`` as a
  process (``python -m agentrt_export.cli``): it reads the events, maps them to
  spans, builds the SDK's ``ReadableSpan`` objects and exports a page at a
  time. Spans per second over the whole run, start-up included; the count is
  what the receiver got.
- Reference: a process that maps the first 200,000 events of the same file to
  the same spans and builds them before the clock starts (so the spans have
  exactly our shape: names, attributes, events, ids; the resource is a plain
  SDK ``Resource`` with the same attributes, as a ``TracerProvider`` makes
  it), then times only the SDK's ``OTLPSpanExporter.export()`` sending them in
  batches of 512 (the batch size of the SDK's ``BatchSpanProcessor``), cycling
  through them until 100,000 spans have gone out. Bar: at least 0.8x the
  reference's spans/s, each side's spans per second of its own CPU time (the
  process's user + system for ours, start-up included; the export loop's for
  the reference). Both wait for the receiver's reply to every request; CPU
  time leaves that wait and this shared host's other load out of the
  figure, which a wall clock over a 10 s reference window does not (two full
  runs gave 0.55x and 0.85x by wall time). The wall rates are shown beside.

Memory: the peak RSS of the measured process over the 1M events (8 runs open
at once; bar: the follower's 80 MB), and over 100,000 events of 1,000 and of
10,000 runs open at once. The mapper holds what is open of each run (its span,
its current step, calls in flight), so memory grows with the runs open at
once, not with the events exported. Bar: 80 MB with 1,000 runs open; the
10,000 row is shown for the cost per open run.

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
    REPO_ROOT,
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
                            text=True, env=child_env(), cwd=REPO_ROOT)
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
    time sending ``spans`` of them (cycling) in batches; prints ``spans seconds cpu``."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource

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
    resource = Resource(dict(resolve_config().resource().attributes))  # the SDK's own class
    built = to_readable_spans(records, resource)
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=10)
    batches = [built[i:i + BATCH] for i in range(0, len(built), BATCH)]
    sent = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    while sent < spans:
        for batch in batches:
            batch = batch[:spans - sent]
            if not batch:
                break
            exporter.export(batch)
            sent += len(batch)
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    exporter.shutdown()  # type: ignore[no-untyped-call]
    print(sent, seconds, cpu)


def _peak_rss(db: str, rx: Receiver) -> float:
    done = run_measured(_export_cmd(db, rx), env=child_env())
    if done.returncode != 0:
        raise RuntimeError(f"agentrt-export otel exited {done.returncode}")
    return done.peak_rss_mb


def run(quick: bool) -> list[Figure]:
    n, rounds, ref_spans = (30_000, 2, 10_000) if quick else (1_000_000, 3, 100_000)
    crowd_events = 20_000 if quick else 100_000
    db = event_db(n)
    crowded = {k: event_db(crowd_events, open_runs=k) for k in (1_000, 10_000)}
    env = child_env()
    rss: list[float] = []
    sent: list[int] = []
    wall: dict[str, list[float]] = {"ours": [], "reference": []}
    with receiver() as rx:
        def measured() -> float:
            before = rx.spans()
            done = run_measured(_export_cmd(db, rx), env=env)
            if done.returncode != 0:
                raise RuntimeError(f"agentrt-export otel exited {done.returncode}")
            count = rx.spans() - before
            sent.append(count)
            rss.append(done.peak_rss_mb)
            wall["ours"].append(count / done.seconds)
            return count / done.cpu_seconds

        def reference() -> float:
            before = rx.spans()
            out = subprocess.run(
                [sys.executable, "-m", "bench.bench_otel", "--reference", db,
                 str(min(n, 200_000)), str(ref_spans), rx.endpoint],
                env=env, cwd=REPO_ROOT, check=True, capture_output=True, text=True).stdout.split()
            count, seconds, cpu = int(out[0]), float(out[1]), float(out[2])
            if rx.spans() - before != count:
                raise RuntimeError("the receiver did not get every reference span")
            wall["reference"].append(count / seconds)
            return count / cpu

        log(f"otel: {rounds} rounds of agentrt-export otel over {n:,} events and the SDK "
            f"exporter sending {ref_spans:,} pre-built spans")
        values, refs = paired_rounds(rounds, measured, reference)
        log(f"otel: peak RSS with 1,000 and 10,000 runs open over {crowd_events:,} events")
        crowd_rss = {k: _peak_rss(path, rx) for k, path in crowded.items()}
    spans = max(sent)
    per_run_kb = (crowd_rss[10_000] - crowd_rss[1_000]) / 9_000 * 1024
    return [
        Figure(
            bench="otel",
            what=f"agentrt-export otel, {n // 1000:,}k events ({spans:,} spans), CPU",
            unit="spans/s",
            values=values,
            reference="SDK exporter, pre-built spans",
            refs=refs,
            bar=Bar(">=", 0.8),
        ),
        Figure(
            bench="otel",
            what=f"agentrt-export otel, {n // 1000:,}k events, wall",
            unit="spans/s",
            values=wall["ours"],
            reference="SDK exporter, pre-built spans",
            refs=wall["reference"],
            bar=None,
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
            what="agentrt-export otel peak RSS, 1,000 runs open at once",
            unit="MB",
            values=[crowd_rss[1_000]],
            bar=Bar("<=", 80, on="value"),
        ),
        Figure(
            bench="otel",
            what="agentrt-export otel peak RSS, 10,000 runs open at once",
            unit="MB",
            values=[crowd_rss[10_000]],
            bar=None,
            note=f"{per_run_kb:.1f} KB per run open at once (1,000 -> 10,000)",
        ),
    ]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--reference":
        reference_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        sys.exit(0)
    sys.exit(main(run))

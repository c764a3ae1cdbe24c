"""`agentrt-export` as a real process on the fixture: the goldens, across stops and kills.

Each exporter runs on a private copy of `fixtures/runs.db`. "After every
page" is made real by throttling the consumer: JSON Lines go through a pipe
shrunk to 4 KiB (so the exporter cannot run more than about a page ahead of
the test reading it) and OTLP requests reach a receiver that takes a tenth of
a second over each. A clean stop (SIGTERM) must give the golden output
exactly once; a SIGKILL may repeat at most the page in flight.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _fixtures_kit import (
    JSONL,
    STALE,
    copy_fixture,
    distinct,
    golden_spans,
    identity,
)
from eventdb import REPO_ROOT, child_env
from otlp_receivers import GrpcReceiver, HttpReceiver, ReceivedSpan

from agentrt.store import open_existing
from agentrt_otel import SCOPE_NAME, SpanMapper
from fixtures.golden import ordered, span_dict

EVENTS = 111
PAGE = 10
#: Linux lets a pipe be shrunk to one memory page; elsewhere the test is weaker.
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", None)


def golden_lines() -> list[bytes]:
    return JSONL.read_bytes().splitlines(keepends=True)


def test_the_golden_has_every_event_once() -> None:
    assert [json.loads(line)["seq"] for line in golden_lines()] == list(range(1, EVENTS + 1))


# -- JSON Lines -----------------------------------------------------------------------


def jsonl(db: str, *args: str, stdout: Any = subprocess.PIPE) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentrt_export.cli", "jsonl", "--db", db, *args],
        stdout=stdout, stderr=subprocess.PIPE, env=child_env(), cwd=REPO_ROOT)


def test_the_jsonl_command_prints_the_golden(tmp_path: Path) -> None:
    proc = jsonl(copy_fixture(tmp_path))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err == b"", err
    assert out == JSONL.read_bytes(), f"fixtures/runs.jsonl: {STALE}"


def small_pipe() -> tuple[int, int]:
    r, w = os.pipe()
    if F_SETPIPE_SZ is not None:
        fcntl.fcntl(w, F_SETPIPE_SZ, 4096)
    return r, w


def jsonl_rounds(db: str, cursor: Path, sig: signal.Signals, lines_before: int,
                 ) -> list[tuple[bytes, int, bytes, bool]]:
    """Start the exporter on the cursor again and again, each time sending ``sig``
    once it has printed ``lines_before`` lines, until one run ends by itself.
    Returns (output, exit code, stderr, signalled) per process; a SIGTERM that
    ended a process after it had saved the last page counts as exit 0 (see
    :func:`otel_rounds`)."""
    rounds = []
    for _ in range(EVENTS + 1):
        r, w = small_pipe()
        proc = jsonl(db, "--cursor-file", str(cursor), "--page-size", str(PAGE), stdout=w)
        os.close(w)
        with os.fdopen(r, "rb") as out:
            got: list[bytes] = []
            while len(got) < lines_before:
                line = out.readline()
                if not line:
                    break
                got.append(line)
            signalled = len(got) == lines_before
            if signalled:
                proc.send_signal(sig)
            rest = out.read()
        _, err = proc.communicate(timeout=60)
        code = proc.returncode
        rounds.append((b"".join(got) + rest, code, err, signalled))
        if not signalled:
            return rounds
    raise AssertionError("the export never finished")


def test_jsonl_export_stopped_cleanly_after_every_page_gives_the_golden_exactly_once(
        tmp_path: Path) -> None:
    db = copy_fixture(tmp_path)
    rounds = jsonl_rounds(db, tmp_path / "cursor", signal.SIGTERM, PAGE)
    assert [(code, err) for _, code, err, _ in rounds] == [(0, b"")] * len(rounds)
    assert b"".join(out for out, _, _, _ in rounds) == JSONL.read_bytes()
    if F_SETPIPE_SZ is not None:
        assert sum(s for _, _, _, s in rounds) >= 3, "the stops did not interrupt the export"
    assert (tmp_path / "cursor").read_text() == f"{EVENTS}\n"


def test_jsonl_export_killed_after_every_page_gives_the_golden_with_at_most_a_page_again(
        tmp_path: Path) -> None:
    db = copy_fixture(tmp_path)
    # One line into the second page: the first page's cursor is saved, so each
    # process gets further than the last.
    rounds = jsonl_rounds(db, tmp_path / "cursor", signal.SIGKILL, PAGE + 1)
    golden = golden_lines()
    delivered_through = 0
    kills = 0
    for out, code, _, killed in rounds:
        assert code in ((-signal.SIGKILL, 0) if killed else (0,))
        kills += killed
        lines = out.split(b"\n")[:-1]  # what follows the last newline was cut by the kill
        if not lines:
            continue
        seqs = [json.loads(line)["seq"] for line in lines]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        for seq, line in zip(seqs, lines, strict=True):
            assert line + b"\n" == golden[seq - 1]
        assert delivered_through - PAGE < seqs[0] <= delivered_through + 1, (
            "more than a page again, or a gap")
        delivered_through = max(delivered_through, seqs[-1])
    assert delivered_through == EVENTS
    if F_SETPIPE_SZ is not None:
        assert kills >= 3, "the kills did not interrupt the export"


# -- OpenTelemetry over OTLP ------------------------------------------------------------

KINDS = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUSES = {0: "UNSET", 1: "OK", 2: "ERROR"}


def received_dict(s: ReceivedSpan) -> dict[str, Any]:
    """A span as it arrived, in the golden form."""
    return span_dict(
        name=s.name, trace_id=s.trace_id, span_id=s.span_id,
        parent_span_id=s.parent_span_id or None, kind=KINDS[s.kind], start_ns=s.start_ns,
        end_ns=s.end_ns, attributes=s.attributes, events=s.events,
        status=STATUSES[s.status_code], status_description=s.status_message)


def otel(db: str, endpoint: str, *args: str) -> subprocess.Popen[bytes]:
    env = child_env()
    for key in list(env):
        if key.startswith("OTEL_"):
            del env[key]
    env["OTEL_SERVICE_NAME"] = "agentrt-fixtures"
    return subprocess.Popen(
        [sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db, "--endpoint",
         endpoint, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO_ROOT)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_the_otel_command_sends_exactly_the_golden_spans(tmp_path: Path, protocol: str) -> None:
    db = copy_fixture(tmp_path)
    grpc = protocol == "grpc"
    with (GrpcReceiver() if grpc else HttpReceiver()) as receiver:
        endpoint = f"127.0.0.1:{receiver.port}" if grpc else f"http://127.0.0.1:{receiver.port}"
        proc = otel(db, endpoint, "--protocol", protocol, *(["--insecure"] if grpc else []))
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        spans = receiver.spans()
    assert ordered(received_dict(s) for s in spans) == golden_spans(), (
        f"fixtures/spans.json: {STALE}")
    assert {s.scope for s in spans} == {SCOPE_NAME}
    assert {s.resource.get("service.name") for s in spans} == {"agentrt-fixtures"}


class SlowReceiver(HttpReceiver):
    """A collector that takes a while over each request, so the exporter cannot
    get far ahead of a test that stops it after a page."""

    delay = 0.1

    def take(self, request: Any, headers: dict[str, str]) -> bool:
        time.sleep(self.delay)
        return super().take(request, headers)


def read_cursor(path: Path) -> int:
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return 0


def otel_rounds(db: str, cursor: Path, receiver: HttpReceiver, sig: signal.Signals,
                ) -> list[tuple[int, bytes, bool]]:
    """Start the exporter on the cursor again and again, each time sending ``sig`` as
    soon as it has saved a page, until one run ends by itself.
    Returns (exit code, stderr, signalled) per process.

    A SIGTERM that lands after the last page was saved can find the process past
    its follow loop, with the default handlers back, and end it by the signal:
    such a round reports exit 0, since everything was delivered and saved.
    """
    rounds = []
    for _ in range(EVENTS + 1):
        before = read_cursor(cursor)
        proc = otel(db, f"http://127.0.0.1:{receiver.port}", "--cursor-file", str(cursor),
                    "--page-size", str(PAGE))
        deadline = time.monotonic() + 60
        while proc.poll() is None and read_cursor(cursor) == before:
            assert time.monotonic() < deadline, "the exporter saved no page"
            time.sleep(0.002)
        signalled = proc.poll() is None
        if signalled:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        code = proc.returncode
        rounds.append((code, err, signalled))
        if not signalled:
            return rounds
    raise AssertionError("the export never finished")


def most_spans_one_page_ends(db: str, page: int) -> int:
    """The most spans the events of any ``page`` consecutive events of ``db`` (a
    copy of the fixture: a checkout under umask 002 leaves the original 0664,
    which the opener refuses) end."""
    with open_existing(db, read_only=True) as store:
        mapper = SpanMapper(store)
        per_event = [len(mapper.map(e)) for e in store.list_events_after("", 0, 10_000)]
    return max(sum(per_event[i:i + page]) for i in range(len(per_event)))


def check_against_golden(spans: list[ReceivedSpan]) -> Counter[tuple[Any, ...]]:
    """What arrived, exact duplicates dropped, is the golden spans exactly: every
    span in every field as one uninterrupted pass makes it. Returns the count
    per span."""
    got = [received_dict(s) for s in spans]
    assert distinct(got) == golden_spans()
    return Counter(identity(s) for s in got)


def test_otel_export_stopped_cleanly_after_every_page_sends_every_golden_span_once(
        tmp_path: Path) -> None:
    db = copy_fixture(tmp_path)
    with SlowReceiver() as receiver:
        rounds = otel_rounds(db, tmp_path / "cursor", receiver, signal.SIGTERM)
        spans = receiver.spans()
    assert [code for code, _, _ in rounds] == [0] * len(rounds), rounds
    assert all(b"Traceback" not in err for _, err, _ in rounds)
    assert sum(s for _, _, s in rounds) >= 3, "the stops did not interrupt the export"
    counts = check_against_golden(spans)
    assert max(counts.values()) == 1, "a clean stop sent a span twice"
    assert read_cursor(tmp_path / "cursor") == EVENTS


def test_otel_export_killed_after_every_page_sends_every_golden_span_with_at_most_a_page_again(
        tmp_path: Path) -> None:
    db = copy_fixture(tmp_path)
    with SlowReceiver() as receiver:
        rounds = otel_rounds(db, tmp_path / "cursor", receiver, signal.SIGKILL)
        spans = receiver.spans()
    kills = sum(s for _, _, s in rounds)
    assert kills >= 3, "the kills did not interrupt the export"
    assert rounds[-1][0] == 0
    counts = check_against_golden(spans)
    repeats = sum(counts.values()) - len(counts)
    assert repeats <= kills * most_spans_one_page_ends(db, PAGE)
    assert read_cursor(tmp_path / "cursor") == EVENTS

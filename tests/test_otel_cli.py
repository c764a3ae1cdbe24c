"""`agentrt-export otel` as a real process against real OTLP receivers on 127.0.0.1."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from eventdb import REPO_ROOT, child_env, child_process
from otlp_receivers import GrpcReceiver, HttpReceiver

from agentrt.store import open_store
from agentrt_otel import SpanMapper, span_id
from agentrt_otel.testing import (
    EventStream,
    scenario_cancelled,
    scenario_completed,
    scenario_model_retry,
    scenario_paused,
)


def scenario_db(path: str) -> list:
    """A database holding four runtime-shaped runs' events, appended in order."""
    stream = EventStream("completed")
    scenario_completed(stream)
    scenario_paused(stream.use("paused"))
    scenario_cancelled(stream.use("cancelled"))
    scenario_model_retry(stream.use("model"))
    append_events(path, stream.events)
    return stream.events


def append_events(path: str, events: list) -> None:
    """Commit ``events`` (with bare rows for their runs) to the database at ``path``."""
    store = open_store(path)
    with store.tx() as tx:
        for run_id in dict.fromkeys(e.run_id for e in events):
            tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) "
                       "VALUES (?, 'g', 'RUNNING', '{}', '2026-09-25T14:03:04Z')", (run_id,))
        for e in events:
            tx.append(e.run_id, e.step_id, e.at, e.type, e.payload)
    store.close()


def expected_keys(events) -> set:
    spans = SpanMapper().map_all(events)
    return {(s.trace_id, s.span_id, s.parent_span_id or 0, s.name) for s in spans}


def received_keys(receiver) -> set:
    return {(int(s.trace_id, 16), int(s.span_id, 16), int(s.parent_span_id or "0", 16), s.name)
            for s in receiver.spans()}


def _stderr_until(proc: subprocess.Popen, marker: bytes, timeout: float = 60.0) -> bytes:
    """Read the process's stderr straight from the pipe until ``marker`` appears
    (``communicate()`` reads the rest the same way, so nothing is lost)."""
    seen = b""
    deadline = time.monotonic() + timeout
    fd = proc.stderr.fileno()
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} in {seen!r}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 4096)
            assert chunk, f"stderr ended before {marker!r}: {seen!r}"
            seen += chunk
    return seen


#: An export timeout that leaves the SDK time for exactly one retry of a
#: transient failure (its first backoff is 0.8-1.2 s, its second 1.6-2.4 s):
#: the path its default 10 s takes (retry, then give up for time), said in the
#: outage line after about a second instead of seven.
RETRIED_ONCE = {"OTEL_EXPORTER_OTLP_TIMEOUT": "2000"}


def export(db: str, *args: str, env_extra: dict[str, str] | None = None,
           **kw) -> subprocess.Popen:
    env = child_env()
    for key in list(env):
        if key.startswith("OTEL_"):
            del env[key]
    env["OTEL_SERVICE_NAME"] = "agentrt-test"
    env.update(env_extra or {})
    return subprocess.Popen(
        [sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO_ROOT, **kw)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_otel_command_delivers_every_span_over_the_wire(tmp_path, protocol):
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    receiver_type = GrpcReceiver if protocol == "grpc" else HttpReceiver
    with receiver_type() as receiver:
        endpoint = (f"127.0.0.1:{receiver.port}" if protocol == "grpc"
                    else f"http://127.0.0.1:{receiver.port}")
        extra = ["--insecure"] if protocol == "grpc" else []
        proc = export(db, "--protocol", protocol, "--endpoint", endpoint, "--cursor-file",
                      str(tmp_path / "cursor"), "--header", "x-team=agents", *extra)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        got = received_keys(receiver)
        assert got == expected_keys(events)
        assert (tmp_path / "cursor").read_text() == f"{events[-1].seq}\n"
        run_span = next(s for s in receiver.spans()
                        if int(s.span_id, 16) == span_id("run", "completed"))
        assert run_span.resource.get("service.name") == "agentrt-test"
        assert "service.instance.id" not in run_span.resource


def test_otel_command_waits_out_a_collector_outage_without_moving_the_cursor(tmp_path):
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    cursor = tmp_path / "cursor"
    port = _free_port()
    # No collector yet: the exporter retries and never saves past the first page.
    proc = export(db, "--endpoint", f"http://127.0.0.1:{port}", "--cursor-file", str(cursor),
                  "--page-size", "10", env_extra=RETRIED_ONCE)
    seen = _stderr_until(proc, b"failed (")  # the outage has begun, however slow the start
    time.sleep(1)  # and goes on for a few attempts
    assert not cursor.exists()
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=60)
    err = seen + rest
    assert proc.returncode == 0, err
    assert b"stopped" in err and b"Traceback" not in err
    # One line for the outage, naming the collector and the cause; the SDK's
    # own lines for each attempt are not printed.
    began = [line for line in err.decode().splitlines() if "failed (" in line]
    assert len(began) == 1
    assert re.fullmatch(r"otel: exporting \d+ spans failed \(http://127\.0\.0\.1:"
                        f"{port}" r"/v1/traces: Connection refused\); retrying with backoff, "
                        r"the cursor stays before this page", began[0]), began
    assert b"Transient error" not in err and b"HTTPConnectionPool" not in err
    assert not cursor.exists()
    with HttpReceiver(port) as receiver:
        receiver.fail_next(3)  # and a flaky one once it is back, which the SDK retries
        receiver.retry_after = "0"  # at once, not over its 1 + 2 + 4 s backoff
        proc = export(db, "--endpoint", f"http://127.0.0.1:{port}", "--cursor-file",
                      str(cursor), "--page-size", "10")
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert receiver.refused == 3
        assert received_keys(receiver) == expected_keys(events)
    assert cursor.read_text() == f"{events[-1].seq}\n"


def test_otel_command_follows_new_commits_until_sigterm(tmp_path):
    db = str(tmp_path / "runs.db")
    first = scenario_db(db)
    with HttpReceiver() as receiver:
        proc = export(db, "--follow", "--endpoint", f"http://127.0.0.1:{receiver.port}",
                      "--cursor-file", str(tmp_path / "cursor"))
        _wait_for(lambda: received_keys(receiver) == expected_keys(first))
        later = EventStream("later")
        scenario_completed(later, goal="committed while the exporter follows")
        append_events(db, later.events)
        _wait_for(lambda: received_keys(receiver) >= expected_keys(later.events))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert received_keys(receiver) == expected_keys(first) | expected_keys(later.events)


def _wait_for(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, [], b"http/protobuf or grpc"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, [], b"otlp, console, or none"),
        ({}, ["--header", "novalue"], b"KEY=VALUE"),
    ],
)
def test_otel_command_refuses_bad_configuration_as_usage(tmp_path, env, args, message):
    db = str(tmp_path / "runs.db")
    scenario_db(db)
    full = child_env()
    full.update(env)
    done = subprocess.run([sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db,
                           *args], capture_output=True, env=full, cwd=REPO_ROOT, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert b"Traceback" not in done.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



# -- bad input is one sentence and exit 2, never an export retried for ever --

def run_otel(db: str, *args: str, env: dict[str, str] | None = None,
             timeout: float = 30) -> subprocess.CompletedProcess:
    """The command as a real process with no OTEL_* variables but ``env``;
    a process still running after ``timeout`` (retrying) fails the test."""
    full = child_env()
    for key in list(full):
        if key.startswith("OTEL_"):
            del full[key]
    full.update(env or {})
    try:
        return subprocess.run([sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db,
                               *args], capture_output=True, env=full, cwd=REPO_ROOT,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"otel {args} {env} was still running after {timeout} s (retrying)")


@pytest.mark.parametrize(("env", "args", "said"), [
    ({}, ["--endpoint", "http://[::1"],
     '--endpoint "http://[::1": it is not a URL (Invalid IPv6 URL)'),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1"}, [],
     'OTEL_EXPORTER_OTLP_ENDPOINT "http://[::1": it is not a URL'),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://[::1"}, ["--protocol", "grpc"],
     'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT "http://[::1": it is not a URL'),
    ({}, ["--endpoint", "notaurl"], '--endpoint "notaurl": it has no http:// or https://'),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "notaurl"}, [],
     'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT "notaurl": it has no http:// or https://'),
    ({}, ["--endpoint", "ftp://x/"], '--endpoint "ftp://x/": its scheme "ftp" is not http'),
    ({}, ["--endpoint", "http://host:99999/"], 'port "99999" is not a number from 1 to 65535'),
    ({}, ["--protocol", "grpc", "--endpoint", "host:99999"], 'port "99999" is not a number'),
    ({}, ["--endpoint", ""], '--endpoint "": give the collector\'s address'),
    ({}, ["--header", "k=v\nx"], 'header "k" (from --header): its value holds U+000A'),
    ({}, ["--header", "k=v€"], 'header "k" (from --header): its value holds "€" (U+20AC)'),
    ({}, ["--header", "bad key=v"], 'header "bad key" (from --header): a header name is'),
    ({}, ["--protocol", "grpc", "--header", "bad key=v"],
     'header "bad key" (from --header): a gRPC metadata name holds only'),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "k=v%0Ax"}, [],
     'header "k" (from OTEL_EXPORTER_OTLP_HEADERS): its value holds U+000A'),
    ({"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "k=v%E2%82%AC"}, [],
     'header "k" (from OTEL_EXPORTER_OTLP_TRACES_HEADERS): its value holds "€"'),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "bad"}, [],
     'OTEL_EXPORTER_OTLP_COMPRESSION "bad": gzip, deflate, or none'),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "deflate"}, ["--protocol", "grpc"],
     'OTEL_EXPORTER_OTLP_COMPRESSION "deflate": gzip or none over grpc'),
])
def test_otel_command_refuses_an_unusable_endpoint_header_or_compression_as_usage(
    tmp_path, env, args, said,
):
    db = str(tmp_path / "runs.db")
    scenario_db(db)
    before = (tmp_path / "runs.db").read_bytes()
    done = run_otel(db, "--cursor-file", str(tmp_path / "cursor"), *args, env=env)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    first = err.splitlines()[0]
    assert first.startswith("usage: otel: ") and said in first, err
    assert "Traceback" not in err and "Unsupported compression" not in err
    assert "E1" not in err and "validate_metadata" not in err  # the gRPC core said nothing
    assert done.stdout == b""
    assert not (tmp_path / "cursor").exists()
    assert (tmp_path / "runs.db").read_bytes() == before


# -- what the command does with the rest -----------------------------------

FAR_FUTURE = "9999-12-31T23:59:59.999999999Z"


@pytest.mark.parametrize("exporter", ["otlp", "console"])
def test_otel_command_delivers_a_page_holding_an_event_dated_9999(tmp_path, exporter):
    # The year-10000 time failed the page on every attempt (the console's
    # "year 10000 is out of range", the encoder's "Value out of range").
    import sqlite3

    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    last = events[-1].seq
    with sqlite3.connect(db) as conn:  # the stored text, as the audit wrote it
        conn.execute("UPDATE events SET at = ? WHERE seq = ?", (FAR_FUTURE, last))
    conn.close()
    cursor = tmp_path / "cursor"
    if exporter == "console":
        done = run_otel(db, "--cursor-file", str(cursor),
                        env={"OTEL_TRACES_EXPORTER": "console"})
        assert done.returncode == 0, done.stderr
        assert b"2262-04-11T23:47:16" in done.stdout and b"failed" not in done.stderr
    else:
        with HttpReceiver() as receiver:
            done = run_otel(db, "--endpoint", receiver.base, "--cursor-file", str(cursor))
            assert done.returncode == 0, done.stderr
            assert received_keys(receiver) == expected_keys(events)
            ends = {s.end_ns for s in receiver.spans() if s.name == "agentrt.run"}
            assert 2**63 - 1 in ends  # the model run finished "in 9999": the latest OTLP time
    assert cursor.read_text() == f"{last}\n"


def many_runs_db(path: str, runs: int = 20) -> list:
    stream = EventStream("run-0")
    for i in range(runs):
        scenario_completed(stream.use(f"run-{i}"))
    append_events(path, stream.events)
    return stream.events


@pytest.mark.parametrize("when", ["before the first span", "after the first line"])
def test_otel_command_with_the_console_exporter_ends_quietly_when_stdout_closes(tmp_path, when):
    # `OTEL_TRACES_EXPORTER=console agentrt-export otel | head -n 1` never
    # ended: the closed pipe was taken for a collector outage and retried.
    db = str(tmp_path / "runs.db")
    events = many_runs_db(db)
    cursor = tmp_path / "cursor"
    env = child_env()
    env["OTEL_TRACES_EXPORTER"] = "console"
    with open(tmp_path / "err", "wb") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db, "--cursor-file",
             str(cursor), "--page-size", "10"],
            stdout=subprocess.PIPE, stderr=err_file, env=env, cwd=REPO_ROOT)
        assert proc.stdout is not None
        if when == "after the first line":
            assert proc.stdout.readline().strip() == b"{"  # head -n 1
        proc.stdout.close()
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail("the exporter kept retrying a closed stdout")
    err = (tmp_path / "err").read_text()
    assert code == 0, err
    assert err == ""  # quietly: no outage line, no traceback
    if when == "before the first span":
        assert not cursor.exists()
    else:  # saved only after pages the pipe took, never to the end
        saved = int(cursor.read_text()) if cursor.exists() else 0
        assert saved < events[-1].seq


def test_otel_command_over_grpc_takes_compression_none_and_gzip(tmp_path):
    # The SDK's gRPC exporter raised on "none" (a traceback at start-up); the
    # setting is now resolved here and handed to it.
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    for value in ("none", "gzip"):
        with GrpcReceiver() as receiver:
            done = run_otel(db, "--protocol", "grpc", "--insecure", "--endpoint",
                            f"127.0.0.1:{receiver.port}",
                            env={"OTEL_EXPORTER_OTLP_COMPRESSION": value})
            assert done.returncode == 0, done.stderr
            assert b"Traceback" not in done.stderr
            assert received_keys(receiver) == expected_keys(events)


def test_otel_command_sends_gzip_over_http_when_the_environment_says_so(tmp_path):
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    with HttpReceiver() as receiver:
        done = run_otel(db, "--endpoint", receiver.base,
                        env={"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip"})
        assert done.returncode == 0, done.stderr
        assert received_keys(receiver) == expected_keys(events)
        assert {h.get("content-encoding") for h in receiver.headers} == {"gzip"}


def test_otel_command_warns_once_and_exports_when_resource_attributes_do_not_decode(tmp_path):
    # The resource SDK specification: a value that does not decode is
    # discarded whole and reported; it was silently half-applied.
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    with HttpReceiver() as receiver:
        done = run_otel(db, "--endpoint", receiver.base,
                        env={"OTEL_RESOURCE_ATTRIBUTES": "team=billing,garbage",
                             "OTEL_SERVICE_NAME": "agentrt-test"})
        assert done.returncode == 0, done.stderr
        assert done.stderr.decode().splitlines() == [
            'otel: OTEL_RESOURCE_ATTRIBUTES "team=billing,garbage" is ignored, all of it: '
            '"garbage" is not key=value; write it as key=value,key2=value2 with values '
            "percent-encoded"]
        assert received_keys(receiver) == expected_keys(events)
        resources = [s.resource for s in receiver.spans()]
        assert all("team" not in r and r["service.name"] == "agentrt-test" for r in resources)


@pytest.mark.parametrize(("args", "env"), [
    (("--header", "Authorization: Bearer TOPSECRET"), None),
    (("--header", "Bearer TOPSECRET"), None),
    (("--header", "TOPSECRET"), None),
    (("--header", "x-api-key TOPSECRET"), None),
    ((), {"OTEL_EXPORTER_OTLP_HEADERS": "a=b,Bearer TOPSECRET"}),
])
def test_a_header_that_is_not_key_value_is_refused_without_echoing_it(tmp_path, args, env):
    db = str(tmp_path / "runs.db")
    scenario_db(db)
    done = run_otel(db, "--endpoint", "http://127.0.0.1:9/v1/traces", *args, env=env)
    assert done.returncode == 2
    assert b"TOPSECRET" not in done.stderr and b"Traceback" not in done.stderr
    assert b"not key=value" in done.stderr.lower()


def stopped_once_refused(command: list[str], receiver, env: dict[str, str]) -> tuple[int, str]:
    """Run ``command`` until ``receiver`` has refused a request, then SIGTERM it:
    (its exit code, its stderr)."""
    with child_process(command, env, stdout=None) as proc:
        deadline = time.monotonic() + 30
        while receiver.refused < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1].decode()
    return proc.returncode, err


def _one_page_of_601_spans(tmp_path) -> tuple[str, Path, int]:
    """runs.db with one run of 600 tool steps (601 spans), a cursor path, and the
    number of events."""
    db = str(tmp_path / "runs.db")
    s = EventStream("big")
    s.run_created()
    s.run_started()
    for i in range(600):
        s.tool_step(f"s{i}", i, "read")
    s.run_finished("COMPLETED", "goal_met", steps=600)
    append_events(db, s.events)
    return db, tmp_path / "cursor", len(s.events)


class _AcceptsTheFirstRequestOnly(HttpReceiver):
    def take(self, request, headers):
        ok = super().take(request, headers)
        with self._lock:
            self._fail = 10**6  # 503 to every request after the first
        return ok


def test_a_stop_after_a_pages_first_batches_were_accepted_sends_only_the_rest_again(tmp_path):
    """A page of 601 spans goes in batches of 512 and 89; the collector takes the
    first and refuses the second, then a SIGTERM. The cursor moves past the events
    whose spans all arrived, so the restart sends the 89 alone: the whole page
    went again, the 512 accepted spans twice."""
    import collections

    db, cursor, events = _one_page_of_601_spans(tmp_path)
    env = child_env()
    env["AGENTRT_STOP_GRACE_S"] = "1"
    command = [sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db,
               "--cursor-file", str(cursor), "--page-size", "5000"]
    with _AcceptsTheFirstRequestOnly() as refusing:
        code, err = stopped_once_refused([*command, "--endpoint", refusing.endpoint],
                                         refusing, env)
        first = refusing.spans()
    assert code == 0, err
    assert len(first) == 512
    assert err.splitlines()[-1].endswith("; the rest of the page is sent again on restart")
    saved = int(cursor.read_text())
    assert 0 < saved < events
    with HttpReceiver() as healthy:
        again = subprocess.run([*command, "--endpoint", healthy.endpoint], capture_output=True,
                               env=env, cwd=REPO_ROOT, timeout=60)
        second = healthy.spans()
    assert again.returncode == 0, again.stderr.decode()
    counts = collections.Counter(span.span_id for span in first + second)
    assert len(counts) == 601 and max(counts.values()) == 1


_FULL_DISK = """
import errno, runpy, sys
import agentrt_export.cursor as cursor
def full(self, *args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")
cursor.FileCursor.save = full  # the disk filled up: no save succeeds
sys.argv = ["agentrt-export", *sys.argv[1:]]
runpy.run_module("agentrt_export.cli", run_name="__main__")
"""


def test_a_partway_stop_whose_cursor_could_not_be_saved_is_a_failure_that_says_so(tmp_path):
    """The collector took the page's first batch; the stop's cursor save failed (a
    full disk): the whole page goes again, so it is not the clean stop that says
    only the rest does (it said that, exit 0, the save's failure dropped)."""
    db, cursor, events = _one_page_of_601_spans(tmp_path)
    env = child_env()
    env["AGENTRT_STOP_GRACE_S"] = "1"
    with _AcceptsTheFirstRequestOnly() as refusing:
        code, err = stopped_once_refused(
            [sys.executable, "-c", _FULL_DISK, "otel", "--db", db, "--cursor-file",
             str(cursor), "--page-size", "5000", "--endpoint", refusing.endpoint], refusing, env)
    assert code == 1 and not cursor.exists()
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: otel: stopped before the collector accepted the page: ")
    assert re.search(r"; and the cursor could not be saved at seq \d+: \[Errno 28\] No "
                     r"space left on device$", last), last

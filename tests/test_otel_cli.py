"""`agentrt-export otel` as a real process against real OTLP receivers on 127.0.0.1."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest
from eventdb import REPO_ROOT, child_env
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


def export(db: str, *args: str, **kw) -> subprocess.Popen:
    env = child_env()
    for key in list(env):
        if key.startswith("OTEL_"):
            del env[key]
    env["OTEL_SERVICE_NAME"] = "agentrt-test"
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
                  "--page-size", "10")
    time.sleep(3)
    assert not cursor.exists()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
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
        receiver.fail_next(3)  # and a flaky one once it is back
        proc = export(db, "--endpoint", f"http://127.0.0.1:{port}", "--cursor-file",
                      str(cursor), "--page-size", "10")
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
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


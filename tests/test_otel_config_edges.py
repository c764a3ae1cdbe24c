"""Edges of the OTLP settings and transport: what the SDK's exporters honour
(credential provider plugins, an empty traces-specific variable, a collector's
Retry-After) is honoured by ``agentrt-export otel`` too, and settings the
chosen exporter never uses are not checked."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import requests
import requests.adapters
from otlp_receivers import TLS_CA, GrpcReceiver, HttpReceiver
from test_otel_cli import RETRIED_ONCE, expected_keys, received_keys, run_otel, scenario_db

from agentrt_otel import Backoff, ExportStopped, OTelSink, resolve_config
from agentrt_otel.answers import checked_http_session
from agentrt_otel.testing import EventStream, scenario_completed

#: A package installed on PYTHONPATH whose entry points in the SDK's
#: credential provider group make a session adding a header, the wrong type,
#: and an error.
_PLUGIN = '''
import requests

def session():
    s = requests.Session()
    s.headers["authorization"] = "Bearer from-plugin"
    return s

def wrong():
    return "not credentials"

def broken():
    raise OSError("no token file")
'''
_ENTRY_POINTS = """[opentelemetry_otlp_credential_provider]
fakeauth = fakeauth:session
wrongtype = fakeauth:wrong
broken = fakeauth:broken
"""


@pytest.fixture
def plugin_env(tmp_path: Path) -> dict[str, str]:
    """The environment that installs the credential provider plugins above."""
    site = tmp_path / "site"
    info = site / "fakeauth-0.0.dist-info"
    info.mkdir(parents=True)
    (site / "fakeauth.py").write_text(_PLUGIN)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeauth\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(_ENTRY_POINTS)
    repo = str(Path(__file__).resolve().parent.parent)
    return {"PYTHONPATH": os.pathsep.join([repo, str(site)]), **RETRIED_ONCE}


# -- an empty traces-specific CA counts as unset, over gRPC as over HTTP -------

@pytest.mark.parametrize(("protocol", "receiver_type"), [
    ("http/protobuf", HttpReceiver), ("grpc", GrpcReceiver)])
def test_an_empty_traces_certificate_leaves_the_generic_one_in_use(
        tmp_path, protocol, receiver_type):
    """The SDK's gRPC exporter took OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE=""
    for set, trusted the system's CAs alone and retried a TLS failure for ever."""
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    with receiver_type(tls=True) as receiver:
        done = run_otel(db, "--protocol", protocol, "--endpoint", receiver.endpoint,
                        "--cursor-file", str(tmp_path / "cursor"), timeout=20,
                        env={"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": "",
                             "OTEL_EXPORTER_OTLP_CERTIFICATE": TLS_CA, **RETRIED_ONCE})
    assert done.returncode == 0, done.stderr
    assert received_keys(receiver) == expected_keys(events)


# -- credential provider plugins ------------------------------------------------

@pytest.mark.parametrize("variable", ["OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
                                      "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER"])
def test_the_http_credential_provider_session_sends_every_request(tmp_path, plugin_env, variable):
    """The SDK's HTTP exporter sends through the plugin's session (here one
    adding an Authorization header); ours dropped it for its own session."""
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    with HttpReceiver() as receiver:
        done = run_otel(db, "--endpoint", receiver.endpoint, timeout=20,
                        env={**plugin_env, variable: "fakeauth"})
    assert done.returncode == 0, done.stderr
    assert received_keys(receiver) == expected_keys(events)
    assert {h.get("authorization") for h in receiver.headers} == {"Bearer from-plugin"}


def test_a_plugin_session_keeps_its_own_request_and_gets_the_checks():
    """The checks are composed into the plugin's session (its adapters and
    hooks), so a subclass's own ``request`` (google-auth's AuthorizedSession
    refreshes a token there) still runs, and a refusal still names its status."""
    import requests
    from test_otel_config_cli import answering

    from agentrt_otel.answers import checked_http_session

    class Authorized(requests.Session):
        def request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.headers["authorization"] = "Bearer refreshed"
            return super().request(*args, **kwargs)

    with answering(503, b"", "text/plain") as base:
        session = checked_http_session(base=Authorized())
        response = session.post(base + "/v1/traces", data=b"x", timeout=5)
    assert isinstance(session, Authorized)
    assert response.request.headers["authorization"] == "Bearer refreshed"
    assert response.reason == "HTTP 503 Service Unavailable"


@pytest.mark.parametrize(("protocol", "variable", "value", "said"), [
    ("grpc", "OTEL_PYTHON_EXPORTER_OTLP_GRPC_CREDENTIAL_PROVIDER", "nosuch",
     'OTEL_PYTHON_EXPORTER_OTLP_GRPC_CREDENTIAL_PROVIDER "nosuch" names no installed '
     "credential provider"),
    ("grpc", "OTEL_PYTHON_EXPORTER_OTLP_GRPC_TRACES_CREDENTIAL_PROVIDER", "wrongtype",
     'the credential provider "wrongtype" named by OTEL_PYTHON_EXPORTER_OTLP_GRPC_TRACES_'
     "CREDENTIAL_PROVIDER made a str, not a grpc.ChannelCredentials"),
    ("grpc", "OTEL_PYTHON_EXPORTER_OTLP_GRPC_CREDENTIAL_PROVIDER", "fakeauth",
     "made a Session, not a grpc.ChannelCredentials"),
    ("http/protobuf", "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER", "nosuch",
     "names no installed credential provider"),
    ("http/protobuf", "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER", "broken",
     'the credential provider "broken" named by OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_'
     'CREDENTIAL_PROVIDER failed (OSError: "no token file")'),
])
def test_a_credential_provider_that_cannot_be_used_is_one_sentence_and_exit_2(
        tmp_path, plugin_env, protocol, variable, value, said):
    """The SDK raised a RuntimeError from the exporter's constructor, which the
    command printed as a traceback (exit 1)."""
    db, cursor = str(tmp_path / "runs.db"), tmp_path / "cursor"
    scenario_db(db)
    done = run_otel(db, "--protocol", protocol, "--endpoint", "https://127.0.0.1:9",
                    "--cursor-file", str(cursor), env={**plugin_env, variable: value})
    err = done.stderr.decode()
    assert done.returncode == 2, err
    first = err.splitlines()[0]
    assert first.startswith("usage: otel: ") and said in first, err
    assert "Traceback" not in err and not cursor.exists(), err


# -- console and none do not check what only OTLP uses --------------------------

@pytest.mark.parametrize("exporter", ["console", "none"])
@pytest.mark.parametrize(("variable", "value"), [
    ("OTEL_EXPORTER_OTLP_INSECURE", "1"),
    ("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "yes"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
    ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "0"),
])
def test_console_and_none_leave_the_otlp_transport_variables_unchecked(exporter, variable, value):
    config = resolve_config(environ={"OTEL_TRACES_EXPORTER": exporter, variable: value})
    assert config.exporter == exporter


def test_the_none_exporter_runs_beside_an_otlp_timeout_it_never_uses(tmp_path):
    db = str(tmp_path / "runs.db")
    scenario_db(db)
    done = run_otel(db, env={"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_TIMEOUT": "10s"})
    assert done.returncode == 0, done.stderr


# -- a collector's Retry-After -----------------------------------------------------

def test_the_sink_waits_out_a_retry_after_longer_than_its_backoff(tmp_path):
    """A 503 asking for 2 s, past what is left of the 2 s export timeout: the
    SDK gives up at once, and the sink's next attempt came after its own
    backoff (about 1 s) instead of the 2 s the collector asked for."""
    db = str(tmp_path / "runs.db")
    events = scenario_db(db)
    with HttpReceiver() as receiver:
        arrived: list[float] = []
        take = receiver.take

        def timed(*args):  # type: ignore[no-untyped-def]
            arrived.append(time.monotonic())
            return take(*args)

        receiver.take = timed  # type: ignore[method-assign]
        receiver.retry_after = "2"
        receiver.fail_next(1)
        done = run_otel(db, "--endpoint", receiver.endpoint, env=RETRIED_ONCE)
    assert done.returncode == 0, done.stderr
    assert received_keys(receiver) == expected_keys(events)
    assert len(arrived) == 2 and arrived[1] - arrived[0] >= 1.9, arrived


@pytest.mark.parametrize(("header", "seconds"), [
    ("30", 30.0), (" 1.5 ", 1.5), ("-5", 0.0), ("inf", None), ("soon", None), ("", None),
    ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
])
def test_a_retry_after_is_read_as_seconds_or_a_date(header, seconds):
    from types import SimpleNamespace

    from agentrt_otel.answers import retry_after

    assert retry_after(SimpleNamespace(headers={"Retry-After": header})) == seconds


def test_a_retry_after_as_a_date_is_the_time_left_until_it():
    from email.utils import formatdate
    from types import SimpleNamespace

    from agentrt_otel.answers import retry_after

    asked = retry_after(SimpleNamespace(headers={"Retry-After": formatdate(time.time() + 60,
                                                                           usegmt=True)}))
    assert asked is not None and 58 <= asked <= 60


class _Recorded(threading.Event):
    """A stop event that records each wait, and stops at the first."""

    waits: list[float]

    def wait(self, timeout: float | None = None) -> bool:
        self.waits = [*getattr(self, "waits", []), timeout or 0.0]
        self.set()
        return True


class _Throttled:
    """Complaints of a collector that asked for ``asked`` seconds."""

    def __init__(self, asked: float) -> None:
        self.asked = asked

    def clear(self) -> None:
        pass

    def reason(self) -> str:
        return "HTTP 429 Too Many Requests"

    def too_large(self) -> bool:
        return False

    def retry_after(self) -> float:
        return self.asked


class _Failing:
    def export(self, spans: object) -> object:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass


@pytest.mark.parametrize(("asked", "waited"), [(30.0, 30.0), (10 ** 9, 3600.0)])
def test_a_retry_after_is_waited_on_the_stop_event_at_most_an_hour(asked, waited):
    """The wait is the stop event's, so a stop still cuts it short; a collector
    asking for a day (or a date next year) is tried again after an hour."""
    stop = _Recorded()
    sink = OTelSink(_Failing(), stop=stop, complaints=_Throttled(asked),  # type: ignore[arg-type]
                    backoff=Backoff(initial=0.5, maximum=1.0))
    stream = EventStream()
    scenario_completed(stream)
    with pytest.raises(ExportStopped):
        sink.handle_page(stream.events)
    assert stop.waits == [waited]


def test_a_long_retry_after_is_said_when_the_sink_waits_it_out(caplog):
    caplog.set_level("WARNING", "agentrt_otel")
    sink = OTelSink(_Failing(), stop=_Recorded(), complaints=_Throttled(3600.0),  # type: ignore[arg-type]
                    backoff=Backoff(initial=0.5, maximum=1.0))
    stream = EventStream()
    scenario_completed(stream)
    with pytest.raises(ExportStopped):
        sink.handle_page(stream.events)
    assert "otel: the collector asked to wait 3600 s before the next attempt (Retry-After); " \
           "waiting" in [r.getMessage() for r in caplog.records]


class _Refusing(requests.adapters.BaseAdapter):
    def send(self, request, **kw):  # type: ignore[no-untyped-def]
        answer = requests.Response()
        answer.status_code, answer.reason = 503, "Service Unavailable"
        answer.url, answer.request = request.url, request
        return answer

    def close(self) -> None:
        pass


def test_a_provider_session_shared_by_two_exporters_is_checked_once():
    """A plugin that hands out one module-level session (to share a token
    refresher) must not get a second layer of checks per exporter built."""
    shared = requests.Session()
    shared.mount("http://", _Refusing())
    checked_http_session(base=shared)
    session = checked_http_session(base=shared)
    answer = session.post("http://127.0.0.1:4318/v1/traces", data=b"", timeout=1)
    assert answer.reason == "HTTP 503 Service Unavailable"


class _TokenEndpoint(requests.adapters.BaseAdapter):
    """A provider's token endpoint: a JSON 200, and the verify each request had."""

    def __init__(self) -> None:
        super().__init__()
        self.verify: list[object] = []

    def send(self, request, **kw):  # type: ignore[no-untyped-def]
        self.verify.append(kw.get("verify"))
        answer = requests.Response()
        answer.status_code, answer.reason = 200, "OK"
        answer.headers["Content-Type"] = "application/json"
        answer._content = b'{"access_token":"t","expires_in":3600}'
        answer.url, answer.request = request.url, request
        return answer

    def close(self) -> None:
        pass


def test_a_provider_sessions_own_requests_are_not_held_to_the_otlp_checks():
    """A provider refreshes its token through its own session (requests_oauthlib
    does): only the collector's URL is checked, and another request keeps its
    own verify."""
    shared, token_endpoint = requests.Session(), _TokenEndpoint()
    shared.mount("https://", token_endpoint)
    checked_http_session(base=shared, endpoint="https://collector.example.test:4318/v1/traces")
    shared.verify = "/etc/otel/private-ca.pem"  # as the SDK sets it from the CA variable
    token = shared.post("https://login.example.test/oauth2/token", verify=True)
    assert token.json()["access_token"] == "t"
    assert token_endpoint.verify and "/etc/otel/private-ca.pem" not in token_endpoint.verify


def test_a_provider_session_whose_response_hook_is_a_bare_callable_is_taken():
    shared = requests.Session()
    shared.hooks["response"] = lambda response, *args, **kwargs: None  # requests allows it
    shared.mount("http://", _Refusing())
    session = checked_http_session(base=shared, endpoint="http://127.0.0.1:4318/v1/traces")
    answer = session.post("http://127.0.0.1:4318/v1/traces", data=b"", timeout=1)
    assert answer.reason == "HTTP 503 Service Unavailable"


class _StopsAfter(threading.Event):
    """A stop whose waits return at once, the ``n``-th one stopping."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def wait(self, timeout: float | None = None) -> bool:
        self.n -= 1
        if self.n <= 0:
            self.set()
            return True
        return False


def test_a_throttled_outage_says_its_retry_after_once_not_at_every_attempt(caplog):
    caplog.set_level("WARNING", "agentrt_otel")
    sink = OTelSink(_Failing(), stop=_StopsAfter(10), complaints=_Throttled(120.0),  # type: ignore[arg-type]
                    backoff=Backoff(initial=0.5, maximum=30.0))
    stream = EventStream()
    scenario_completed(stream)
    with pytest.raises(ExportStopped):
        sink.handle_page(stream.events)
    said = [r.getMessage() for r in caplog.records if "Retry-After" in r.getMessage()]
    assert len(said) == 1

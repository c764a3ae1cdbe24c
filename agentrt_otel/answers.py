"""What a collector's answer says beyond "accepted", which the SDK exporters ignore.

- **A redirect.** The SDK's HTTP exporter does not follow one, yet counts any
  status below 400 as success: every span sent to an address that redirects
  (an ingress moving http to https, or adding a slash) would be dropped while
  the cursor moved on. Here a redirect is a failure that names where it
  points, retried like any other until the endpoint is corrected.
- **A partial success.** OTLP lets a collector accept a request but reject
  some of its spans (``partial_success.rejected_spans``, with a message). The
  request must not be sent again, as it would be rejected again; but the
  loss is said, once per answer, on the ``agentrt_otel`` logger.
- **An answer that is not OTLP.** The SDK's HTTP exporter takes any 2xx as
  acceptance, whatever the body; a web server that is not a collector (a
  wrong port, an ingress's default page) answering 200 would be taken for
  one while every span was lost. OTLP's answer is an
  ``ExportTraceServiceResponse`` (protobuf, or JSON); any other body is a
  failure, retried like any other until the endpoint is corrected.
- **A refusal, or no HTTP/1.1 answer.** Said with its status, or in one
  sentence naming what answered instead (see :func:`checked_http_session`).
- **A proxy in the way.** A collector on this machine's loopback
  (``localhost``, ``127.0.0.1``, ``::1``) is reached directly over both
  transports, whatever the proxy variables say, as the reference's Go
  exporters reach it (``http.ProxyFromEnvironment`` never proxies one): set
  system-wide, ``HTTP_PROXY`` or ``http_proxy`` sent a sidecar's spans to a
  proxy, which cannot reach this machine's loopback, and the outage line
  blamed the collector. A failure through a proxy says so, naming it.
  Over gRPC the proxy is the one the reference's grpc-go takes (see
  :func:`grpc_proxy`), not only the lowercase variables gRPC's C core reads:
  ``HTTPS_PROXY`` sent spans through a proxy over HTTP and directly over gRPC.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
import time
from collections.abc import Callable, Collection, Mapping
from datetime import UTC
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.trace.export import SpanExporter

from agentrt_otel.complaints import (
    ATTEMPTS_LOGGER,
    CLIENT_CERTIFICATE_WANTED,
    NO_TIME_LEFT,
    collector_text,
    gist,
)

__all__ = ["GRPC_CREDENTIAL_PROVIDERS", "HTTP_CREDENTIAL_PROVIDERS", "NotOTLPAnswer",
           "RedirectRefused", "checked_grpc_exporter", "checked_http_session", "grpc_proxy",
           "loopback", "retry_after", "say_rejected"]

_log = logging.getLogger("agentrt_otel")
#: Each failed attempt's cause, heard by ExporterComplaints while installed
#: and by no one else (the SDK logs its own lines for other listeners).
_attempts = logging.getLogger(ATTEMPTS_LOGGER)
_attempts.propagate = False
_attempts.addHandler(logging.NullHandler())

#: The SDK's variables naming a plugin that makes the gRPC exporter's TLS credentials.
GRPC_CREDENTIAL_PROVIDERS = ("OTEL_PYTHON_EXPORTER_OTLP_GRPC_TRACES_CREDENTIAL_PROVIDER",
                             "OTEL_PYTHON_EXPORTER_OTLP_GRPC_CREDENTIAL_PROVIDER")
#: Likewise, the HTTP exporter's ``requests.Session`` (auth, headers).
HTTP_CREDENTIAL_PROVIDERS = ("OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
                             "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER")

#: Told (spans rejected, the collector's message) for each answer that rejected some.
OnRejected = Callable[[int, str], None]


class RedirectRefused(Exception):
    """The collector answered with a redirect, which is not an acceptance."""


class NotOTLPAnswer(Exception):
    """A 2xx answer whose body is not OTLP's: not a collector, not an acceptance."""


def say_rejected(rejected: int, message: str) -> None:
    """The default :data:`OnRejected`: one warning line."""
    _log.warning("otel: the collector accepted a request but rejected %d of its spans (%s); "
                 "they are not sent again, as OTLP says", rejected,
                 collector_text(message) or "no reason given")


def _partial_success(response: Any, on_rejected: OnRejected) -> None:
    from google.protobuf import json_format  # type: ignore[import-untyped]
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    kind = response.headers.get("Content-Type") or "none"
    try:
        if "json" in kind.lower():
            answer = json_format.Parse(response.content, ExportTraceServiceResponse())
        else:
            answer = ExportTraceServiceResponse.FromString(response.content)
    except (DecodeError, json_format.ParseError, UnicodeDecodeError):
        raise NotOTLPAnswer(
            f"HTTP {response.status_code} with an answer that is not OTLP (Content-Type "
            f"{kind}): this URL is not a collector's OTLP/HTTP receiver; give the "
            "collector's, such as http://collector:4318/v1/traces") from None
    _told(answer, on_rejected)


def _told(answer: Any, on_rejected: OnRejected) -> None:
    partial = answer.partial_success
    if partial.rejected_spans > 0:
        on_rejected(int(partial.rejected_spans), str(partial.error_message))


def loopback(host: str) -> bool:
    """Whether ``host`` (a URL's host, brackets or not) is this machine's
    loopback: ``localhost`` or a loopback address, as Go's
    ``http.ProxyFromEnvironment`` tells the hosts it never proxies."""
    host = host.strip().strip("[]").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.partition("%")[0]).is_loopback
    except ValueError:
        return False


#: What a gRPC channel takes its proxy from, first set first: gRPC's own
#: variable, then those grpc-go reads. grpc-go asks net/http's
#: ProxyFromEnvironment for an https:// URL whatever the channel's security,
#: so HTTP_PROXY never applies; x/net's httpproxy reads the uppercase name first.
_GRPC_PROXY = ("grpc_proxy", "HTTPS_PROXY", "https_proxy")
#: The hosts sent to directly, likewise: gRPC's own list, then httpproxy's.
_GRPC_NO_PROXY = ("no_grpc_proxy", "NO_PROXY", "no_proxy")


def grpc_proxy(host: str, port: str,
               environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The proxy a gRPC channel to ``host:port`` goes through, as an ``http://``
    URL, and the variable that named it; None to connect directly.

    As the reference's grpc-go decides: the first of ``grpc_proxy``,
    ``HTTPS_PROXY``, ``https_proxy`` that is set, for a TLS and a plain-text
    channel alike; never for the loopback or a host the first of
    ``no_grpc_proxy``, ``NO_PROXY``, ``no_proxy`` exempts (matched as
    :func:`_exempt` says). grpc-go speaks HTTP CONNECT to any proxy, whatever
    its scheme, as gRPC's C core does to an ``http://`` one only: the URL
    handed to it says ``http://``. A value that is no URL (no host, a port
    that is no number) is no proxy to either.

    Handed a proxy, the C core still connects directly to a host that
    ``no_grpc_proxy``, or else ``no_proxy``, exempts as it reads them
    (:func:`_core_exempts`); no proxy is said for such a host, as none is
    used (they disagree only where ``NO_PROXY`` and ``no_proxy`` differ, or
    on a ``.name`` entry, which exempts ``name`` itself there alone).
    """
    env = os.environ if environ is None else environ
    found = next(((name, env[name].strip()) for name in _GRPC_PROXY
                  if env.get(name, "").strip()), None)
    if found is None or not host or loopback(host):
        return None
    host = host.strip("[]").lower()
    exempting = next((env[name] for name in _GRPC_NO_PROXY if env.get(name, "").strip()), "")
    core = env.get("no_grpc_proxy")
    if _exempt(host, port, exempting) or _core_exempts(
            host, env.get("no_proxy", "") if core is None else core):
        return None
    name, proxy = found
    _, sep, rest = proxy.partition("://")
    url = "http://" + (rest if sep else proxy)
    parts = urlsplit(url)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # not a port number
        port_ok = False
    if not (parts.hostname and port_ok) or any(ch.isspace() for ch in url):
        return None  # no proxy's URL: grpc-go and gRPC's C core alike connect directly
    return url, name


def _exempt(host: str, port: str, no_proxy: str) -> bool:
    """Whether the comma-separated ``no_proxy`` list exempts ``host:port``, as
    Go's httpproxy matches it: ``*`` exempts every host; an address, or a CIDR
    block, exempts an address host; a name exempts itself and its subdomains
    (``.name`` and ``*.name`` its subdomains alone); an entry with a port
    exempts that port only."""
    try:
        address: Any = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in no_proxy.lower().split(","):
        entry = entry.strip()
        if entry == "*":
            return True
        try:
            block = ipaddress.ip_network(entry, strict=False) if "/" in entry else None
        except ValueError:
            block = None
        if block is not None:
            if address is not None and address in block:
                return True
            continue
        name, entry_port = _split_host_port(entry)
        if not name or entry_port not in ("", port):
            continue
        try:
            if ipaddress.ip_address(name) == address:
                return True
            continue  # an address exempts that address alone
        except ValueError:
            pass
        suffix = name[1:] if name.startswith("*.") else name
        if host.endswith(suffix if suffix.startswith(".") else "." + suffix) or host == suffix:
            return True
    return False


def _core_exempts(host: str, no_proxy: str) -> bool:
    """Whether gRPC's C core connects to ``host`` directly although handed a
    proxy, for the ``no_proxy`` list it read: an entry exempts the name it
    gives, a leading dot dropped, and its subdomains, and a CIDR block the
    addresses it holds (``*`` and entries with a port exempt nothing)."""
    for entry in no_proxy.lower().split(","):
        entry = entry.strip().removeprefix(".")
        try:
            if "/" in entry and ipaddress.ip_address(host) in ipaddress.ip_network(
                    entry, strict=False):
                return True
        except ValueError:
            pass
        if entry and (host == entry or host.endswith("." + entry)):
            return True
    return False


def _split_host_port(entry: str) -> tuple[str, str]:
    """``host:port`` or ``[v6]:port`` as Go's net.SplitHostPort splits them; an
    entry it cannot split (no port, a bare IPv6 address) is a host."""
    if entry.startswith("["):
        end = entry.find("]")
        if end > 0 and entry[end + 1:end + 2] == ":":
            return entry[1:end], entry[end + 2:]
        return entry, ""
    name, sep, port = entry.rpartition(":")
    return (name, port) if sep and ":" not in name else (entry, "")


def _through(url: str, proxy: str) -> str:
    """Words naming the proxy a request to ``url`` went through, its password
    hidden, and the variable that chose it."""
    scheme = urlsplit(url).scheme.lower()
    names = (f"{scheme}_proxy", f"{scheme}_proxy".upper(), "all_proxy", "ALL_PROXY")
    named = next((n for n in names if os.environ.get(n, "").strip() == proxy.strip()), "")
    return _through_proxy(proxy, named or "a *_proxy variable")


def _through_proxy(proxy: str, variable: str) -> str:
    """Words naming ``proxy``, its password hidden, and the variable that chose it."""
    from agentrt_otel.config import redacted

    return (f"through the proxy {redacted(proxy)} from {variable}; "
            "list the collector's host in NO_PROXY to send directly")


#: requests' words for a proxy that refused to open a tunnel to an https:// endpoint.
_TUNNEL = re.compile(r"Tunnel connection failed: ([^'\")]*)")


def _proxy_cause(error: BaseException) -> str:
    """The few words saying why a request through a proxy failed."""
    found = _TUNNEL.search(str(error))
    if found:
        return f"CONNECT refused: HTTP {found.group(1).strip()}"
    return gist(str(error))


def _no_time_left(timeout: Any) -> bool:
    """Whether a timeout given for one attempt (seconds, or requests' (connect,
    read) pair) has run out: the SDK computes it from its deadline."""
    parts = timeout if isinstance(timeout, tuple) else (timeout,)
    return any(isinstance(t, (int, float)) and t <= 0 for t in parts)


def retry_after(response: Any) -> float | None:
    """The seconds a refusal's ``Retry-After`` asks to wait (delay-seconds or
    an HTTP-date, RFC 9110), as the SDK reads it; None without a usable one."""
    from email.utils import parsedate_to_datetime

    value = (response.headers.get("Retry-After") or "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - time.time()
    return max(seconds, 0.0) if math.isfinite(seconds) else None


class _CheckedAdapter:
    """Marks the adapters :func:`checked_http_session` wrapped."""

    _inner: Any


def checked_http_session(on_rejected: OnRejected = say_rejected,
                         unsent: Collection[str] = (), base: Any = None,
                         endpoint: str | None = None) -> Any:
    """A ``requests.Session`` for the SDK's HTTP exporter whose answers are checked.

    ``base`` is the session to check (a credential provider's, whose auth,
    headers and own ``request`` are kept); default a new ``requests.Session``.
    The checks are composed into it, not subclassed: each of its transport
    adapters is wrapped, and a response hook added.

    A refusal's reason is given its status (``HTTP 503 Service Unavailable``):
    the SDK logs the bare reason of a status it retries (``Service
    Unavailable``), and nothing at all for an empty one. Each failed attempt's
    cause is also said on :data:`~agentrt_otel.complaints.ATTEMPTS_LOGGER`,
    as the SDK says none when it gives up before a retry; a refusal's record
    carries the wait its ``Retry-After`` asks for (``retry_after``), which the
    SDK honours only within its timeout. A request that met
    something other than an HTTP/1.1 collector (a gRPC port, a TLS mismatch)
    fails with one sentence saying so (:mod:`agentrt_otel.http_failures`), as
    an exception of the class ``requests`` raised, which the SDK retries alike.
    Headers named in ``unsent`` (lowercase) are taken off every request. The
    CA file the SDK set on the session from ``OTEL_EXPORTER_OTLP_CERTIFICATE``
    is the one used, whatever ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` say
    (requests lets them replace it: every request to a collector with a
    private CA failed its certificate check where either is set). An
    attempt asked for after the export's deadline is not sent: it fails as a
    ``requests`` timeout, a retryable failure whose giving-up line names no
    cause, so the previous attempt's cause stays the one said. A collector on
    the loopback is sent to directly, never through a proxy the environment
    names; a failure through a proxy names it.
    """
    import requests
    from requests.adapters import BaseAdapter
    from requests.utils import select_proxy

    from agentrt_otel.http_failures import sentence

    session = requests.Session() if base is None else base

    def check(response: Any, *args: object, **kwargs: object) -> None:
        status = response.status_code
        if 300 <= status < 400:
            where = response.headers.get("Location") or "no address"
            raise RedirectRefused(
                f"HTTP {status}: the collector redirects to {where}; give that URL as the "
                "endpoint (the exporter does not follow redirects)")
        if 200 <= status < 300 and response.content:
            _partial_success(response, on_rejected)
        if status >= 400:
            response.reason = f"HTTP {status} {response.reason or ''}".rstrip()
            _attempts.warning("%s", response.reason,
                              extra={"retry_after": retry_after(response)})

    class Checked(_CheckedAdapter, BaseAdapter):
        """The adapter ``inner``, each request through it checked."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self._inner = inner

        def send(self, request: Any, stream: bool = False, timeout: Any = None,
                 verify: Any = True, cert: Any = None, proxies: Any = None) -> Any:
            for name in unsent:
                request.headers.pop(name, None)
            if _no_time_left(timeout):
                # The SDK woke from its backoff after its deadline and asks for
                # an attempt with no time: requests would raise a ValueError
                # ("Attempted to set connect timeout to 0.0"), which the SDK
                # logs as the failure's cause in place of the previous answer.
                raise requests.exceptions.Timeout(NO_TIME_LEFT, request=request)
            if isinstance(session.verify, str):
                # The SDK set the session's CA file from OTEL_EXPORTER_OTLP_CERTIFICATE;
                # requests would let REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE replace it.
                verify = session.verify
            if loopback(urlsplit(request.url).hostname or ""):
                proxies = {}  # a proxy cannot reach this machine's loopback
            proxy = select_proxy(request.url, proxies) or ""
            try:
                response = self._inner.send(request, stream=stream, timeout=timeout,
                                            verify=verify, cert=cert, proxies=proxies)
            except requests.exceptions.Timeout:
                raise  # "no answer within the export timeout" says it
            except (requests.exceptions.ConnectionError, requests.exceptions.InvalidSchema) as err:
                if isinstance(err, requests.exceptions.InvalidSchema) and not proxy:
                    raise  # a socks:// proxy without PySocks is the one InvalidSchema said here
                said = sentence(err)
                if proxy:
                    said = f"{said or _proxy_cause(err)} ({_through(request.url, proxy)})"
                _attempts.warning("%s", said or err)
                if said is None:
                    raise
                raise type(err)(said, request=request) from err
            if proxy and response.status_code >= 400:
                response.reason = f"{response.reason} ({_through(request.url, proxy)})"
            check(response)
            return response

        def close(self) -> None:
            self._inner.close()

    # Only the collector's URL is checked: a provider's session also carries
    # its own requests (a token refresh) and may be shared with other exporters.
    for prefix in ([endpoint] if endpoint else list(session.adapters)):
        adapter = session.get_adapter(prefix)
        while isinstance(adapter, _CheckedAdapter):
            adapter = adapter._inner
        session.mount(prefix, Checked(adapter))
    return session


#: gRPC's words for a connection the server closed after the TLS handshake (one
#: closed during it says "Handshake read failed (Socket closed)").
_CLOSED_AFTER_HANDSHAKE = re.compile(r"(?:^|: )Socket closed$")


def _sdk_sends_client_certificate(env: Mapping[str, str] | None = None) -> bool:
    """Whether the SDK's gRPC span exporter, given no credentials, may send a
    client certificate: a credential plugin may; else it reads the
    traces-specific files when ``..._TRACES_CERTIFICATE`` is set, the generic
    ones when ``OTEL_EXPORTER_OTLP_CERTIFICATE`` is, and none without a CA file."""
    env = os.environ if env is None else env
    if any(env.get(name) for name in GRPC_CREDENTIAL_PROVIDERS):
        return True
    part = "TRACES_" if env.get("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE") is not None else ""
    return bool(env.get(f"OTEL_EXPORTER_OTLP_{part}CERTIFICATE")
                and env.get(f"OTEL_EXPORTER_OTLP_{part}CLIENT_CERTIFICATE"))


def checked_grpc_exporter(on_rejected: OnRejected = say_rejected,
                          proxy: tuple[str, str] | None = None,
                          sends_certificate: bool | None = None,
                          **options: Any) -> SpanExporter:
    """The SDK's gRPC span exporter, built with ``options``, whose answers are checked.

    The SDK drops the answer of its stub's ``Export``; the stub is wrapped
    each time the exporter makes one (it makes a new one to reconnect). An
    attempt asked for after the export's deadline is not made, as over HTTP:
    gRPC would fail it with DEADLINE_EXCEEDED, said in place of the cause.
    A failure says the proxy it went through (``proxy``: its URL and the
    variable naming it, as :func:`grpc_proxy` gives them), its password
    hidden. A TLS connection the collector closed once it was made, when no
    client certificate was sent, is said to be what it most likely is: gRPC
    says only "Socket closed" of a collector that wants one. Whether one is
    sent is ``sends_certificate``, when the caller built the ``credentials``;
    else it is guessed from the variables the SDK reads.
    """
    import grpc  # type: ignore[import-untyped]
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    class Failed(grpc.RpcError):  # type: ignore[misc]
        """A failure said in other words than gRPC's."""

        def __init__(self, code: grpc.StatusCode, details: str, metadata: Any = ()) -> None:
            super().__init__(details)
            self._code, self._details, self._metadata = code, details, metadata

        def code(self) -> grpc.StatusCode:
            return self._code

        def details(self) -> str:
            return self._details

        def trailing_metadata(self) -> Any:
            return self._metadata

    if sends_certificate is None:
        sends_certificate = bool(options.get("credentials")) or _sdk_sends_client_certificate()
    wants_certificate = not (options.get("insecure") or sends_certificate)

    def said(error: Any) -> str:
        details = str(error.details() or "")
        if (wants_certificate and error.code() == grpc.StatusCode.UNAVAILABLE
                and _CLOSED_AFTER_HANDSHAKE.search(details)):
            details = CLIENT_CERTIFICATE_WANTED
        return f"{details} ({_through_proxy(*proxy)})" if proxy else details

    class CheckedExporter(OTLPSpanExporter):
        def _initialize_channel_and_stub(self) -> None:
            super()._initialize_channel_and_stub()  # type: ignore[no-untyped-call]
            client: Any = self._client
            export = client.Export

            def checked(*args: Any, **kwargs: Any) -> Any:
                if _no_time_left(kwargs.get("timeout")):
                    raise Failed(grpc.StatusCode.DEADLINE_EXCEEDED, NO_TIME_LEFT)
                try:
                    answer = export(*args, **kwargs)
                except grpc.RpcError as err:
                    told = said(err)
                    if told == (err.details() or ""):
                        raise
                    raise Failed(err.code(), told, err.trailing_metadata()) from err
                _told(answer, on_rejected)
                return answer

            client.Export = checked

    return CheckedExporter(**options)


"""Exporter settings, resolved once from arguments and OTEL_* variables.

Every setting follows one precedence: an argument (a CLI flag),
then the traces-specific variable, then the generic one, then the default.
What is resolved here is passed to the SDK exporter explicitly, so the
settings printed or tested are the ones in use. (TLS certificate files and
compression are left to the SDK, which reads their standard variables.)

==========================  =================================================
``exporter``                ``OTEL_TRACES_EXPORTER``: ``otlp`` (or empty),
                            ``console`` or ``none``
``protocol``                ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, then
                            ``OTEL_EXPORTER_OTLP_PROTOCOL``: ``http/protobuf``
                            (or empty) or ``grpc``; ``http/json`` is refused
``endpoint``                ``..._TRACES_ENDPOINT`` (used as is for HTTP), then
                            ``OTEL_EXPORTER_OTLP_ENDPOINT`` (HTTP appends
                            ``/v1/traces``); default ``http://localhost:4318/
                            v1/traces`` or, for gRPC, ``http://localhost:4317``
``headers``                 ``..._TRACES_HEADERS``, then ``..._HEADERS``
                            (``k=v,k2=v2``, values percent-decoded)
``insecure``                ``..._TRACES_INSECURE``, then ``..._INSECURE``;
                            default: plain text exactly when the scheme is http
``timeout``                 ``..._TRACES_TIMEOUT``, then ``..._TIMEOUT``, in
                            milliseconds as the OpenTelemetry specification and
                            the reference say (the Python SDK reads seconds);
                            default 10 s
==========================  =================================================

An endpoint argument without a path (``http://collector:4318``) gets
``/v1/traces`` for HTTP; one without a scheme (``collector:4318``) is plain
text when ``insecure`` and TLS otherwise.

The resource is ``service.name=agentrt`` and the SDK's ``telemetry.sdk.*``
attributes, overridden by ``OTEL_RESOURCE_ATTRIBUTES`` and then
``OTEL_SERVICE_NAME``. It never carries the SDK's random
``service.instance.id``, so two exports of one database are identical.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Literal
from urllib.parse import unquote, urlsplit

from opentelemetry.sdk.resources import (
    SERVICE_NAME,
    TELEMETRY_SDK_LANGUAGE,
    TELEMETRY_SDK_NAME,
    TELEMETRY_SDK_VERSION,
    Resource,
)
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.version import __version__ as _SDK_VERSION

from agentrt.errors import AgentrtError

__all__ = [
    "DEFAULT_SERVICE_NAME",
    "ConfigError",
    "OTelConfig",
    "build_exporter",
    "build_resource",
    "resolve_config",
]

DEFAULT_SERVICE_NAME = "agentrt"
DEFAULT_TIMEOUT = 10.0
_HTTP_DEFAULT = "http://localhost:4318"
_GRPC_DEFAULT = "http://localhost:4317"
_TRACES_PATH = "/v1/traces"

Exporter = Literal["otlp", "console", "none"]
OTLPProtocol = Literal["http/protobuf", "grpc"]


class ConfigError(AgentrtError):
    """A setting that cannot be used; the message names the value and the fix."""

    base = "otel: configuration"

    def __init__(self, sentence: str) -> None:
        self.detail = sentence
        Exception.__init__(self, sentence)


@dataclass(frozen=True, slots=True)
class OTelConfig:
    """Everything needed to build the exporter and the resource."""

    exporter: Exporter = "otlp"
    protocol: OTLPProtocol = "http/protobuf"
    endpoint: str = _HTTP_DEFAULT + _TRACES_PATH
    headers: Mapping[str, str] = field(default_factory=dict)
    insecure: bool = True
    timeout: float = DEFAULT_TIMEOUT
    resource_attributes: Mapping[str, str] = field(default_factory=dict)

    def resource(self) -> Resource:
        return build_resource(self.resource_attributes)


def _first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first variable set to a non-blank value, with its name."""
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return name, value
    return None


def _exporter(arg: str | None, env: Mapping[str, str]) -> Exporter:
    raw = arg if arg is not None else env.get("OTEL_TRACES_EXPORTER", "")
    value = raw.strip().lower()
    if value in ("", "otlp"):
        return "otlp"
    if value == "console":
        return "console"
    if value == "none":
        return "none"
    raise ConfigError(f'otel: OTEL_TRACES_EXPORTER "{raw.strip()}": otlp, console, or none')


def _protocol(arg: str | None, env: Mapping[str, str]) -> OTLPProtocol:
    if arg is not None:
        raw = arg.strip()
    else:
        found = _first(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
        raw = found[1] if found else ""
    value = raw.lower()
    if value in ("", "http/protobuf"):
        return "http/protobuf"
    if value == "grpc":
        return "grpc"
    raise ConfigError(f'otel: OTLP protocol "{raw}": http/protobuf or grpc')


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value == "true":
        return True
    if value == "false":
        return False
    raise ConfigError(f'otel: {name} "{raw}": true or false')


def _insecure(arg: bool | None, env: Mapping[str, str]) -> bool | None:
    if arg is not None:
        return arg
    found = _first(env, "OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE")
    return _bool(*found) if found else None


def parse_headers(name: str, raw: str) -> dict[str, str]:
    """``k=v,k2=v2`` (W3C baggage form, values percent-decoded)."""
    out: dict[str, str] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f'otel: {name} "{raw}": write each header as key=value, separated by commas')
        out[key.lower()] = unquote(value.strip())
    return out


def _headers(arg: Mapping[str, str] | None, env: Mapping[str, str]) -> dict[str, str]:
    if arg is not None:
        return {k.strip().lower(): v for k, v in arg.items()}
    found = _first(env, "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")
    return parse_headers(*found) if found else {}


def _timeout(arg: float | None, env: Mapping[str, str]) -> float:
    if arg is not None:
        if arg <= 0:
            raise ConfigError(f"otel: timeout {arg} s: give a positive number of seconds")
        return float(arg)
    found = _first(env, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
    if found is None:
        return DEFAULT_TIMEOUT
    name, raw = found
    try:
        ms = float(raw)
    except ValueError:
        ms = -1.0
    if not ms > 0:
        raise ConfigError(f'otel: {name} "{raw}": give a positive number of milliseconds')
    return ms / 1000.0


def _with_scheme(endpoint: str, insecure: bool | None) -> str:
    if "://" in endpoint:
        return endpoint
    return ("http://" if insecure else "https://") + endpoint


def _endpoint(arg: str | None, protocol: OTLPProtocol, insecure: bool | None,
              env: Mapping[str, str]) -> str:
    if protocol == "grpc":
        if arg is not None and arg.strip():
            return arg.strip()
        found = _first(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
        return found[1] if found else _GRPC_DEFAULT
    if arg is not None and arg.strip():
        url = _with_scheme(arg.strip(), insecure)
        return url.rstrip("/") + _TRACES_PATH if urlsplit(url).path in ("", "/") else url
    specific = _first(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if specific is not None:
        return _with_scheme(specific[1], insecure)
    generic = _first(env, "OTEL_EXPORTER_OTLP_ENDPOINT")
    base = _with_scheme(generic[1], insecure) if generic else _HTTP_DEFAULT
    return base.rstrip("/") + _TRACES_PATH


def resource_attributes(env: Mapping[str, str]) -> dict[str, str]:
    """``service.name=agentrt``, overridden by ``OTEL_RESOURCE_ATTRIBUTES``
    (``k=v,...``, percent-decoded) and then ``OTEL_SERVICE_NAME``."""
    attrs = {SERVICE_NAME: DEFAULT_SERVICE_NAME}
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attrs[key.strip()] = unquote(value.strip())
    service = env.get("OTEL_SERVICE_NAME", "").strip()
    if service:
        attrs[SERVICE_NAME] = service
    return attrs


class _HashedResource(Resource):
    """A ``Resource`` that computes its hash once.

    The SDK's encoder groups every span it exports by resource, hashing the
    resource each time, and ``Resource.__hash__`` serialises the attributes to
    JSON to do it (6.5 µs, a tenth of encoding a span; see
    docs/performance.md). The attributes are immutable, so the hash is too; it
    is the same value, and equality is ``Resource``'s own.
    """

    def __init__(self, attributes: Mapping[str, str]) -> None:
        super().__init__(dict(attributes))
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


def build_resource(attributes: Mapping[str, str]) -> Resource:
    """The SDK's ``telemetry.sdk.*`` attributes plus ``attributes``, built
    without the detectors (so without a random ``service.instance.id``)."""
    attrs: dict[str, str] = {
        TELEMETRY_SDK_LANGUAGE: "python",
        TELEMETRY_SDK_NAME: "opentelemetry",
        TELEMETRY_SDK_VERSION: _SDK_VERSION,
    }
    attrs.update(attributes)
    return _HashedResource(attrs)


def resolve_config(
    *,
    exporter: str | None = None,
    protocol: str | None = None,
    endpoint: str | None = None,
    headers: Mapping[str, str] | None = None,
    insecure: bool | None = None,
    timeout: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> OTelConfig:
    """Resolve every setting once; arguments beat variables (None = not given).

    Raises :class:`ConfigError` with one sentence naming the value and the fix.
    """
    env = os.environ if environ is None else environ
    kind = _exporter(exporter, env)
    proto = _protocol(protocol, env) if kind == "otlp" else "http/protobuf"
    secure_arg = _insecure(insecure, env)
    url = _endpoint(endpoint, proto, secure_arg, env)
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    plain = scheme == "http" if secure_arg is None else secure_arg
    if scheme == "https":
        plain = False
    return OTelConfig(
        exporter=kind,
        protocol=proto,
        endpoint=url,
        headers=_headers(headers, env),
        insecure=plain,
        timeout=_timeout(timeout, env),
        resource_attributes=resource_attributes(env),
    )


def build_exporter(
    config: OTelConfig, *, console_out: IO[str] | None = None
) -> SpanExporter | None:
    """The SDK exporter the config names; None for ``none``."""
    if config.exporter == "none":
        return None
    if config.exporter == "console":
        if console_out is not None:
            return ConsoleSpanExporter(out=console_out)
        return ConsoleSpanExporter()
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(
            endpoint=config.endpoint,
            insecure=config.insecure,
            headers=dict(config.headers) or None,
            timeout=config.timeout,
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(
        endpoint=config.endpoint,
        headers=dict(config.headers) or None,
        timeout=config.timeout,
    )

"""Exporter settings, resolved once from arguments and OTEL_* variables.

Every setting follows one precedence: an argument (a CLI flag),
then the traces-specific variable, then the generic one, then the default.
What is resolved here is passed to the SDK exporter explicitly, so the
settings printed or tested are the ones in use.

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
                            (``k=v,k2=v2``, names and values percent-decoded
                            as the SDK decodes them)
``compression``             ``..._TRACES_COMPRESSION``, then ``..._COMPRESSION``:
                            ``none`` (or empty), ``gzip``, or, over HTTP only,
                            ``deflate``
``insecure``                gRPC only: the argument, else the endpoint's
                            scheme (plain text for http, TLS for https); for
                            an endpoint without one, ``..._TRACES_INSECURE``,
                            then ``..._INSECURE`` ("true" in any case is true,
                            anything else false, with a warning unless
                            "false"), default TLS
``timeout``                 ``..._TRACES_TIMEOUT``, then ``..._TIMEOUT``, in
                            milliseconds as the OpenTelemetry specification and
                            the reference say (the Python SDK reads seconds);
                            default 10 s
==========================  =================================================

A variable set to the empty string (or blanks) counts as unset, as the
specification says; an empty argument is refused, and an argument of the wrong
type too. Everything is checked here, so a value the
exporter could never use is one sentence (a :class:`ConfigError`) before
anything is sent, instead of an export retried for ever:

- An HTTP endpoint is a URL: scheme ``http`` or ``https``, a host, and a port
  from 1 to 65535 if one is given (the specification requires the scheme).
  An endpoint argument without a path (``http://collector:4318``) gets
  ``/v1/traces``.
- A gRPC endpoint is such a URL, or, as the specification lets a gRPC
  endpoint take any form the gRPC client accepts, ``host:port`` without a
  scheme (TLS unless ``insecure``) or a gRPC target of the ``dns:///``,
  ``unix:``, ``unix-abstract:``, ``ipv4:`` or ``ipv6:`` kind.
- A header name is an HTTP token (RFC 9110 ``tchar``); a value is visible
  ASCII and Latin-1 letters, spaces and tabs, on one line. gRPC metadata is
  narrower: names of ``a-z 0-9 - _ .`` (not ``-bin``, which carries bytes)
  and values of printable ASCII.
- TLS certificate files are read here, each file from its traces-specific
  variable, then the generic one, stripped, and given to the exporter of
  either transport (see :func:`_grpc_credentials`); the SDK read them raw.
- What the SDK's exporters still read from the environment themselves when
  built, they read with the blank OTLP variables unset (see
  :func:`_read_as_resolved`; builds in one process take turns).
- ``OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES``, which the SDK's
  gRPC exporter reads itself, is a comma-separated list of gRPC status code
  names (any case), checked here for gRPC.
- A credential provider plugin (``OTEL_PYTHON_EXPORTER_OTLP_{HTTP,GRPC}_
  [TRACES_]CREDENTIAL_PROVIDER``, the traces-specific variable first) is
  loaded here, as the SDK would load it, and refused in one sentence when it
  is not installed, fails, or makes the wrong type (see
  :func:`_credential_plugin`); an HTTP one's session is the one sent through.
- The proxy, over gRPC, is the one the reference's grpc-go takes from the
  environment (``agentrt_otel.answers.grpc_proxy``), handed to the channel
  alone.

The resource is ``service.name=agentrt`` and the SDK's ``telemetry.sdk.*``
attributes, overridden by ``OTEL_RESOURCE_ATTRIBUTES`` and then
``OTEL_SERVICE_NAME``. It never carries the SDK's random
``service.instance.id``, so two exports of one database are identical. An
``OTEL_RESOURCE_ATTRIBUTES`` that does not decode (an entry without ``=``, an
empty key, a bad percent escape) is discarded whole and reported, as the
specification's resource SDK says: the export goes on, and
:attr:`OTelConfig.warnings` holds the sentence to print.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, Literal, cast
from urllib.parse import SplitResult, unquote, urlsplit

from opentelemetry.sdk.resources import (
    SERVICE_NAME,
    TELEMETRY_SDK_LANGUAGE,
    TELEMETRY_SDK_NAME,
    TELEMETRY_SDK_VERSION,
    Resource,
)
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.version import __version__ as _SDK_VERSION

from agentrt.errors import AgentrtError, described

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
Compression = Literal["none", "gzip", "deflate"]

#: RFC 9110 ``token``: a header name.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: RFC 9110 ``field-value`` as Python's HTTP stack sends it: visible ASCII,
#: spaces, tabs and printable Latin-1 (the C1 controls are not printable).
_HTTP_VALUE = re.compile(r"[\t\x20-\x7e\xa0-\xff]*")
#: gRPC metadata (PROTOCOL-HTTP2.md): lowercase names, printable ASCII values.
_GRPC_KEY = re.compile(r"[0-9a-z_.\-]+")
_GRPC_VALUE = re.compile(r"[\x20-\x7e]*")
#: A header entry as ``parse_env_headers`` sees it: percent-encoded (the OTel
#: specification's form, after W3C Baggage: no space, ``"``, ``,``, ``;`` or
#: backslash in a value), or the same with spaces, which the SDK takes as written.
_ENCODED_VALUE = r"\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e"
_ENCODED_ENTRY = re.compile(rf"{_TOKEN.pattern}[ \t]*=[ \t]*[{_ENCODED_VALUE}]*")
_SPACED_ENTRY = re.compile(rf"{_TOKEN.pattern}[ \t]*=[ \t]*[ {_ENCODED_VALUE}]*")
#: A host name as RFC 3986 ``reg-name`` allows it, and non-ASCII letters (IDN).
_REG_NAME = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=%\u00a0-\U0010ffff]+")
_PORT = re.compile(r"[0-9]{1,5}")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
#: gRPC name-resolver targets the gRPC client takes as they are.
_GRPC_TARGETS = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:")


class ConfigError(AgentrtError):
    """A setting that cannot be used; the message names the value and the fix."""

    base = "otel: configuration"

    def __init__(self, sentence: str) -> None:
        self.detail = sentence
        Exception.__init__(self, sentence)


@dataclass(frozen=True, slots=True)
class OTelConfig:
    """Everything needed to build the exporter and the resource.

    ``warnings`` are sentences about settings that were ignored (a
    ``OTEL_RESOURCE_ATTRIBUTES`` that does not decode), for the caller to show.
    """

    exporter: Exporter = "otlp"
    protocol: OTLPProtocol = "http/protobuf"
    endpoint: str = _HTTP_DEFAULT + _TRACES_PATH
    headers: Mapping[str, str] = field(default_factory=dict)
    insecure: bool = True
    timeout: float = DEFAULT_TIMEOUT
    resource_attributes: Mapping[str, str] = field(default_factory=dict)
    compression: Compression = "none"
    warnings: tuple[str, ...] = ()

    def resource(self) -> Resource:
        return build_resource(self.resource_attributes)


def _shown(value: str, limit: int = 100) -> str:
    """``value`` in double quotes on one line: quotes, backslashes and
    characters that do not print are escaped, and a long value is cut."""
    out = []
    for ch in value[:limit]:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return '"' + "".join(out) + ('..."' if len(value) > limit else '"')


#: User info: after a scheme's "//", or at the start of a gRPC target without one.
_USERINFO = re.compile(r"(?:(?<=://)|^)([^/@?#]*)@")


def _shown_url(value: str) -> str:
    return _shown(redacted(value))


def redacted(url: str) -> str:
    """``url`` with the password of its user info, if any, as ``***``: an
    endpoint is printed in errors and outage lines, a password must not be."""
    return _USERINFO.sub(
        lambda m: (m.group(1).split(":", 1)[0] + ":***@") if ":" in m.group(1)
        else m.group(0), url)


def _char(ch: str) -> str:
    """A character named so that it shows: ``U+000A``, ``"€" (U+20AC)``."""
    code = f"U+{ord(ch):04X}"
    return f'"{ch}" ({code})' if ch.isprintable() and not ch.isspace() else code


def _first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first variable set to a non-blank value, with its name."""
    for name in names:
        value = _variable(env, name).strip()
        if value:
            return name, value
    return None


def _variable(env: Mapping[str, str], name: str) -> str:
    """``env[name]`` ('' when unset), refused when it is not valid UTF-8 (Python
    holds such bytes as lone surrogates, which no header or URL can carry)."""
    value = env.get(name, "")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"otel: ${name} is not valid UTF-8; set it in UTF-8") from None
    return value


def _exporter(arg: str | None, env: Mapping[str, str]) -> Exporter:
    raw = arg if arg is not None else _variable(env, "OTEL_TRACES_EXPORTER")
    value = raw.strip().lower()
    if value in ("", "otlp"):
        return "otlp"
    if value == "console":
        return "console"
    if value == "none":
        return "none"
    if "," in value:
        raise ConfigError(f"otel: OTEL_TRACES_EXPORTER {_shown(raw.strip())}: this command sends "
                          "to one exporter at a time; give one of otlp, console, or none")
    raise ConfigError(f"otel: OTEL_TRACES_EXPORTER {_shown(raw.strip())}: otlp, console, or none")


def _protocol(arg: str | None, env: Mapping[str, str]) -> OTLPProtocol:
    source = ""
    if arg is not None:
        raw = arg.strip()
    else:
        found = _first(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
        raw = found[1] if found else ""
        source = f" (set by {found[0]})" if found else ""
    value = raw.lower()
    if value in ("", "http/protobuf"):
        return "http/protobuf"
    if value == "grpc":
        return "grpc"
    # The reference's sentence, and which of the two variables holds the value.
    raise ConfigError(f"otel: OTLP protocol {_shown(raw)}: http/protobuf or grpc{source}")


def _compression(env: Mapping[str, str], protocol: OTLPProtocol) -> Compression:
    found = _first(env, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION")
    if found is None:
        return "none"
    name, raw = found
    value = raw.lower()
    if value in ("none", "gzip"):
        return "none" if value == "none" else "gzip"
    if value == "deflate":
        if protocol == "http/protobuf":
            return "deflate"
        raise ConfigError(f"otel: {name} {_shown(raw)}: gzip or none over grpc (a collector's "
                          "gRPC receiver does not take deflate; http/protobuf does)")
    choices = "gzip, deflate, or none" if protocol == "http/protobuf" else "gzip or none"
    raise ConfigError(f"otel: {name} {_shown(raw)}: {choices}")


def _bool(name: str, raw: str, warnings: list[str]) -> bool:
    """A boolean variable as the specification reads one: "true" in any case
    is true, anything else false, with a warning when it is not "false"."""
    value = raw.strip().lower()
    if value not in ("true", "false"):
        warnings.append(f"otel: {name} {_shown(raw.strip())} is not true or false, so it counts "
                        "as false (TLS), as the OpenTelemetry specification says: write true "
                        "for plain text, or false")
    return value == "true"


def _plain_text(arg: bool | None, url: str, env: Mapping[str, str],
                warnings: list[str]) -> bool:
    """Whether the gRPC channel is plain text: the argument's choice (the
    ``--insecure`` flag), else the endpoint's scheme, http or https; the
    ``_INSECURE`` variables count only for an endpoint without one (``host:port``,
    ``dns:///...``), as the specification says."""
    scheme = url.partition(":")[0].lower() if "://" in url else ""
    if arg and scheme == "https":
        # The flag is a request the https URL contradicts (not "skip verification").
        raise ConfigError(f"otel: --insecure asks for plain text, but the endpoint "
                          f"{_shown_url(url)} asks for TLS: give an http:// endpoint, or leave "
                          "--insecure out (a certificate to trust goes in "
                          "OTEL_EXPORTER_OTLP_CERTIFICATE)")
    if arg is not None:
        return arg
    if scheme in ("http", "https"):
        return scheme == "http"
    found = _first(env, "OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE")
    return _bool(*found, warnings) if found else False


def parse_headers(name: str, raw: str) -> dict[str, str]:
    """``k=v,k2=v2`` from the variable ``name``, read as the SDK exporters read
    it (``opentelemetry.util.re.parse_env_headers``): names and values
    percent-decoded, then stripped; names lowercased; a name given twice keeps
    its last value. The SDK's HTTP exporter reads the variable itself and adds
    what it finds to the headers given here, so a name read otherwise would
    be sent twice.

    An entry whose value holds a space, which percent-encoding would have
    turned into ``%20``, is taken as written, nothing decoded, as the SDK
    takes it (its "liberal" form, for values other SDKs take unencoded).

    Stricter than the SDK, which skips or garbles such entries: an entry that
    is not ``key=value``, escapes that are not UTF-8 (the SDK sends U+FFFD),
    and a name that stops being a header name once decoded are refused.
    """
    out: dict[str, str] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            # Never the value itself: a header may carry a secret.
            raise ConfigError(
                f"otel: {name}: an entry is not key=value; write each header as key=value, "
                "separated by commas")
        if _written_literally(item):
            out[key.lower()] = value.strip()
            continue
        header = _decoded_name(name, key)
        try:
            out[header] = unquote(value.strip(), errors="strict").strip()
        except UnicodeDecodeError:
            raise ConfigError(
                f"otel: {name}: the value of header {_shown(header)} has percent escapes "
                "that are not UTF-8; percent-encode its text as UTF-8 (a space is %20)"
            ) from None
    return out


def _written_literally(entry: str) -> bool:
    """Whether the SDK takes ``entry`` as written, nothing decoded: what keeps
    it from the encoded form is a space in its value, and nothing else."""
    entry = entry.strip()
    return _ENCODED_ENTRY.fullmatch(entry) is None and _SPACED_ENTRY.fullmatch(entry) is not None


def _decoded_name(source: str, key: str) -> str:
    """A header name from ``source`` percent-decoded, stripped and lowercased,
    as the SDK reads it; refused when decoding leaves no header name (a name
    is not a secret, so it is shown)."""
    try:
        header = unquote(key, errors="strict").strip().lower()
    except UnicodeDecodeError:
        raise ConfigError(
            f"otel: {source}: header name {_shown(key)} has percent escapes that are not "
            "UTF-8; write the name as it is, in ASCII") from None
    if header != key.lower() and _TOKEN.fullmatch(header) is None:
        raise ConfigError(
            f"otel: {source}: header name {_shown(key)} decodes to {_shown(header)}, which is "
            "not a header name (letters, digits and !#$%&'*+-.^_`|~, with no spaces); "
            "percent-encode values only")
    return header


def _check_headers(source: str, headers: Mapping[str, str], protocol: OTLPProtocol) -> None:
    """Refuse a header the transport could never send (a request that fails
    before it leaves, or that a collector refuses, on every attempt).

    ``source`` names where the headers came from (a variable or ``--header``).
    The message names the header, not its value, which may be a secret.
    """
    for key, value in headers.items():
        def refuse(why: str, key: str = key) -> ConfigError:
            return ConfigError(f"otel: header {_shown(key)} (from {source}): {why}")

        grpc = protocol == "grpc"
        if grpc and _GRPC_KEY.fullmatch(key) is None:
            raise refuse('a gRPC metadata name holds only lowercase letters, digits, "-", "_" '
                         'and "."')
        if grpc and key.endswith("-bin"):
            raise refuse("a name ending in -bin is binary gRPC metadata, which a header "
                         "setting cannot carry; rename it")
        if not grpc and _TOKEN.fullmatch(key) is None:
            raise refuse("a header name is letters, digits and !#$%&'*+-.^_`|~, with no spaces")
        allowed = _GRPC_VALUE if grpc else _HTTP_VALUE
        bad = next((ch for ch in value if allowed.fullmatch(ch) is None), None)
        if bad is not None:
            raise refuse(f"its value holds {_char(bad)}; " + (
                "a gRPC metadata value is printable ASCII on one line" if grpc else
                "a header value is visible ASCII or Latin-1 text, spaces and tabs, on one line"))


def _headers(arg: Mapping[str, str] | None, env: Mapping[str, str],
             protocol: OTLPProtocol) -> dict[str, str]:
    if arg is not None:
        headers = {k.strip().lower(): v for k, v in arg.items()}
        _check_headers("--header", headers, protocol)
        return headers
    found = _first(env, "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")
    if found is None:
        return {}
    headers = parse_headers(*found)
    _check_headers(found[0], headers, protocol)
    return headers


#: The export timeout's bounds: a wait the SDK can keep (it fails every
#: attempt below a millisecond, and overflows its clock near infinity).
MIN_TIMEOUT, MAX_TIMEOUT = 0.001, 86_400.0


def _timeout(arg: float | None, env: Mapping[str, str]) -> float:
    if arg is not None:
        if not MIN_TIMEOUT <= arg <= MAX_TIMEOUT:
            raise ConfigError(f"otel: timeout {arg} s: give a number of seconds from "
                              f"{MIN_TIMEOUT} to {MAX_TIMEOUT:.0f}")
        return float(arg)
    found = _first(env, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
    if found is None:
        return DEFAULT_TIMEOUT
    name, raw = found
    try:
        ms = float(raw)
    except ValueError:
        ms = -1.0
    if not MIN_TIMEOUT * 1000 <= ms <= MAX_TIMEOUT * 1000:
        raise ConfigError(f"otel: {name} {_shown(raw)}: give a number of milliseconds from "
                          f"1 to {MAX_TIMEOUT * 1000:.0f} (a day)")
    return ms / 1000.0


# -- endpoints ----------------------------------------------------------------


def _host_port(hostport: str) -> tuple[str, str | None] | str:
    """``host[:port]`` (RFC 3986 authority without user info) checked: the
    host and the port text, or what is wrong with it."""
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            return 'its IPv6 address has no closing "]"'
        host, rest = hostport[1:end], hostport[end + 1:]
        try:
            ipaddress.IPv6Address(host.replace("%25", "%"))
        except ValueError:
            return f"[{host}] is not an IPv6 address"
        if rest and not rest.startswith(":"):
            return f'"{rest}" follows the IPv6 address'
        port = rest[1:] if rest else None
    else:
        host, sep, port_text = hostport.rpartition(":")
        if not sep:
            host, port = hostport, None
        else:
            port = port_text
        if not host:
            return "it names no host"
        if _REG_NAME.fullmatch(host) is None:
            return f"host {_shown(redacted(host))} is not a host name or address"
    if port is not None and (_PORT.fullmatch(port) is None or not 0 < int(port) <= 65535):
        return f"port {_shown(port)} is not a number from 1 to 65535"
    return host, port


def _url_problem(value: str) -> tuple[SplitResult, str]:
    """``value`` split as a URL, and '' or what keeps it from being a
    collector's URL (scheme http or https, a host, a valid port)."""
    try:
        url = urlsplit(value)
    except ValueError as exc:  # "Invalid IPv6 URL", a netloc NFKC cannot keep
        return SplitResult("", "", "", "", ""), f"it is not a URL ({exc})"
    if "://" not in value:
        return url, "it has no http:// or https:// in front"
    if url.scheme.lower() not in ("http", "https"):
        return url, f'its scheme "{url.scheme}" is not http or https'
    checked = _host_port(url.netloc.rpartition("@")[2])
    if isinstance(checked, str):
        return url, checked
    return url, ""


def _unprintable(value: str) -> str:
    """What is wrong with an endpoint holding a space or a control character, or ''."""
    bad = next((ch for ch in value if ch.isspace() or not ch.isprintable()), None)
    return "" if bad is None else f"it holds {_char(bad)}"


def _refuse_endpoint(source: str, value: str, problem: str, example: str) -> ConfigError:
    return ConfigError(
        f"otel: {source} {_shown_url(value)}: {problem}; give a URL such as {example}")


def _http_endpoint(source: str, value: str, *, append: bool, always: bool = False) -> str:
    """A checked HTTP endpoint; ``append`` adds ``/v1/traces`` to the path
    (always, or only to an empty path)."""
    url, problem = _url_problem(value)
    problem = _unprintable(value) or problem
    if problem:
        raise _refuse_endpoint(source, value, problem, "http://localhost:4318")
    if not append or (not always and url.path not in ("", "/")):
        return value
    return url._replace(path=url.path.rstrip("/") + _TRACES_PATH).geturl()


def _grpc_host(source: str, value: str, host: str) -> None:
    """Refuse a host gRPC's resolver cannot take: it has no IDNA, so a
    non-ASCII name fails every attempt ("Misformatted domain name")."""
    if host.isascii():
        return
    try:
        ascii_host = " (" + host.encode("idna").decode("ascii") + ")"
    except UnicodeError:
        ascii_host = ""
    raise ConfigError(f"otel: {source} {_shown_url(value)}: gRPC takes a host name in ASCII only; "
                      f"give its ASCII form{ascii_host}")


def _grpc_endpoint(source: str, value: str, warnings: list[str]) -> str:
    """A checked gRPC endpoint, as given (the SDK keeps a URL's host and port)."""
    problem = _unprintable(value)
    if problem:
        raise _refuse_endpoint(source, value, problem, "http://localhost:4317")
    lowered = value.lower()
    if "://" in value and lowered.startswith(("http://", "https://")):
        url, problem = _url_problem(value)
        if problem:
            raise _refuse_endpoint(source, value, problem, "http://localhost:4317")
        if "@" in url.netloc:
            # The SDK hands "user:pw@host:port" to gRPC as the host: every attempt fails.
            raise ConfigError(f"otel: {source} {_shown_url(value)}: a gRPC endpoint takes no "
                              "user:password@; send credentials as a header, such as "
                              "--header authorization=...")
        _grpc_host(source, value, url.hostname or "")
        if url.path not in ("", "/"):
            warnings.append(f"otel: {source} {_shown_url(value)}: gRPC uses the host and port "
                            f"alone, so the path {_shown(url.path)} is ignored (a URL with a "
                            "path is OTLP/HTTP's: --protocol http/protobuf)")
        return value
    if lowered.startswith(_GRPC_TARGETS):
        scheme, _, rest = value.partition(":")
        if lowered.startswith("dns://") and not lowered.startswith("dns:///"):
            raise ConfigError(f"otel: {source} {_shown_url(value)}: the exporter cannot use a DNS "
                              "server authority; give dns:///host:port")
        if not rest.strip("/"):
            raise ConfigError(f"otel: {source} {_shown_url(value)}: a gRPC {scheme}: target needs "
                              "an address after the colon")
        return value
    if "://" in value:
        raise _refuse_endpoint(source, value, f'its scheme "{value.partition(":")[0]}" is not '
                               "http or https", "http://localhost:4317")
    checked = _host_port(value)
    if isinstance(checked, str):
        raise ConfigError(f"otel: {source} {_shown_url(value)}: {checked}; give host:port or a URL "
                          "such as http://localhost:4317")
    if checked[1] is None:
        raise ConfigError(f"otel: {source} {_shown_url(value)}: give the port too, such as "
                          f"{value}:4317, or a URL")
    _grpc_host(source, value, checked[0])
    return value


def _endpoint(arg: str | None, protocol: OTLPProtocol, env: Mapping[str, str],
              warnings: list[str]) -> str:
    if arg is not None and not arg.strip():
        raise ConfigError(f"otel: --endpoint {_shown(arg)}: give the collector's address, such as "
                          f"{_HTTP_DEFAULT if protocol == 'http/protobuf' else _GRPC_DEFAULT}, "
                          "or leave --endpoint out")
    specific = _first(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    generic = _first(env, "OTEL_EXPORTER_OTLP_ENDPOINT")
    if protocol == "grpc":
        if arg is not None:
            return _grpc_endpoint("--endpoint", arg.strip(), warnings)
        found = specific or generic
        return _grpc_endpoint(*found, warnings) if found else _GRPC_DEFAULT
    if arg is not None:
        return _http_endpoint("--endpoint", arg.strip(), append=True)
    if specific is not None:
        url = _http_endpoint(*specific, append=False)
        if urlsplit(url).path in ("", "/"):
            warnings.append(
                f"otel: {specific[0]} {_shown_url(url)} has no path, and is used as it is, as "
                "the specification says: spans are posted to its root, where a collector "
                "refuses them; give the full URL, such as http://collector:4318/v1/traces")
        return url
    if generic is not None:
        url = _http_endpoint(*generic, append=True, always=True)
        if urlsplit(url).path.endswith(_TRACES_PATH * 2):
            warnings.append(
                f"otel: {generic[0]} {_shown_url(generic[1])} already ends in /v1/traces, and "
                f"the specification adds it again: spans go to {_shown_url(url)}; give the "
                "collector's base URL, or the full URL as OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        return url
    return _HTTP_DEFAULT + _TRACES_PATH


# -- the resource --------------------------------------------------------------


def _resource_problem(raw: str) -> str:
    """What keeps ``OTEL_RESOURCE_ATTRIBUTES`` from decoding, or ''."""
    for item in raw.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep:
            return f"{_shown(item.strip())} is not key=value"
        if not key.strip():
            return f"{_shown(item.strip())} has no key"
        if _BAD_PERCENT.search(value):
            return f"{_shown(item.strip())} has a % that is not a percent escape such as %20"
        try:
            unquote(value, errors="strict")
        except UnicodeDecodeError:
            return f"{_shown(item.strip())} decodes to bytes that are not UTF-8"
    return ""


def resource_attributes(env: Mapping[str, str],
                        warnings: list[str] | None = None) -> dict[str, str]:
    """``service.name=agentrt``, overridden by ``OTEL_RESOURCE_ATTRIBUTES``
    (``k=v,...``, percent-decoded) and then ``OTEL_SERVICE_NAME``.

    A ``OTEL_RESOURCE_ATTRIBUTES`` that does not decode is discarded whole, as
    the OpenTelemetry resource SDK specification says, and a sentence saying
    so is appended to ``warnings``."""
    attrs = {SERVICE_NAME: DEFAULT_SERVICE_NAME}
    raw = _variable(env, "OTEL_RESOURCE_ATTRIBUTES")
    problem = _resource_problem(raw)
    if problem:
        if warnings is not None:
            warnings.append(
                f"otel: OTEL_RESOURCE_ATTRIBUTES {_shown(raw)} is ignored, all of it: {problem}; "
                "write it as key=value,key2=value2 with values percent-encoded")
    else:
        for item in raw.split(","):
            key, sep, value = item.partition("=")
            if sep and key.strip():
                attrs[key.strip()] = unquote(value.strip())
    service = _variable(env, "OTEL_SERVICE_NAME").strip()
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

    The OTLP settings (protocol, endpoint, headers, compression, insecure,
    timeout, TLS files) are resolved and checked only for the ``otlp``
    exporter, which is the one that uses them.
    Raises :class:`ConfigError` with one sentence naming the value, where it
    came from (an argument is named by its flag: ``--endpoint``, ``--header``)
    and the fix.
    """
    _check_arguments(exporter=exporter, protocol=protocol, endpoint=endpoint, headers=headers,
                     insecure=insecure, timeout=timeout, environ=environ)
    env = os.environ if environ is None else environ
    kind = _exporter(exporter, env)
    warnings: list[str] = []
    attrs = resource_attributes(env, warnings)
    if kind != "otlp":  # nothing is sent: the OTLP transport's settings are not read
        return OTelConfig(exporter=kind, resource_attributes=attrs, warnings=tuple(warnings))
    wait = _timeout(timeout, env)
    proto = _protocol(protocol, env)
    url = _endpoint(endpoint, proto, env, warnings)
    _check_tls_files(env)
    if proto == "grpc":
        # The SDK reads this one from the process's environment whatever was given.
        for source in (env, os.environ) if env is not os.environ else (env,):
            _check_retryable_codes(source)
    plain = _plain_text(insecure, url, env, warnings)
    return OTelConfig(
        exporter=kind,
        protocol=proto,
        endpoint=url,
        headers=_headers(headers, env, proto),
        insecure=plain,
        timeout=wait,
        resource_attributes=attrs,
        compression=_compression(env, proto),
        warnings=tuple(warnings),
    )


def _check_arguments(**arguments: object) -> None:
    """Refuse an argument of a type :func:`resolve_config` cannot read, in one
    sentence: ``insecure="false"`` was taken for true, and the others raised a
    TypeError or AttributeError from deep inside."""
    for name in ("exporter", "protocol", "endpoint"):
        value = arguments[name]
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"otel: {name} is {described(value)}, not a str, nor None")
    insecure = arguments["insecure"]
    if insecure is not None and not isinstance(insecure, bool):
        raise ConfigError(f"otel: insecure is {described(insecure)}, not True, False or None")
    timeout = arguments["timeout"]
    if timeout is not None and (isinstance(timeout, bool)
                                or not isinstance(timeout, (int, float))):
        raise ConfigError(f"otel: timeout is {described(timeout)}, not a number of seconds, "
                          "nor None")
    headers = arguments["headers"]
    if headers is not None:
        if not isinstance(headers, Mapping):
            # Its type alone: a header string may hold a secret.
            raise ConfigError(f"otel: headers is {_type_of(headers)}, not a mapping of header "
                              "names to values (str to str), nor None")
        for key, value in headers.items():
            if not isinstance(key, str):
                raise ConfigError(f"otel: headers has a name that is {described(key)}, not a str")
            if not isinstance(value, str):
                raise ConfigError(f"otel: header {_shown(key)} is given {_type_of(value)}, "
                                  "not a str")
    environ = arguments["environ"]
    if environ is not None:
        if not isinstance(environ, Mapping):
            raise ConfigError(f"otel: environ is {_type_of(environ)}, not a mapping of variable "
                              "names to values, nor None (for os.environ)")
        for key, value in environ.items():
            if not isinstance(key, str):
                raise ConfigError(f"otel: environ has a variable name that is {described(key)}, "
                                  "not a str")
            if not isinstance(value, str):
                raise ConfigError(f"otel: environ variable {_shown(key)} is {_type_of(value)}, "
                                  "not a str")


def _type_of(value: object) -> str:
    """``None``, ``a str``, ``an int``: a value's type alone (a header's value may be a secret)."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


#: The TLS files the SDK exporters read from the environment themselves.
_TLS_FILES = tuple(f"OTEL_EXPORTER_OTLP_{part}{kind}" for part in ("TRACES_", "")
                   for kind in ("CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"))


def _check_tls_files(env: Mapping[str, str]) -> None:
    """Refuse a TLS file variable naming nothing readable: the SDK would fail
    every attempt (the gRPC exporter with a traceback), for ever."""
    for name in _TLS_FILES:
        path = _variable(env, name).strip()
        if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            raise ConfigError(f"otel: {name} {_shown(path)} is not a file this user can read: "
                              "name the PEM file, or unset it")


_RETRYABLE_CODES = "OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES"


def _check_retryable_codes(env: Mapping[str, str]) -> None:
    """Refuse a name in ``OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES``
    that is no gRPC status code: the SDK's gRPC exporter looks each one up
    itself (stripped, in any case) when built, and a KeyError ended the
    command in a traceback."""
    raw = _variable(env, _RETRYABLE_CODES)
    if not raw.strip():
        return
    grpc = _grpc()
    for name in raw.split(","):
        if name.strip() and name.strip().upper() not in grpc.StatusCode.__members__:
            valid = ", ".join(code.name for code in grpc.StatusCode)
            raise ConfigError(f"otel: {_RETRYABLE_CODES} {_shown(raw.strip())}: "
                              f"{_shown(name.strip())} is not a gRPC status code; give a "
                              f"comma-separated list of the names {valid}, or unset it")


class _StandardOutput:
    """Standard output for the console exporter, written as the JSON Lines
    export writes it: a full non-blocking pipe (a parent such as Node.js may
    leave one) is waited out. The SDK's text stream ignored what such a pipe
    did not take, and the cursor moved past spans never written."""

    def __init__(self) -> None:
        self._out: Any = None

    def _writer(self) -> Any:
        if self._out is None:  # sys.stdout as it is at the first span (tests swap it)
            from agentrt.trace import LineWriter

            stdout = sys.stdout
            self._out = LineWriter(getattr(stdout, "buffer", stdout), flush_each=False,
                                   wait=True)
        return self._out

    def write(self, text: str) -> int:
        self._writer().write(text.encode("utf-8", "surrogateescape"))
        return len(text)

    def flush(self) -> None:
        self._writer().flush()


def build_exporter(
    config: OTelConfig, *, console_out: IO[str] | None = None,
    on_rejected: Callable[[int, str], None] | None = None,
) -> SpanExporter | None:
    """The SDK exporter the config names; None for ``none``.

    An OTLP exporter's answers are checked (``agentrt_otel.answers``): a
    redirect is a failure, and spans a collector rejected in a partial
    success are told to ``on_rejected`` (default: one warning line).
    """
    if config.exporter == "none":
        return None
    if config.exporter == "console":
        out = console_out if console_out is not None else cast(IO[str], _StandardOutput())
        return ConsoleSpanExporter(out=out)
    from agentrt_otel.answers import say_rejected

    told = on_rejected if on_rejected is not None else say_rejected
    with _read_as_resolved():
        if config.protocol == "grpc":
            return _grpc_exporter(config, told)
        return _http_exporter(config, told)


#: The variables the SDK's OTLP exporters read themselves, raw, when they are built.
_SDK_READS = ("OTEL_EXPORTER_OTLP_", "OTEL_PYTHON_EXPORTER_OTLP_")


#: Held while an SDK exporter is built (:func:`_read_as_resolved`).
_BUILDING = threading.Lock()


def _quiet(record: logging.LogRecord) -> bool:
    return False


@contextmanager
def _read_as_resolved() -> Iterator[None]:
    """Build an SDK exporter with the blank OTLP variables unset and the SDK's
    header parser silent, then put both back.

    Its constructors read some variables raw, whatever they are given: over
    gRPC, ``float()`` of a blank ``OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`` (a
    traceback), a blank certificate variable taken for a file and a blank
    credential provider for a plugin's name. A blank variable counts as
    unset here, as the specification says, so it is unset while they read.
    And the SDK's header parser logs an entry it finds malformed whole, a
    secret with it; the headers it is given were parsed and checked here.

    Both changes are the whole process's, so builds are serialised: a build
    beside another read the variables the other had put back (two followers
    in one process; a blank timeout ended the second in a ValueError).
    """
    with _BUILDING:
        blank = {name: value for name, value in os.environ.items()
                 if name.startswith(_SDK_READS) and not value.strip()}
        for name in blank:
            os.environ.pop(name, None)
        sdk_log = logging.getLogger("opentelemetry.util.re")
        sdk_log.addFilter(_quiet)
        try:
            yield
        finally:
            sdk_log.removeFilter(_quiet)
            for name, value in blank.items():
                os.environ.setdefault(name, value)


def _grpc() -> Any:
    """The ``grpc`` module, its C core's log silenced unless ``GRPC_VERBOSITY``
    says otherwise: it logs each failed TLS handshake on its own, once per
    reconnect, and each proxy that refused a tunnel as an error; the sink's
    one line per outage says it instead. The core reads the variable when
    ``grpc`` is first imported, so every import here goes through this."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    import grpc  # type: ignore[import-untyped]

    return grpc


def _grpc_exporter(config: OTelConfig, told: Callable[[int, str], None]) -> SpanExporter:
    from agentrt_otel.answers import GRPC_CREDENTIAL_PROVIDERS, checked_grpc_exporter, grpc_proxy

    grpc = _grpc()
    # gRPC's C core reads the lowercase proxy variables alone, and proxies
    # the loopback too, which no proxy can reach: the proxy is chosen here
    # as the reference's grpc-go chooses it, and handed to this channel
    # alone (os.environ is left as it is for the rest of the process).
    proxy = grpc_proxy(*_grpc_target(config.endpoint))
    credentials, sends_certificate = (None, False) if config.insecure else (
        _grpc_credentials(os.environ, GRPC_CREDENTIAL_PROVIDERS))
    return checked_grpc_exporter(
        told,
        proxy,
        sends_certificate,
        endpoint=config.endpoint,
        insecure=config.insecure,
        headers=dict(config.headers) or None,
        timeout=config.timeout,
        compression={"gzip": grpc.Compression.Gzip,
                     "deflate": grpc.Compression.Deflate}.get(
                         config.compression, grpc.Compression.NoCompression),
        channel_options=((("grpc.http_proxy", proxy[0]),) if proxy
                         else (("grpc.enable_http_proxy", 0),)),
        credentials=credentials,
    )


def _http_exporter(config: OTelConfig, told: Callable[[int, str], None]) -> SpanExporter:
    import requests
    from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    from agentrt_otel.answers import HTTP_CREDENTIAL_PROVIDERS, checked_http_session

    def tls_file(kind: str) -> str | None:
        found = _tls_file(os.environ, kind)
        return found[1] if found else None

    return HttpExporter(
        endpoint=config.endpoint,
        # The files checked, stripped (the SDK would read the variables raw).
        certificate_file=tls_file("CERTIFICATE"),
        client_certificate_file=tls_file("CLIENT_CERTIFICATE"),
        client_key_file=tls_file("CLIENT_KEY"),
        headers=dict(config.headers) or None,
        timeout=config.timeout,
        compression=HttpCompression(config.compression),
        # A credential provider's session, as the SDK's own exporter takes it.
        session=checked_http_session(
            told, unsent=_headers_the_sdk_adds() - set(config.headers), endpoint=config.endpoint,
            base=_credential_plugin(os.environ, HTTP_CREDENTIAL_PROVIDERS, requests.Session)),
    )


def _tls_file(env: Mapping[str, str], kind: str) -> tuple[str, str] | None:
    """The TLS file of ``kind`` (``CERTIFICATE``, ``CLIENT_CERTIFICATE``,
    ``CLIENT_KEY``) and the variable naming it, read as every setting is: the
    traces-specific variable, then the generic one, a blank one unset."""
    return _first(env, f"OTEL_EXPORTER_OTLP_TRACES_{kind}", f"OTEL_EXPORTER_OTLP_{kind}")


def _credential_plugin(env: Mapping[str, str], names: tuple[str, ...], kind: type) -> Any:
    """What the credential provider plugin the first of ``names`` that is set
    names makes (an ``opentelemetry_otlp_credential_provider`` entry point,
    called with no argument), checked to be a ``kind``; None when none is set.

    The SDK loads it the same way, but a plugin that is not installed, fails,
    or makes something else reached the user as a traceback: here it is a
    :class:`ConfigError`, before anything is sent."""
    from importlib.metadata import entry_points

    found = _first(env, *names)
    if found is None:
        return None
    name, value = found
    wanted = f"{kind.__module__.partition('.')[0]}.{kind.__name__}"
    plugins = entry_points(group="opentelemetry_otlp_credential_provider", name=value)
    if not plugins:
        raise ConfigError(f"otel: {name} {_shown(value)} names no installed credential provider "
                          "(an opentelemetry_otlp_credential_provider entry point making a "
                          f"{wanted}): install it, or unset {name}")
    try:
        made = next(iter(plugins)).load()()
    except Exception as err:  # noqa: BLE001 - a plugin's failure, said in one sentence
        raise ConfigError(f"otel: the credential provider {_shown(value)} named by {name} "
                          f"failed ({type(err).__name__}: {_shown(str(err))}): fix it, or unset "
                          f"{name}") from None
    if not isinstance(made, kind):
        # Its type alone: a plugin returning a token string by mistake must not print it.
        raise ConfigError(f"otel: the credential provider {_shown(value)} named by {name} made "
                          f"a {type(made).__name__}, not a {wanted}: name one for this protocol, "
                          f"or unset {name}")
    return made


def _grpc_credentials(env: Mapping[str, str], providers: tuple[str, ...]) -> tuple[Any, bool]:
    """TLS credentials for the gRPC exporter, and whether they send a client
    certificate; (None, False) for the SDK's default (the system's CAs).

    A credential provider plugin's, if one is named (see
    :func:`_credential_plugin`); else those the certificate files make, each
    file read as every setting is, the traces-specific variable first, then
    the generic one (as the SDK's HTTP exporter reads them).

    The SDK's gRPC exporter read them otherwise: a client certificate only
    beside a CA file of its own kind (it sent none for
    ``OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`` alone, or beside
    ``OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE``, and the collector closed every
    connection), and ``OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE`` set to "" as
    set, so that ``OTEL_EXPORTER_OTLP_CERTIFICATE`` was ignored. A
    certificate file without a key variable holds its key too, as it may over HTTP.
    """
    grpc = _grpc()

    plugin = _credential_plugin(env, providers, grpc.ChannelCredentials)
    if plugin is not None:
        return plugin, True

    def read(kind: str) -> bytes | None:
        found = _tls_file(env, kind)
        if found is None:
            return None
        try:
            with open(found[1], "rb") as file:
                return file.read()
        except OSError as err:
            raise ConfigError(f"otel: {found[0]} {_shown(found[1])} cannot be read "
                              f"({err.strerror}): name the PEM file, or unset it") from None

    ca, chain = read("CERTIFICATE"), read("CLIENT_CERTIFICATE")
    if chain is not None:
        return grpc.ssl_channel_credentials(ca, read("CLIENT_KEY") or chain, chain), True
    return (None if ca is None else grpc.ssl_channel_credentials(ca)), False


def _grpc_target(endpoint: str) -> tuple[str, str]:
    """The host and port of a checked gRPC endpoint (a URL, ``host:port``, or
    a ``dns:``, ``ipv4:`` or ``ipv6:`` target; gRPC's default port is 443);
    no host for a socket (``unix:``)."""
    lowered = endpoint.lower()
    if lowered.startswith(("unix:", "unix-abstract:")):
        return "", ""
    if not ("://" in endpoint and lowered.startswith(("http://", "https://"))):
        if lowered.startswith(_GRPC_TARGETS):
            endpoint = endpoint.partition(":")[2].lstrip("/").split(",")[0]
        endpoint = "//" + endpoint
    url = urlsplit(endpoint)
    return url.hostname or "", str(url.port or 443)


#: Headers the SDK's HTTP exporter sets on its own, which a variable may override.
_SDK_OWN_HEADERS = frozenset({"content-type", "user-agent"})


def _headers_the_sdk_adds() -> frozenset[str]:
    """Names the SDK's HTTP exporter reads from the header variables itself and
    adds to the headers it is given (gRPC's does not): those the config did
    not choose are not sent, so ``--header`` replaces the variable over HTTP
    as it does over gRPC; but for the SDK's own content-type and user-agent,
    which a request cannot go without. Read as the SDK reads them, while the
    exporter is built (:func:`_read_as_resolved`: blank variables unset, the
    SDK's parser silent)."""
    from opentelemetry.util.re import parse_env_headers

    raw = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
           or os.environ.get("OTEL_EXPORTER_OTLP_HEADERS", ""))
    if not raw:
        return frozenset()
    return frozenset(parse_env_headers(raw, liberal=True)) - _SDK_OWN_HEADERS

"""What each event type sets: its payload fields and their attribute keys.

Tables of ``(payload field, attribute key, how)`` (spec 3.5 and the key
catalogue of 3.9), read by :meth:`Payload.apply` in one loop per event.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from agentrt.events import Event
from agentrt.timefmt import parse_time
from agentrt_otel._payload import BAD, FLAG, NUM, STR, TEXT, Field, Payload
from agentrt_otel.records import AttributeValue

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


#: The latest span time: the largest signed 64-bit count of nanoseconds,
#: 2262-04-11T23:47:16.854775807Z. OTLP's fixed64 would carry more, but the
#: Collector reads it as a signed 64-bit time (as the Go reference's
#: ``UnixNano`` and other SDKs do) and Python's datetime stops at the year
#: 9999, so no later time survives every hop; the encoder refuses one past
#: 2**64 outright, which would fail the page on every attempt.
MAX_TIME_NS = 2**63 - 1


def clamp_ns(ns: int) -> int:
    """A span time within what OTLP carries everywhere: ``[0, MAX_TIME_NS]``."""
    return 0 if ns < 0 else MAX_TIME_NS if ns > MAX_TIME_NS else ns


def event_time_ns(t: datetime | None) -> int:
    """An event's time in nanoseconds since the epoch; the zero time (an
    unreadable stored time) and anything before 1970 clamp to 0, and anything
    after :data:`MAX_TIME_NS` (a stored ``9999-12-31T23:59:59Z``) to it,
    which every OTLP hop can carry."""
    if t is None:
        return 0
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    ns = (t - _EPOCH) // _MICROSECOND * 1000  # exact, and 5x faster than to_unix_nanos
    return 0 if ns < 0 else MAX_TIME_NS if ns > MAX_TIME_NS else ns


#: The digits past the microsecond of a stored time (the Go reference writes
#: nanoseconds), which a datetime cannot hold; whatever the zone is written as.
_SUB_MICRO = re.compile(r"\.[0-9]{6}([0-9]{1,3})(?:[Zz]|[+-][0-9]{2}:[0-9]{2})\Z")
_MICRO_TIME_LEN = len("2006-01-02T15:04:05.000000Z")


def event_ns(at: datetime | None, at_text: str) -> int:
    """:func:`event_time_ns`, plus the nanoseconds the stored text holds past
    the microsecond (a time this runtime writes has none, and is never longer
    than ``_MICRO_TIME_LEN``: the pattern is not run on it)."""
    ns = event_time_ns(at)
    if len(at_text) > _MICRO_TIME_LEN and 0 < ns < MAX_TIME_NS:
        m = _SUB_MICRO.search(at_text)
        if m is not None:
            ns = min(ns + int(m.group(1).ljust(3, "0")), MAX_TIME_NS)
    return ns


#: Nanoseconds since the epoch of each whole second recently read
#: (``2026-10-01T09:00:05``), or -1 where :func:`event_at_ns` must take the
#: general path. Events come in time order, so a handful of entries serve a
#: whole export; the table is emptied at :data:`_SECONDS_KEPT` entries.
_SECONDS: dict[str, int] = {}
_SECONDS_KEPT = 256
#: Nanoseconds per unit of a fraction of 1 to 9 digits.
_FRACTION_SCALE: tuple[int, ...] = (0, *(10 ** (9 - k) for k in range(1, 10)))


def _text_ns(text: str) -> int:
    """:func:`event_ns` of a stored text, read as ``Event.at`` reads it."""
    try:
        t = parse_time(text)
    except ValueError:
        t = None
    return event_ns(t, text)


def _second_ns(second: str) -> int:
    """The nanoseconds of ``second`` + ``Z``, or -1 when a time of that second
    is not its second plus its fraction on the general path (an unreadable
    or clamped time, at the edges of what OTLP carries)."""
    ns = _text_ns(second + "Z")
    if not 0 < ns < MAX_TIME_NS - 10**9 or _text_ns(second + ".000001Z") != ns + 1000:
        return -1
    return ns


def event_at_ns(event: Event) -> int:
    """``event_ns(event.at, event.at_text)``, without the datetime: the stored
    text's second (``YYYY-MM-DDTHH:MM:SS``) is parsed once per second, and its
    fraction (1 to 9 digits, then ``Z``, as the runtime writes it) added as
    nanoseconds. Any other text takes the general path."""
    text = event.at_text
    n = len(text)
    if (n == 20 or (22 <= n <= 30 and text[19] == ".")) and text[-1] == "Z":
        second = text[:19]
        base = _SECONDS.get(second)
        if base is None:
            if len(_SECONDS) >= _SECONDS_KEPT:
                _SECONDS.clear()
            base = _SECONDS[second] = _second_ns(second)
        if base > 0:
            if n == 20:
                return base
            fraction = text[20:-1]
            if fraction.isdigit() and fraction.isascii():
                return base + int(fraction) * _FRACTION_SCALE[n - 21]
    return event_ns(event.at, text)


RESUMED: tuple[Field, ...] = (
    ("approval_id", "agentrt.approval.id", STR),
    ("after", "agentrt.resumed.after", STR),
)
LEASE: tuple[Field, ...] = (
    ("previous_owner", "agentrt.lease.previous_owner", STR),
    ("previous_expires_at", "agentrt.lease.previous_expires_at", STR),
    ("owner", "agentrt.lease.owner", STR),
)
LIMIT: tuple[Field, ...] = (
    ("reason", "agentrt.limit.reason", STR),
    ("detail", "agentrt.limit.detail", TEXT),
)
LOOP: tuple[Field, ...] = (
    ("repeats", "agentrt.loop.repeats", NUM),
    ("tool", "agentrt.loop.tool", STR),
    ("args_hash", "agentrt.loop.args_hash", STR),
    ("observation_hash", "agentrt.loop.observation_hash", STR),
)
RUN_END: tuple[Field, ...] = (
    ("reason", "agentrt.run.reason", STR),
    ("detail", "agentrt.run.detail", TEXT),
    ("steps", "agentrt.run.steps", NUM),
    ("by", "agentrt.run.by", STR),
)
CANCELLED: tuple[Field, ...] = (
    ("reason", "agentrt.run.reason", STR),
    ("by", "agentrt.run.by", STR),
    ("detail", "agentrt.run.detail", TEXT),
)
STEP_START: tuple[Field, ...] = (("index", "agentrt.step.index", NUM),)
DECISION: tuple[Field, ...] = (
    ("kind", "agentrt.decision.kind", STR),
    ("tool", "agentrt.decision.tool", TEXT),
    ("args", "agentrt.decision.args", TEXT),
    ("reason", "agentrt.decision.reason", TEXT),
    ("result", "agentrt.decision.result", TEXT),
    ("message", "agentrt.decision.message", TEXT),
    ("invalid_args", "agentrt.decision.invalid_args", TEXT),
    ("invalid_result", "agentrt.decision.invalid_result", TEXT),
    ("invalid_base64", "agentrt.decision.invalid_base64", FLAG),
    ("origin", "agentrt.decision.origin", STR),
)
POLICY: tuple[Field, ...] = (
    ("outcome", "agentrt.policy.outcome", STR),
    ("reason", "agentrt.policy.reason", TEXT),
    ("kind", "agentrt.policy.kind", STR),
    ("policy_id", "agentrt.policy.id", STR),
    ("spec_hash", "agentrt.policy.spec_hash", STR),
)
TOOL_NAME: tuple[Field, ...] = (("tool", "agentrt.tool.name", STR),)
TOOL_APPROVAL: tuple[Field, ...] = (("approval_id", "agentrt.approval.id", STR),)
TOOL: tuple[Field, ...] = (
    ("tool", "agentrt.tool.name", STR),
    ("duration_ms", "agentrt.tool.duration_ms", NUM),
    ("summary", "agentrt.tool.summary", TEXT),
    ("content_hash", "agentrt.tool.content_hash", STR),
)
TOOL_ERROR: tuple[Field, ...] = (("error", "agentrt.tool.error", TEXT),)
LATE: tuple[Field, ...] = (("observation", "agentrt.tool.observation", TEXT),)
STEP_FAILED: tuple[Field, ...] = (
    ("detail", "agentrt.step.detail", TEXT),
    ("observation", "agentrt.step.observation", STR),
    ("content_hash", "agentrt.step.content_hash", STR),
)
APPROVAL_NOTE: tuple[Field, ...] = (("kind", "agentrt.approval.kind", STR),)
APPROVAL: tuple[Field, ...] = (
    ("approval_id", "agentrt.approval.id", STR),
    ("kind", "agentrt.approval.kind", STR),
    ("reason", "agentrt.approval.reason", TEXT),
    ("hash", "agentrt.approval.hash", STR),
    ("capability", "agentrt.approval.capability", TEXT),
    ("presentation", "agentrt.approval.presentation", TEXT),
)
DECIDED: tuple[Field, ...] = (
    ("status", "agentrt.approval.status", STR),
    ("by", "agentrt.approval.by", STR),
    ("note", "agentrt.approval.note", TEXT),
)
MODEL: tuple[Field, ...] = (
    ("call_id", "agentrt.model.call_id", STR),
    ("attempt", "agentrt.model.attempt", NUM),
    ("model", "agentrt.model.name", STR),
)
MODEL_RESULT: tuple[Field, ...] = (
    ("status", "agentrt.model.status", STR),
    ("cost_micros", "agentrt.model.cost_micros", NUM),
    ("latency_ms", "agentrt.model.latency_ms", NUM),
)
MODEL_ERROR: tuple[Field, ...] = (("error", "agentrt.model.error", TEXT),)



_LIMIT_INTS = (
    "max_steps", "max_consecutive_tool_failures", "loop_threshold",
    "max_model_calls", "max_output_tokens_per_call", "max_total_tokens",
    "max_estimated_cost_micros", "max_active_time", "max_elapsed_time",
    "approval_ttl", "grant_ttl",
)


def decode_limits(attrs: dict[str, AttributeValue], p: Payload) -> None:
    """``limits`` of run.created as Go decodes it into its struct: absent, or
    of a wrong type anywhere -> no attributes at all; ``null`` -> all zero."""
    if not p.has("limits"):
        return
    if p.is_null("limits"):
        limits = Payload(None, {}, None)
    else:
        member = p.member("limits")
        if member is None:
            return
        limits = member
    ints: dict[str, int] = {}
    for key in _LIMIT_INTS:
        value = limits.strict_int(key)
        if value is BAD or not isinstance(value, int):
            return
        ints[key] = value
    # The first three always, the rest only when non-zero, durations (Go
    # nanoseconds) in whole milliseconds truncated toward zero.
    for key in _LIMIT_INTS[:3]:
        attrs["agentrt.limits." + key] = ints[key]
    for key in _LIMIT_INTS[3:7]:
        if ints[key]:
            attrs["agentrt.limits." + key] = ints[key]
    for key in _LIMIT_INTS[7:]:
        ns = ints[key]
        if ns:
            ms = abs(ns) // 1_000_000
            attrs["agentrt.limits." + key + "_ms"] = ms if ns >= 0 else -ms

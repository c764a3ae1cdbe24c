"""Values bounded for showing: a person reads a few hundred bytes of a huge string.

An approval's arguments and presentation come from an agent and a policy and
may hold a megabyte string; an operator deciding on it needs to see every
field, not every byte of one. Bounding replaces only the oversized strings,
keeping their head, their tail and how much was left out, so the shape of
the value (every key, every element) stays visible. The approval's hash is
never touched: it binds what was recorded, not what was shown.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from agentrt.errors import described
from agentrt.gojson import Raw, dumps, is_valid
from agentrt.records import Approval

__all__ = [
    "BOUND_HEAD_BYTES",
    "BOUND_TAIL_BYTES",
    "MAX_FIELD_BYTES",
    "approval_json",
    "bound_approval",
    "bound_keys",
    "bound_raw",
    "bound_string",
    "bound_value",
]

#: A string longer than this many UTF-8 bytes is shown as head and tail.
MAX_FIELD_BYTES = 2000
BOUND_HEAD_BYTES = 200
BOUND_TAIL_BYTES = 200


def _boundary_back(data: bytes, i: int) -> int:
    while 0 < i < len(data) and data[i] & 0xC0 == 0x80:
        i -= 1
    return i


def _boundary_forward(data: bytes, i: int) -> int:
    while i < len(data) and data[i] & 0xC0 == 0x80:
        i += 1
    return i


def bound_string(s: str) -> str:
    """``s``, or when over :data:`MAX_FIELD_BYTES` bytes its first and last 200 bytes
    (cut on character boundaries) around ``…[N bytes omitted]…``."""
    if len(s) * 4 <= MAX_FIELD_BYTES:  # cannot be over the bound: skip the encoding
        return s
    data = s.encode("utf-8", "surrogatepass")
    if len(data) <= MAX_FIELD_BYTES:
        return s
    head_end = _boundary_back(data, BOUND_HEAD_BYTES)
    tail_start = _boundary_forward(data, len(data) - BOUND_TAIL_BYTES)
    omitted = tail_start - head_end
    head = data[:head_end].decode("utf-8", "surrogatepass")
    tail = data[tail_start:].decode("utf-8", "surrogatepass")
    return f"{head}…[{omitted} bytes omitted]…{tail}"


def bound_keys(keys: Iterable[str]) -> list[str]:
    """An object's keys bounded, in order, each still its own: a key that bounds
    to one already shown (two long keys sharing their length, head and tail) is
    suffixed `` (#2)``, `` (#3)``…, where a dict would have kept only the last."""
    shown: list[str] = []
    taken: set[str] = set()
    for key in keys:
        bounded = unique = bound_string(key)
        n = 1
        while unique in taken:
            n += 1
            unique = f"{bounded} (#{n})"
        taken.add(unique)
        shown.append(unique)
    return shown


def bound_value(value: Any) -> Any:
    """A copy of a decoded JSON value with every oversized string bounded.

    Object keys are bounded too: a key is as much the agent's text as a value
    (:func:`bound_keys`). Other values (numbers, booleans, None,
    :class:`~agentrt.gojson.Raw`) are kept.
    """
    if isinstance(value, str):
        return bound_string(value)
    if isinstance(value, dict):
        return dict(zip(bound_keys(value), map(bound_value, value.values()), strict=True))
    if isinstance(value, list):
        return [bound_value(v) for v in value]
    return value


def _literal(text: str) -> Raw:
    return Raw(text.encode("ascii"))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Numbers are kept as their literal text, so bounding never changes 1.0 into 1
# or a 30-digit integer into a float.
_DECODER = json.JSONDecoder(parse_int=_literal, parse_float=_literal,
                            parse_constant=_reject_constant)


#: A JSON string token (unrolled and possessive: no backtracking state per byte).
_STRING_TOKEN = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)


def _bound_strings_in_text(raw: bytes) -> bytes:
    """Every oversized string token of ``raw`` bounded in place, at any depth (keys
    too, without the ``(#N)`` that keeps bounded keys apart in a walked value)."""

    def one(match: re.Match[bytes]) -> bytes:
        token = match.group()
        if len(token) <= MAX_FIELD_BYTES:
            return token
        try:
            text = json.loads(token)
        except ValueError:
            return token
        bounded = bound_string(text)
        return token if bounded == text else dumps(bounded, html=False)

    return _STRING_TOKEN.sub(one, raw)


def bound_raw(raw: bytes) -> bytes:
    """Raw JSON with its oversized strings bounded, re-encoded compactly.

    Returned unchanged when nothing needed bounding (the exact recorded bytes)
    or when it is not JSON.
    """
    if not isinstance(raw, bytes):
        raise TypeError(f"agentrt: raw is {described(raw)}, not JSON as bytes: "
                        "pass the recorded bytes (str.encode() a text)")
    if len(raw) <= MAX_FIELD_BYTES:  # no string inside can be longer than the whole
        return raw
    try:
        value = _DECODER.decode(raw.decode("utf-8"))
        bounded = bound_value(value)
        if bounded == value:
            return raw
    except RecursionError:  # nested deeper than the walk can go: bound its strings as text
        return _bound_strings_in_text(raw)
    except ValueError:  # not JSON
        return raw
    try:
        return dumps(bounded, html=False)
    except (ValueError, TypeError, RecursionError):  # pragma: no cover - decoded JSON encodes
        return raw


def bound_approval(approval: Approval) -> Approval:
    """A copy with capability, presentation and request arguments bounded; hash kept."""
    request = approval.request
    if request is not None:
        request = replace(request, args=bound_raw(request.args))
    return replace(
        approval,
        capability=bound_raw(approval.capability),
        presentation=bound_raw(approval.presentation),
        request=request,
    )


def approval_json(approval: Approval) -> dict[str, Any]:
    """The approval's JSON form, bounded (:func:`bound_approval`), whatever its columns hold.

    A capability or presentation that is not JSON is kept as a string (bounded
    too) followed by ``"invalid_capability": true`` or
    ``"invalid_presentation": true``, as an event payload that is not JSON is
    kept with ``"invalid_payload": true``, rather than failing the whole document.
    """
    bounded = bound_approval(approval)
    doc = bounded.to_json()
    invalid = {key: raw for key, raw in (("capability", bounded.capability),
                                         ("presentation", bounded.presentation))
               if raw.strip() and not is_valid(raw)}
    if not invalid:
        return doc
    out: dict[str, Any] = {}
    for key, value in doc.items():
        raw = invalid.get(key)
        if raw is None:
            out[key] = value
            continue
        out[key] = bound_string(raw.decode("utf-8", "replace"))
        out[f"invalid_{key}"] = True
    return out

"""Reading event payload fields the way the reference exporter does.

The reference decodes a payload as a JSON object of *raw* values and derives
each attribute from a field's raw text: a JSON string gives its value, any
other value its JSON text (``{"n":1}`` for tool arguments), a number becomes
an integer attribute only when its text is a base-10 int64 (``1.0``, ``1e3``
and ``"5"`` do not). A payload that is not an object yields no fields at all.

Decoding every payload into raw members in Python costs ~9 µs; orjson decodes
a typical payload in under 1 µs. So the fast path decodes with orjson and
reads the exact raw text (with :func:`agentrt.gojson.raw_members`) only when a
non-string value must be shown as text, or when orjson refuses input the
reference accepts (numbers outside a double, lone surrogate escapes).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from agentrt.gojson import STRING_PATTERN, raw_members
from agentrt_otel.text import truncate

__all__ = ["FLAG", "NUM", "STR", "TEXT", "Field", "Payload"]

#: How a field becomes an attribute: its string (set when non-empty), the same
#: cut to ``max_text`` bytes, an int64 (set when the text is one), or ``true``.
STR, TEXT, NUM, FLAG = 0, 1, 2, 3

#: (payload field, attribute key, one of STR / TEXT / NUM / FLAG)
Field = tuple[str, str, int]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_INT_TEXT = re.compile(rb"-?[0-9]+\Z")
_SURROGATE = re.compile("[\ud800-\udfff]")

#: Returned by :meth:`Payload.strict_int` for a value that is not an integer.
BAD = object()


def _clean(s: str) -> str:
    """Lone surrogates (from ``\\ud800`` escapes) become U+FFFD, as Go decodes
    them; an attribute must be valid UTF-8 to be encoded."""
    return _SURROGATE.sub("\ufffd", s) if _SURROGATE.search(s) else s


def _member_text(data: bytes, key: str, text: bytes) -> bool:
    """Whether ``"key":text`` is the object's only member of that key, followed
    by a comma that starts the next member or by the object's end (so it is
    not a prefix of a longer value). ``"key":`` anywhere else (a nested object
    with the same key, a member written with a space) leaves it to the exact
    scan: the match might not be the top-level member."""
    key_colon = orjson.dumps(key) + b":"
    needle = key_colon + text
    at = data.rfind(needle)
    if at < 0:
        return False
    end = at + len(needle)
    follow = data[end:end + 1]
    return follow in (b",", b"}") and data.count(key_colon) == 1


#: Deeper than this, a payload's raw members are not read. Python's scanner
#: recurses once per level, so it would fail or not depending on how deep the
#: caller's own stack is, and a replay after a restart (a few frames deeper)
#: could read what the first pass did not. Go's limit is 10,000; the runtime
#: itself writes nothing deeper than its 256-level boundary check allows.
_MAX_RAW_DEPTH = 512
_JSON_STRING = re.compile(STRING_PATTERN, re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def _too_deep(data: bytes) -> bool:
    """Whether ``data`` nests arrays and objects deeper than :data:`_MAX_RAW_DEPTH`
    (brackets inside strings not counted). A walk without recursion, and only
    when there are that many brackets at all."""
    if data.count(b"[") + data.count(b"{") <= _MAX_RAW_DEPTH:
        return False
    depth = 0
    for bracket in _BRACKETS.findall(_JSON_STRING.sub(b"", data)):
        depth += 1 if bracket in b"[{" else -1
        if depth > _MAX_RAW_DEPTH:
            return True
    return False


def _raw_members_of(data: bytes) -> dict[str, bytes]:
    """:func:`raw_members`, the same answer whatever the caller's stack depth."""
    if _too_deep(data):
        raise ValueError(f"nested deeper than {_MAX_RAW_DEPTH}")
    return raw_members(data)


def _is_int64(v: object) -> bool:
    return type(v) is int and _INT64_MIN <= v <= _INT64_MAX


class Payload:
    """The fields of one payload. Absent fields read as "" / None / False."""

    __slots__ = ("_data", "_parent", "_raw", "_values")

    def __init__(
        self,
        data: bytes | None,
        values: dict[str, Any] | None = None,
        raw: dict[str, bytes] | None = None,
        parent: tuple[Payload, str] | None = None,
    ) -> None:
        self._data = data  # the object's own JSON text, when known
        self._values = values  # decoded by orjson (fast path)
        self._raw = raw  # raw member texts (exact path), computed on demand
        self._parent = parent  # where a nested object's text can be read

    @classmethod
    def parse(cls, data: bytes) -> Payload:
        if data == b"{}":
            return _EMPTY
        try:
            values = orjson.loads(data)
        except orjson.JSONDecodeError:
            try:
                return cls(data, None, _raw_members_of(data))
            except (ValueError, UnicodeDecodeError, RecursionError):
                return cls(None, None, {})
        if type(values) is not dict:
            return cls(None, None, {})
        return cls(data, values)

    # -- raw access -------------------------------------------------------

    def _raw_members(self) -> dict[str, bytes]:
        if self._raw is None:
            data = self._data
            if data is None and self._parent is not None:
                parent, key = self._parent
                data = parent.raw(key)
            try:
                self._raw = _raw_members_of(data) if data is not None else {}
            except (ValueError, UnicodeDecodeError, RecursionError):
                self._raw = {}
        return self._raw

    def raw(self, key: str) -> bytes | None:
        """The exact JSON text of a field, or None when absent."""
        values = self._values
        if values is not None:
            if key not in values:
                return None
            data = self._data
            if data is not None and self._raw is None:
                # Fast path: the runtime writes compact JSON, so the value's
                # text is usually what orjson writes for it. It is used only
                # when the payload holds exactly that text after the key at
                # the top level; else the exact scan below decides.
                try:
                    text = orjson.dumps(values[key])
                except TypeError:
                    text = b""
                if text and _member_text(data, key, text):
                    return text
        return self._raw_members().get(key)

    def has(self, key: str) -> bool:
        if self._values is not None:
            return key in self._values
        return key in self._raw_members()

    # -- typed reads ------------------------------------------------------

    def string(self, key: str) -> str:
        """A string field's value; any other JSON value's text; "" if absent or null."""
        values = self._values
        if values is not None:
            v = values.get(key)
            if v is None:
                return ""
            if type(v) is str:
                return v
            if v is True:
                return "true"
            if v is False:
                return "false"
        text = self.raw(key)
        if text is None or text == b"null":
            return ""
        if text[:1] == b'"':
            return _clean(json.loads(text))
        return text.decode("utf-8", "replace")

    def integer(self, key: str) -> int | None:
        """The field when its JSON text is a base-10 int64, else None."""
        values = self._values
        if values is not None:
            v = values.get(key)
            return v if _is_int64(v) else None
        text = self._raw_members().get(key)
        if text is None or _INT_TEXT.match(text) is None:
            return None
        n = int(text)
        return n if _INT64_MIN <= n <= _INT64_MAX else None

    def strict_int(self, key: str) -> int | object:
        """Go's decoding of the field into an int64 struct field: absent or
        null -> 0, an integer -> itself, anything else -> :data:`BAD`."""
        values = self._values
        if values is not None:
            if key not in values:
                return 0
            v = values[key]
            if v is None:
                return 0
            return v if _is_int64(v) else BAD
        text = self._raw_members().get(key)
        if text is None or text == b"null":
            return 0
        n = self.integer(key)
        return BAD if n is None else n

    def is_true(self, key: str) -> bool:
        """Whether the field's JSON text is exactly ``true``."""
        values = self._values
        if values is not None:
            return values.get(key) is True
        return self._raw_members().get(key) == b"true"

    def member(self, key: str) -> Payload | None:
        """A nested object field as a Payload; None when absent or not an object."""
        values = self._values
        if values is not None:
            v = values.get(key)
            if type(v) is not dict:
                return None
            return Payload(None, v, None, (self, key))
        text = self._raw_members().get(key)
        if text is None or text[:1] != b"{":
            return None
        return Payload.parse(text)

    def is_null(self, key: str) -> bool:
        if self._values is not None:
            return key in self._values and self._values[key] is None
        return self._raw_members().get(key) == b"null"

    def apply(self, attrs: dict[str, str | int | bool], fields: tuple[Field, ...],
              max_text: int) -> None:
        """Set the attribute of each field that yields one (the hot path of
        the mapping: one loop over the decoded values, no call per field but
        for a text that might need cutting)."""
        values = self._values
        if values is None:
            self._apply_raw(attrs, fields, max_text)
            return
        get = values.get
        for field, key, kind in fields:
            v = get(field)
            if v is None:
                continue
            if kind == NUM:
                if _is_int64(v):
                    attrs[key] = v
            elif kind == FLAG:
                if v is True:
                    attrs[key] = True
            else:
                text = v if type(v) is str else self.string(field)
                if text:
                    # truncate()'s own first test, without the call: no cut is possible
                    fits = kind == STR or len(text) * 4 <= max_text
                    attrs[key] = text if fits else truncate(text, max_text)

    def _apply_raw(self, attrs: dict[str, str | int | bool], fields: tuple[Field, ...],
                   max_text: int) -> None:
        """:meth:`apply` for a payload orjson refused, from its raw members."""
        for field, key, kind in fields:
            if kind == NUM:
                n = self.integer(field)
                if n is not None:
                    attrs[key] = n
            elif kind == FLAG:
                if self.is_true(field):
                    attrs[key] = True
            else:
                text = self.string(field)
                if text:
                    attrs[key] = truncate(text, max_text) if kind == TEXT else text

    def truncated_length(self) -> int | None:
        """``length`` of a page read's truncation object (``{"truncated":true,
        "length":N,"head":...}``), or None for an ordinary payload."""
        values = self._values
        if values is not None:
            if values.get("truncated") is not True:
                return None
            n = values.get("length")
            return n if _is_int64(n) else None
        if not self.is_true("truncated"):
            return None
        return self.integer("length")


#: The payload of most run-level events; shared, as it never changes.
_EMPTY = Payload(b"{}", {}, {})

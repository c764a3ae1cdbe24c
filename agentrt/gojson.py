"""JSON bytes exactly as the reference's Go encoder writes them.

The stored columns and event payloads of a database must be byte-identical
whichever runtime wrote them, and the event hash chain covers those bytes.
Python's ``json.dumps`` differs from Go's ``encoding/json`` in escaping and in
how embedded raw JSON is treated, so every stored value goes through
:func:`dumps` here. Objects are plain dicts whose insertion order is the Go
struct's field order (maps are sorted by the caller with :func:`sorted_map`);
raw JSON (Go's ``json.RawMessage``) is wrapped in :class:`Raw` and is
compacted, and HTML-escaped when ``html`` is on, as Go does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = [
    "STRING_PATTERN",
    "Raw",
    "add_go_escapes",
    "compact",
    "dumps",
    "encode_string",
    "is_valid",
    "replace_lone_surrogates",
    "raw_members",
    "sorted_map",
]


class Raw:
    """Raw JSON bytes embedded in a value (Go's ``json.RawMessage``)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"Raw({self.data!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Raw) and other.data == self.data

    def __hash__(self) -> int:
        return hash(self.data)


_HEX = "0123456789abcdef"
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(c: str) -> str:
    short = _SHORT.get(c)
    if short is not None:
        return short
    o = ord(c)
    if 0xD800 <= o <= 0xDFFF:  # a lone surrogate: Go writes the replacement escape
        return "\\ufffd"
    return "\\u" + _HEX[o >> 12 & 15] + _HEX[o >> 8 & 15] + _HEX[o >> 4 & 15] + _HEX[o & 15]


_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_lone_surrogates(s: str) -> str:
    """``s`` with each lone surrogate (which UTF-8 cannot hold) as U+FFFD, the
    character Go's encoder writes for it; ``s`` itself when it has none."""
    if s.isascii() or _SURROGATE.search(s) is None:
        return s
    return _SURROGATE.sub("\ufffd", s)


_NEEDS_HTML = re.compile('["\\\\\x00-\x1f<>&\u2028\u2029\ud800-\udfff]')
_NEEDS_PLAIN = re.compile('["\\\\\x00-\x1f\u2028\u2029\ud800-\udfff]')


def encode_string(s: str, html: bool = True) -> str:
    """A quoted JSON string as Go writes it (``<>&`` escaped when ``html``)."""
    pattern = _NEEDS_HTML if html else _NEEDS_PLAIN
    if pattern.search(s) is None:
        return '"' + s + '"'
    return '"' + pattern.sub(lambda m: _escape_char(m.group()), s) + '"'


# Strings (with their escapes) or runs of insignificant whitespace. The string
# pattern is unrolled and possessive (a string's bytes split into plain runs and
# escapes one way only, so nothing is lost by never backtracking): the textbook
# ``(?:[^"\\]|\\.)*`` keeps backtracking state per byte, about 135 bytes of
# memory per byte of a long string (a 27 MB tool result took 3.6 GB).
STRING_PATTERN = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_TOKEN = re.compile(rb"(" + STRING_PATTERN + rb")|[ \t\n\r]+", re.DOTALL)
_HTML_BYTES = re.compile(b"[<>&]|\xe2\x80[\xa8\xa9]")
_HTML_ESCAPES = {
    b"<": b"\\u003c",
    b">": b"\\u003e",
    b"&": b"\\u0026",
    b"\xe2\x80\xa8": b"\\u2028",
    b"\xe2\x80\xa9": b"\\u2029",
}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def is_valid(data: bytes) -> bool:
    """Whether ``data`` holds exactly one JSON value (RFC 8259, no NaN)."""
    try:
        orjson.loads(data)
        return True
    except orjson.JSONDecodeError:
        pass
    # orjson refuses some valid inputs (numbers out of its range); ask the
    # stdlib decoder, which keeps such literals, before saying no.
    try:
        # Decoded as UTF-8 first: given bytes, json.loads guesses UTF-16 or -32 too.
        json.loads(data.decode("utf-8"), parse_constant=_reject_constant, parse_float=str,
                   parse_int=str)
        return True
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False


_SP, _LF, _TAB, _CR = b" \n\t\r"  # iterating bytes gives ints: memchr needles
_LT, _GT, _AMP, _E2 = b"<>&\xe2"


def compact(data: bytes, html: bool = False) -> bytes:
    """Remove insignificant whitespace, keeping strings, numbers and key order.

    With ``html`` the characters ``<>&`` and U+2028/U+2029 are escaped, as Go
    does when it marshals a ``json.RawMessage``. The input must be valid JSON.
    """
    # A few memchr scans (``int in bytes``; a one-byte ``bytes`` needle first
    # fails as an int, raising and clearing a TypeError inside) are several
    # times cheaper than a regex search or a generator over the bytes.
    if _SP in data or _LF in data or _TAB in data or _CR in data:
        data = _TOKEN.sub(rb"\1", data)
    if html and (_E2 in data or _LT in data or _GT in data or _AMP in data):
        data = _HTML_BYTES.sub(lambda m: _HTML_ESCAPES[m.group()], data)
    return data


def sorted_map(m: Mapping[str, Any]) -> dict[str, Any]:
    """A dict in Go's map key order (bytewise UTF-8, which is code-point order)."""
    return {k: m[k] for k in sorted(m)}


def _encode(value: Any, out: list[str], html: bool) -> None:
    if isinstance(value, str):
        out.append(encode_string(value, html))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, Raw):
        data = value.data
        if not data.strip():
            out.append("null")
        else:
            if not is_valid(data):
                raise ValueError("raw value is not valid JSON")
            out.append(compact(data.strip(), html).decode("utf-8", "surrogateescape"))
    elif isinstance(value, dict):
        out.append("{")
        first = True
        for k, v in value.items():
            if not first:
                out.append(",")
            first = False
            out.append(encode_string(k, html))
            out.append(":")
            _encode(v, out, html)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, v in enumerate(value):
            if i:
                out.append(",")
            _encode(v, out, html)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON")


_SCALARS = (str, int, bool, type(None))


def _plain(value: Any) -> bool:
    """Whether orjson writes ``value`` as Go does, up to the escapes :func:`dumps` adds:
    strings, integers, booleans, None, and dicts (string keys) and lists of them."""
    t = type(value)
    if t in _SCALARS:
        return True
    if t is dict:
        for k, v in value.items():
            if type(k) is not str or (type(v) not in _SCALARS and not _plain(v)):
                return False
        return True
    if t is list or t is tuple:
        return all(type(v) in _SCALARS or _plain(v) for v in value)
    # A str or int subclass (a StrEnum) is written as its value by both.
    return isinstance(value, (str, int))


_GO_ESCAPES_ALWAYS = ((b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))
_GO_ESCAPES_HTML = _GO_ESCAPES_ALWAYS + (
    (b"<", b"\\u003c"), (b">", b"\\u003e"), (b"&", b"\\u0026"))


def add_go_escapes(data: bytes, html: bool = True) -> bytes:
    """orjson's output of a plain value made Go's: the escapes Go adds and orjson does
    not (``<``, ``>``, ``&`` when ``html``; U+2028 and U+2029 always). Those
    characters can only occur inside strings, so replacing their bytes is exact.

    Most values hold none of the bytes that start them: memchr scans for ints
    (as in :func:`compact`) decide that, inline, as this runs for every event.
    """
    if _E2 in data or (html and (_LT in data or _GT in data or _AMP in data)):
        for raw, escaped in _GO_ESCAPES_HTML if html else _GO_ESCAPES_ALWAYS:
            data = data.replace(raw, escaped)
    return data


def dumps(value: Any, html: bool = True) -> bytes:
    """Encode ``value`` as Go's ``json.Marshal`` would (``html=True``) or an
    ``Encoder`` with ``SetEscapeHTML(false)`` (``html=False``), without newline.

    Plain values (no raw JSON, no floats) go through orjson, some 50x faster,
    whose output differs from Go's only in the escapes added here: ``<``,
    ``>``, ``&``, U+2028 and U+2029 can only occur inside strings, so replacing
    their bytes is exact (``test_go_encoding_fast_path_is_the_encoder``).
    """
    if _plain(value):
        try:
            data = orjson.dumps(value)
        except orjson.JSONEncodeError:
            pass  # an integer past 64 bits, a lone surrogate: the encoder below
        else:
            return add_go_escapes(data, html)
    out: list[str] = []
    _encode(value, out, html)
    return "".join(out).encode("utf-8", "surrogateescape")


_SCAN_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=str, parse_int=str)
_WS_CHARS = " \t\n\r"


def raw_members(data: bytes | str) -> dict[str, bytes]:
    """The members of a JSON object with each value kept as its raw bytes.

    Go decodes ``json.RawMessage`` fields as the exact bytes of the value; the
    stored columns rely on it. Duplicate keys: the last wins, as in Go.
    Raises ValueError when ``data`` is not one JSON object.
    """
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    scan = _SCAN_DECODER.raw_decode
    n = len(text)
    i = 0
    while i < n and text[i] in _WS_CHARS:
        i += 1
    if i >= n or text[i] != "{":
        raise ValueError("not a JSON object")
    i += 1
    out: dict[str, bytes] = {}
    while True:
        while i < n and text[i] in _WS_CHARS:
            i += 1
        if i < n and text[i] == "}" and not out:
            i += 1
            break
        if i >= n or text[i] != '"':
            raise ValueError("expected an object key")
        key, i = scan(text, i)
        while i < n and text[i] in _WS_CHARS:
            i += 1
        if i >= n or text[i] != ":":
            raise ValueError("expected ':'")
        i += 1
        while i < n and text[i] in _WS_CHARS:
            i += 1
        _, end = scan(text, i)
        out[key] = text[i:end].encode("utf-8")
        i = end
        while i < n and text[i] in _WS_CHARS:
            i += 1
        if i < n and text[i] == ",":
            i += 1
            continue
        if i < n and text[i] == "}":
            i += 1
            break
        raise ValueError("expected ',' or '}'")
    if text[i:].strip(_WS_CHARS):
        raise ValueError("trailing data after the object")
    return out

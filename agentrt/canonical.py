"""Canonical JSON, the boundary check for consumer JSON, and content hashes.

Hashes must not depend on how a value was spelled: the canonical form sorts
object keys by UTF-8 bytes, drops whitespace, keeps number literals exactly as
written and escapes strings as Go does. ``check_json`` refuses, where consumer
JSON enters the runtime, anything the canonical form would hash lossily.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from typing import Any

import orjson

from agentrt.gojson import add_go_escapes, encode_string, replace_lone_surrogates

__all__ = [
    "MAX_JSON_DEPTH",
    "canonical_json",
    "check_and_forms",
    "check_and_hash",
    "canonical_text",
    "check_json",
    "content_hash",
    "content_key",
    "keys_and_floats",
    "policy_json",
]

MAX_JSON_DEPTH = 256
MAX_NUMBER_LENGTH = 10_000
MAX_EXPONENT = 10_000


def _per_byte_replace(err: UnicodeError) -> tuple[str, int]:
    assert isinstance(err, UnicodeDecodeError)
    return "\ufffd" * (err.end - err.start), err.end


# Go replaces every byte of invalid UTF-8 with U+FFFD; Python's "replace" can
# fold a cut-short sequence into one. This handler matches Go.
codecs.register_error("agentrt-per-byte", _per_byte_replace)


class _Number(str):
    """A JSON number kept as the literal text it was written with."""


_SURROGATE = re.compile("[\ud800-\udfff]")
_clean = replace_lone_surrogates


def _encode_canonical(value: Any, out: list[str], html: bool) -> None:
    if isinstance(value, _Number):
        out.append(str.__str__(value))
    elif isinstance(value, str):
        out.append(encode_string(_clean(value), html))
    elif isinstance(value, dict):
        # The decoder cleaned the keys; sorting by key alone never compares values.
        out.append("{")
        for i, k in enumerate(sorted(value)):
            v = value[k]
            if i:
                out.append(",")
            out.append(encode_string(k, html))
            out.append(":")
            _encode_canonical(v, out, html)
        out.append("}")
    elif isinstance(value, list):
        out.append("[")
        for i, v in enumerate(value):
            if i:
                out.append(",")
            _encode_canonical(v, out, html)
        out.append("]")
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    else:  # pragma: no cover - the decoder yields nothing else
        raise TypeError(type(value).__name__)


def _raise_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _clean_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Keys that differ only by a lone surrogate become one key, U+FFFD, in the
    # order written, so the last member wins, as in Go's map (spec 4.1).
    return {_clean(k): v for k, v in pairs}


_DECODER = json.JSONDecoder(
    object_pairs_hook=_clean_keys,
    parse_float=_Number, parse_int=_Number, parse_constant=_raise_constant,
)
_WS = " \t\n\r"


def _decode_first(data: bytes) -> tuple[bool, Any]:
    """Decode the first JSON value (trailing data ignored); (False, None) if blank."""
    text = data.decode("utf-8", "agentrt-per-byte").lstrip(_WS)
    if not text:
        return False, None
    value, _ = _DECODER.raw_decode(text)
    return True, value


# -- the fast paths ----------------------------------------------------------
#
# The strict decoder above is exact but costs some microseconds per value, and
# a step checks and hashes several. orjson parses the common value ten times
# faster; where what it parsed provably matches what the strict decoder would
# (below), its result is used, and otherwise the strict decoder decides.
# ``tests/test_hashing.py`` holds both paths to the same answers.

_LEAVES = frozenset((str, int, bool, type(None)))


def keys_and_floats(value: Any) -> tuple[int, bool]:
    """(how many object members ``value`` holds, whether it holds a float)."""
    if type(value) is dict:  # a flat object, the usual arguments or result, first
        for v in value.values():
            if type(v) not in _LEAVES:
                break
        else:
            return len(value), False
    keys, floats = 0, False
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t in _LEAVES:
            continue
        if t is dict:
            keys += len(v)
            stack.extend(v.values())
        elif t is list:
            stack.extend(v)
        else:  # float: orjson's only other type
            floats = True
    return keys, floats


def _fast_canonical(data: bytes, html: bool) -> bytes | None:
    """The canonical form by orjson, or None when it might differ from the slow path's.

    orjson refuses everything the strict path would clean up (invalid UTF-8,
    lone surrogates, trailing data), keeps integers exactly within 64 bits and
    makes floats of all other numbers, and sorts keys by code point, which for
    strings without surrogates is UTF-8 byte order; a repeated key keeps its
    last value in both. Number literals must be written back as they were
    written, so a float (or the literal ``-0``, which orjson reads as 0) sends
    the value to the slow path. orjson escapes strings as Go does except for
    the characters ``add_go_escapes`` adds.
    """
    if data.find(b"-0") >= 0 and _NEGATIVE_ZERO.search(data) is not None:
        return None
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if keys_and_floats(value)[1]:
        return None
    plain = _sorted_dumps(value)
    return add_go_escapes(plain, html) if plain is not None else None


def _sorted_dumps(value: Any) -> bytes | None:
    """orjson's sorted output of ``value``, or None when orjson will not write it:
    its encoder stops at 255 levels of nesting, where the limit is 256."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return None


# The literal -0, or text inside a string that looks like it ("-0" in a date
# is followed by a digit).
_NEGATIVE_ZERO = re.compile(rb"-0(?![0-9.eE])")
# An exponent of five or more significant digits, perhaps inside a string.
_LARGE_EXPONENT = re.compile(rb"[eE][+-]?0*[1-9][0-9]{4}")


def _string_colons(value: Any) -> int:
    """How many ``:`` the strings of ``value`` (keys included) hold."""
    n = 0
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is str:
            n += v.count(":")
        elif t is dict:
            for k in v:
                n += k.count(":")
            stack.extend(v.values())
        elif t is list:
            stack.extend(v)
    return n


def _usable_value(data: bytes) -> tuple[Any, bool] | None:
    """(orjson's value of ``data``, whether it holds a float) when ``data`` is
    usable consumer JSON, proven cheaply (the depth is checked before); None
    means only that the strict check must decide.

    orjson refuses invalid UTF-8, lone surrogate escapes, trailing data and
    anything that is not one RFC 8259 value. A repeated key it keeps silently,
    but every member of the text is written with one ``:`` outside strings:
    when the text's colons number exactly the members parsed plus the colons
    in the parsed strings, no member was dropped. (A colon inside a string
    decodes to exactly one colon unless written as a ``\\u`` escape, so texts
    with those are left to the strict check.) A number literal can only be
    too long in a text longer than the limit, or have too large an exponent
    where the text shows one.
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    keys, floats = keys_and_floats(value)
    colons = data.count(b":")
    if colons != keys and (data.find(b"\\u") >= 0
                           or colons - _string_colons(value) != keys):
        return None
    if floats and (len(data) > MAX_NUMBER_LENGTH
                   or _LARGE_EXPONENT.search(data) is not None):
        return None
    return value, floats


def _canonical(data: bytes, html: bool) -> bytes:
    fast = _fast_canonical(data, html)
    return fast if fast is not None else _strict_canonical(data, html)


def _strict_canonical(data: bytes, html: bool) -> bytes:
    present, value = _decode_first(data)
    if not present:
        return b"null"
    out: list[str] = []
    _encode_canonical(value, out, html)
    return "".join(out).encode("utf-8")


def canonical_text(data: bytes) -> bytes:
    """The canonical form without the boundary check (trailing data ignored).

    Raises ValueError when the first value does not decode.
    """
    try:
        return _canonical(data, html=True)
    except RecursionError as exc:
        raise ValueError("nested too deeply to decode") from exc


def canonical_json(data: bytes) -> bytes:
    """The canonical form of one JSON value; raises ValueError for unusable JSON.

    Empty or whitespace-only input is ``null``.
    """
    if not data.strip(_WS.encode()):
        return b"null"
    problem = check_json(data)
    if problem is not None:
        raise ValueError(problem)
    return _canonical(data, html=True)


def policy_json(data: bytes) -> bytes:
    """The canonical traversal with HTML escaping off: what a policy is handed.

    Two inputs with equal canonical form have equal policy form. Hashes never
    use it. Raises ValueError when the value does not decode.
    """
    try:
        return _canonical(data, html=False)
    except RecursionError as exc:
        raise ValueError("nested too deeply to decode") from exc


def content_hash(data: bytes) -> str:
    """Hex sha256 of the canonical form, or of the raw bytes if they do not decode."""
    return hashlib.sha256(content_key(data)).hexdigest()


def content_key(data: bytes) -> bytes:
    """The bytes :func:`content_hash` hashes: equal keys, equal hashes. A comparison
    of contents needs no hash (each sha256 costs several thousand instructions)."""
    try:
        return _canonical(data, html=True)
    except (ValueError, RecursionError):
        return data


# A string literal (possibly cut short by the end of input), or one bracket.
# Unrolled and possessive, as gojson.STRING_PATTERN: the textbook alternation keeps
# backtracking state per byte of a string (about 115 bytes of memory per byte).
_STRING_OR_BRACKET = re.compile(
    rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:\\\Z)?(?:"|\Z)|[\[\]{}]', re.DOTALL)
_OPEN = frozenset(b"[{")


def _depth_exceeds(data: bytes, limit: int) -> bool:
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    depth = 0
    for m in _STRING_OR_BRACKET.finditer(data):
        c = m.group()
        if len(c) != 1:
            continue
        if c[0] in _OPEN:
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


_EXPONENT = re.compile(r"[eE]([+-]?)(\d+)\Z")


def _number_problem(literal: str) -> str | None:
    shown = literal if len(literal) <= 24 else literal[:24] + "..."
    if len(literal) > MAX_NUMBER_LENGTH:
        return f"number {literal[:24]}... is longer than {MAX_NUMBER_LENGTH} characters"
    m = _EXPONENT.search(literal)
    if m is not None:
        digits = m.group(2).lstrip("0") or "0"
        if len(digits) > 5 or int(digits) > MAX_EXPONENT:
            return f"number {shown} has an exponent beyond ±{MAX_EXPONENT}"
    return None


class _Findings:
    """What one strict decode noticed, reported afterwards in the fixed order."""

    def __init__(self) -> None:
        self.duplicate: str | None = None
        self.number: str | None = None
        self.surrogate: str | None = None

    def pairs(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for k, v in pairs:
            self.string(k)
            if k in obj:
                if self.duplicate is None:
                    self.duplicate = k
                # An overwritten value's strings still come before a duplicate (4.2).
                _walk_strings(obj[k], self)
            obj[k] = v
        return obj

    def string(self, s: str) -> None:
        if self.surrogate is None:
            m = _SURROGATE.search(s)
            if m is not None:
                self.surrogate = f"\\u{ord(m.group()):04x}"

    def literal(self, text: str) -> str:
        if self.number is None:
            self.number = _number_problem(text)
        return text


def _walk_strings(value: Any, findings: _Findings) -> None:
    if isinstance(value, str):
        findings.string(value)
    elif isinstance(value, list):
        for v in value:
            _walk_strings(v, findings)
    elif isinstance(value, dict):
        for v in value.values():
            _walk_strings(v, findings)


def check_json(data: bytes) -> str | None:
    """Why ``data`` is not usable consumer JSON, or None when it is.

    In this order: nesting deeper than 256 levels, not UTF-8, not exactly one
    well-formed value, an unpaired surrogate escape, a repeated object key, a
    number literal too long or with too large an exponent.
    """
    # (Deeper than the limit takes more opening brackets than a short text holds.)
    if len(data) > MAX_JSON_DEPTH and _depth_exceeds(data, MAX_JSON_DEPTH):
        return f"nested deeper than {MAX_JSON_DEPTH} levels"
    if _usable_value(data) is not None:
        return None
    return _strict_check(data)


def _checked_sorted(data: bytes) -> tuple[str | None, bytes | None]:
    """(:func:`check_json`'s answer, and when it is None and orjson's value gives
    the canonical form, orjson's sorted output before Go's escapes; None when
    the strict traversal must make it), with the usual value parsed once."""
    # (Deeper than the limit takes more opening brackets than a short text holds.)
    if len(data) > MAX_JSON_DEPTH and _depth_exceeds(data, MAX_JSON_DEPTH):
        return f"nested deeper than {MAX_JSON_DEPTH} levels", None
    usable = _usable_value(data)
    if usable is None:
        return _strict_check(data), None
    value, floats = usable
    # As in _fast_canonical: number literals must be written back as written.
    if floats or (data.find(b"-0") >= 0 and _NEGATIVE_ZERO.search(data) is not None):
        return None, None
    return None, _sorted_dumps(value)


def check_and_hash(data: bytes) -> tuple[str | None, str]:
    """``(check_json(data), content_hash(data))``, the hash only when the check
    passes ('' otherwise): a tool's result is both, from one parse."""
    problem, plain = _checked_sorted(data)
    if problem is not None:
        return problem, ""
    if plain is None:
        return None, content_hash(data)
    return None, hashlib.sha256(add_go_escapes(plain, True)).hexdigest()


def check_and_forms(data: bytes) -> tuple[str | None, bytes, bytes]:
    """``(check_json(data), policy_json(data), canonical_text(data))``, the forms
    only when the check passes (b"" otherwise): an agent's arguments are all
    three (checked, shown to the policy, hashed for the loop check), from one parse."""
    problem, plain = _checked_sorted(data)
    if problem is not None:
        return problem, b"", b""
    if plain is None:
        return None, policy_json(data), canonical_text(data)
    return None, add_go_escapes(plain, False), add_go_escapes(plain, True)


def _strict_check(data: bytes) -> str | None:
    """:func:`check_json` after the depth check, by the strict decoder alone."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "not valid UTF-8"
    findings = _Findings()
    decoder = json.JSONDecoder(
        object_pairs_hook=findings.pairs,
        parse_float=findings.literal,
        parse_int=findings.literal,
        parse_constant=_raise_constant,
    )
    try:
        value = decoder.decode(text)
    except (ValueError, RecursionError):
        return "not valid JSON"
    _walk_strings(value, findings)
    if findings.surrogate is not None:
        return f"unpaired surrogate {findings.surrogate}"
    if findings.duplicate is not None:
        return f"duplicate key {encode_string(findings.duplicate, html=False)}"
    if findings.number is not None:
        return findings.number
    return None

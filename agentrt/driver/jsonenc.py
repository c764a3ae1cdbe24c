"""Go-compatible JSON at orjson's speed, for the loop's hot path.

:func:`agentrt.gojson.dumps` is the reference encoder; every step encodes a
dozen small values, and the pure-Python encoder alone would cost more than
the step's commits. For the values the loop writes, orjson writes the same
bytes as Go's encoder except for ``<``, ``>``, ``&`` and U+2028/U+2029 in
strings (Go escapes them), lone surrogates, and integers past 64 bits; raw
JSON is embedded as an already-compacted, already-escaped fragment. So the
output is checked for those characters and, when any appears or orjson
refuses the value, the reference encoder is used instead.
``tests/test_driver_encoding.py`` holds the two to the same bytes.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from agentrt.errors import EncodeError
from agentrt.gojson import Raw, compact, dumps, is_valid

__all__ = ["encode"]

_ESCAPED_BY_GO = re.compile(rb"[<>&]|\xe2\x80[\xa8\xa9]")


def _fragment(value: Any) -> Any:
    if isinstance(value, Raw):
        data = value.data.strip()
        if not data:
            return None
        if not is_valid(data):
            raise ValueError("raw value is not valid JSON")
        return orjson.Fragment(compact(data, html=True))
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def encode(value: Any) -> bytes:
    """Exactly :func:`agentrt.gojson.dumps` (HTML-escaping on), or EncodeError.

    A value that will not encode fails the run as internal_error rather than
    being stored as something else. Records hold no floats (the reference's
    hold none either); unlike the reference encoder, this one would write one.
    """
    try:
        out = orjson.dumps(value, default=_fragment)
        if _ESCAPED_BY_GO.search(out) is None:
            return out
    except (orjson.JSONEncodeError, TypeError, ValueError):
        pass
    try:
        return dumps(value)
    except (ValueError, TypeError) as exc:
        raise EncodeError(str(exc)) from exc

"""Go-compatible JSON at orjson's speed, for the loop's hot path.

:func:`agentrt.gojson.dumps` is the reference encoder; every step encodes a
dozen small values, and the pure-Python encoder alone would cost more than
the step's commits. For the values the loop writes, orjson writes the same
bytes as Go's encoder except for ``<``, ``>``, ``&`` and U+2028/U+2029 in
strings (Go escapes them), lone surrogates, and integers past 64 bits; raw
JSON is embedded as an already-compacted, already-escaped fragment. So those
characters are escaped in orjson's output (they can only come from its
strings) and, when orjson refuses the value, the reference encoder is used
instead.
``tests/test_driver_encoding.py`` holds the two to the same bytes.
"""

from __future__ import annotations

from typing import Any

import orjson

from agentrt.errors import EncodeError
from agentrt.gojson import Raw, add_go_escapes, compact, dumps, is_valid

__all__ = ["encode"]


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
    except (orjson.JSONEncodeError, TypeError, ValueError):
        pass
    else:
        # Raw fragments are already escaped, so any byte Go escapes and orjson
        # does not comes from a string orjson wrote: add_go_escapes is exact.
        return add_go_escapes(out)  # html=True, the default
    try:
        return dumps(value)
    except (ValueError, TypeError) as exc:
        raise EncodeError(str(exc)) from exc

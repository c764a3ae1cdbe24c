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


# The last raw bytes turned into a fragment, and the fragment, kept by identity
# (bytes do not change): a step embeds its arguments twice, in the decision
# column and in ``step.tool_started``. Replaced whole, so threads see a pair.
_last: tuple[bytes | None, Any] = (None, None)


def _fragment(value: Any) -> Any:
    global _last
    if isinstance(value, Raw):
        raw = value.data
        last = _last
        if raw is last[0]:
            return last[1]
        data = raw.strip()
        if not data:
            return None
        if not is_valid(data):
            raise ValueError("raw value is not valid JSON")
        fragment = orjson.Fragment(compact(data, html=True))
        if type(raw) is bytes:  # immutable: the same object is the same JSON
            _last = (raw, fragment)
        return fragment
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
        return add_go_escapes(out, html=True)
    try:
        return dumps(value)
    except (ValueError, TypeError) as exc:
        raise EncodeError(str(exc)) from exc

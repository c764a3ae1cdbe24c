"""Cutting model- and human-chosen text before it becomes an attribute.

Goals, reasons, tool summaries, notes and errors are chosen by a model or a
person and can be any size; a backend that receives a 1 MB attribute drops the
span or the whole batch. Such "text" attributes are cut to ``max_text`` bytes
(1024 by default) on a UTF-8 boundary, with a marker that says how long the
whole text was. Ids, hashes, statuses and registered names are never cut.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_TEXT", "truncate"]

#: The default cap for text attributes, in UTF-8 bytes.
DEFAULT_MAX_TEXT = 1024


def truncate(s: str, max_bytes: int) -> str:
    """``s`` unchanged when its UTF-8 form fits in ``max_bytes``; else its
    first ``max_bytes`` bytes, moved back to a character boundary, followed by
    ``…[truncated: N bytes]`` where N is the whole text's length in bytes.

    The marker says "bytes" (the store's own page cap says "characters").
    """
    max_bytes = max(max_bytes, 0)
    if len(s) * 4 <= max_bytes:  # cannot exceed the cap whatever the characters
        return s
    data = s.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return s
    cut = max_bytes
    while cut > 0 and data[cut] & 0xC0 == 0x80:
        cut -= 1
    head = data[:cut].decode("utf-8", "surrogatepass")
    return f"{head}…[truncated: {len(data)} bytes]"

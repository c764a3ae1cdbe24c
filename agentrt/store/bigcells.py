"""Oversized cells of a page read, measured and cut in bounded memory.

A page read replaces a value over ``MAX_PAGE_TEXT`` characters with its head
and its length (see pages.py). SQLite's ``length()`` and ``substr()`` load the
whole value to give those, so a reader's peak memory followed the largest
value it read. Here the value is read through an incremental blob handle in
64 KiB chunks instead (as chainread.py hashes big values), and measured the
way SQLite measures text: a character is a byte under 0x80, or a byte from
0x80 up with the continuation bytes (0x80-0xBF) that follow it, and the text
ends at the first NUL.

The head is cut as ``substr(text, 1, n)`` cuts it, from the value's first
``4 n`` bytes (n characters of UTF-8 take at most that): only invalid UTF-8
whose first n characters span more bytes (a byte from 0x80 up followed by
more continuation bytes than UTF-8 allows: one character to SQLite) gets a head
cut at those ``4 n`` bytes rather than one of unbounded size.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from functools import lru_cache

import apsw

__all__ = ["CHUNK", "cut", "json_cut", "read_cut", "text_cut"]

CHUNK = 65536

#: Each byte's class: ASCII, continuation (0x80-0xBF) or other (0xC0 up).
_CLASSES = b"a" * 0x80 + b"c" * 0x40 + b"l" * 0x40


@lru_cache(maxsize=4)
def _head(n: int) -> re.Pattern[bytes]:
    """The first ``n`` characters as SQLite's substr() steps over them."""
    return re.compile(rb"(?:[\x80-\xff][\x80-\xbf]*|[\x00-\x7f]){0,%d}" % n)


def cut(chunks: Iterable[bytes], n: int) -> tuple[bytes, int]:
    """The bytes of ``substr(v, 1, n)`` and ``length(v)`` of the text whose
    bytes ``chunks`` yield in order, holding one chunk and the head at a time."""
    limit = 4 * n
    prefix = bytearray()
    length = 0
    after_lead = False  # whether the last byte was 0x80 up: a continuation joins it
    for chunk in chunks:
        end = chunk.find(0)
        if end >= 0:
            chunk = chunk[:end]
        if len(prefix) < limit:
            prefix += chunk[:limit - len(prefix)]
        if chunk.isascii():
            length += len(chunk)
            after_lead = after_lead and not chunk
        else:
            # Every byte but a continuation byte is a character, and so is a
            # run of continuation bytes after an ASCII byte (or at the start).
            classes = chunk.translate(_CLASSES)
            length += (len(classes) - classes.count(b"c") + classes.count(b"ac")
                       + (not after_lead and classes[0] == ord("c")))
            after_lead = chunk[-1] >= 0x80
        if end >= 0:
            break
    match = _head(n).match(prefix)
    return (match.group() if match else b""), length


def _chunks(blob: apsw.Blob) -> Iterator[bytes]:
    while chunk := blob.read(CHUNK):
        yield chunk


def read_cut(conn: apsw.Connection, table: str, column: str, rowid: int,
             n: int) -> tuple[bytes, int]:
    """:func:`cut` of a stored text or BLOB, read through the blob handle.

    Call it in the read transaction that read the row: the handle then reads
    the value the row was read with."""
    with conn.blob_open("main", table, column, rowid, False) as blob:
        head_and_length = cut(_chunks(blob), n)
    return head_and_length


def text_cut(head: bytes, length: int) -> str:
    """What ``substr(v, 1, n) || '…[truncated: ' || length(v) || ' characters]'``
    reads as: invalid UTF-8 decoded with U+FFFD replacements, as ``fetch`` does."""
    return (head + f"…[truncated: {length} characters]".encode()).decode("utf-8", "replace")


def json_cut(conn: apsw.Connection, head: bytes, length: int) -> bytes:
    """The truncation object, escaped by SQLite's own json_object from the head's bytes."""
    row = conn.execute(
        "SELECT CAST(json_object('truncated', json('true'), 'length', ?, "
        "'head', CAST(? AS TEXT)) AS BLOB)", (length, head)).fetchone()
    return bytes(row[0]) if row else b""

"""Walking the event hash chain with bounded memory.

Used by migration 6 (which hashes every stored event) and by
``Store.verify_events``. Fields, and the previous event's stored hash, are
read as bytes exactly as stored (a hash stored as a BLOB, or as text that is
not UTF-8, is hashed as its bytes, as the writer does): each
field's length comes with the page (``octet_length`` reads only the record
header), and so does a field of at most 4096 bytes; a longer one is streamed
into the hash in 64 KiB chunks through an incremental blob handle, so a huge
payload never sits in memory and is read once. (A ``CAST`` of it would make
SQLite load it whole; a ``substr`` per chunk, load it once per chunk: a
100 MB payload took hours.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

__all__ = [
    "CHAIN_PAGE",
    "ChainBreak",
    "VerifyReport",
    "backfill_hashes",
    "verify",
]

CHAIN_PAGE = 128
CHAIN_INLINE = 4096
CHUNK = 65536
STORED_HASH_CAP = 128

_FIELDS = ("run_id", "step_id", "at", "type", "payload_json")

_PAGE_SQL = (
    f"SELECT seq, substr(CAST(hash AS BLOB), 1, {STORED_HASH_CAP}), "
    + ", ".join(
        f"octet_length({f}), "
        f"CASE WHEN octet_length({f}) <= {CHAIN_INLINE} THEN CAST({f} AS BLOB) END"
        for f in _FIELDS
    )
    + " FROM events WHERE seq >= ? AND seq <= ? ORDER BY seq LIMIT ?"
)


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """Where the chain first fails: the seq, the hash its fields give, the stored one."""

    seq: int
    expected: str
    found: str
    detail: str


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The range walked, how many events were checked, and the last stored hash."""

    from_seq: int
    to_seq: int
    checked: int
    hash: str
    broken: ChainBreak | None = None

    @property
    def intact(self) -> bool:
        return self.broken is None


def _as_bytes(v: object) -> bytes:
    if v is None:
        return b""
    if isinstance(v, bytes):
        return v
    return str(v).encode("utf-8")


def _shown(stored: bytes) -> str:
    """A stored hash as text for a report (bytes that are not UTF-8 as U+FFFD)."""
    return stored.decode("utf-8", "replace")


def _event_hash(conn: apsw.Connection, prev: bytes, row: Sequence[Any]) -> str:
    seq = int(row[0])
    h = hashlib.sha256()
    parts: list[tuple[int, bytes, str]] = [
        (len(prev), prev, ""),
        (len(str(seq)), str(seq).encode(), ""),
    ]
    for i, field in enumerate(_FIELDS):
        length = int(row[2 + 2 * i] or 0)
        parts.append((length, _as_bytes(row[3 + 2 * i]), field))
    for length, value, name in parts:
        h.update(b"%d:" % length)
        if name and length > CHAIN_INLINE:
            _hash_long(conn, h, name, seq, length)
        else:
            h.update(value)
        h.update(b",")
    return h.hexdigest()


def _hash_long(conn: apsw.Connection, h: Any, column: str, seq: int, length: int) -> None:
    """Feed ``h`` the first ``length`` bytes of a long field, 64 KiB at a time.
    Only a text or a blob can be that long, and SQLite's blob handle reads
    either as its stored (UTF-8) bytes, which is what ``CAST(... AS BLOB)``
    gives."""
    with conn.blob_open("main", "events", column, seq, False) as blob:
        remaining = min(length, blob.length())
        while remaining > 0:
            chunk = blob.read(min(CHUNK, remaining))
            if not chunk:
                return
            h.update(chunk)
            remaining -= len(chunk)


def _pages(conn: apsw.Connection, first: int, last: int) -> Iterator[list[Any]]:
    at = first
    while at <= last:
        rows = list(conn.execute(_PAGE_SQL, (at, last, CHAIN_PAGE)))
        if not rows:
            return
        yield rows
        at = int(rows[-1][0]) + 1


def backfill_hashes(conn: apsw.Connection) -> None:
    """Migration 6's side action: chain every stored event, in seq order."""
    prev = b""
    updates: list[tuple[str, int]] = []
    for rows in _pages(conn, 0, 2**63 - 1):
        for row in rows:
            digest = _event_hash(conn, prev, row)
            prev = digest.encode()
            updates.append((digest, int(row[0])))
        conn.executemany("UPDATE events SET hash = ? WHERE seq = ?", updates)
        updates.clear()


def _head_seq(conn: apsw.Connection) -> int:
    row = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
    return int(row[0]) if row else 0


def verify(conn: apsw.Connection, from_seq: int = 0, to_seq: int = 0) -> VerifyReport:
    """Recompute the chain from ``from_seq`` (1 when < 1) to ``to_seq`` (the head when < 1).

    The first break found stops the walk: a gap in seq, a first event that is
    not seq 1 when walking from the start, or a stored hash that the event's
    fields and the previous hash do not give. A chain cut at the end still
    verifies; only a kept head (see ``agentrt verify --head``) shows that.
    """
    first = max(from_seq, 1)
    last = to_seq if to_seq >= 1 else _head_seq(conn)
    prev = b""
    if first > 1:
        row = conn.execute(
            "SELECT substr(CAST(hash AS BLOB), 1, ?) FROM events WHERE seq < ? "
            "ORDER BY seq DESC LIMIT 1",
            (STORED_HASH_CAP, first),
        ).fetchone()
        prev = _as_bytes(row[0]) if row else b""
    checked = 0
    last_hash = ""
    expected_seq: int | None = None
    for rows in _pages(conn, first, last):
        for row in rows:
            seq = int(row[0])
            raw = _as_bytes(row[1])
            stored = _shown(raw)
            if expected_seq is None and first == 1 and seq != 1:
                return VerifyReport(first, last, checked, last_hash, ChainBreak(
                    seq, "", stored, f"the first event is seq {seq}: an event is missing"))
            if expected_seq is not None and seq != expected_seq:
                return VerifyReport(first, last, checked, last_hash, ChainBreak(
                    seq, "", stored, f"seq {seq} follows {expected_seq - 1}: an event is missing"))
            want = _event_hash(conn, prev, row)
            if want.encode() != raw:
                return VerifyReport(first, last, checked, last_hash, ChainBreak(
                    seq, want, stored,
                    "the stored hash is not the one the event's fields and the previous "
                    "event's hash give"))
            checked += 1
            last_hash = stored
            prev = raw
            expected_seq = seq + 1
    return VerifyReport(first, last, checked, last_hash)

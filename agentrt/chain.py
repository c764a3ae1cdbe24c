"""The event hash chain: each event's hash covers its fields and the previous hash.

One global chain in commit (seq) order across every run, so a deleted,
altered or reordered event breaks it. The chain holds no secret: it catches
corruption and code that mutates a fixed record, not the file's owner.
"""

from __future__ import annotations

import hashlib

__all__ = ["chain_hash", "netstring"]


def netstring(data: bytes) -> bytes:
    """``<byte length>:<bytes>,`` so no two field lists hash alike."""
    return b"%d:%b," % (len(data), data)


# Netstring lengths looked up rather than formatted: turning an int into text
# costs more than assembling the rest of an event's header.
_LENGTHS = tuple(str(n) for n in range(1024))


def chain_hash(
    prev_hash: str,
    seq: int,
    run_id: str,
    step_id: str,
    at: str,
    type: str,
    payload_json: bytes | str,
) -> str:
    """Lowercase hex sha256 over seven netstrings of the fields exactly as stored
    (a stored previous hash that is not UTF-8 comes as text decoded with
    ``surrogateescape``, which gives its bytes back)."""
    if isinstance(payload_json, str):
        s = str(seq)
        # The writer computes this on every append, with the payload as the text it
        # stores. Its usual fields are ASCII, where a character is a byte: the
        # record is then one string, encoded and hashed once, with lengths taken
        # from the table.
        L = _LENGTHS
        try:
            record = (f"{L[len(prev_hash)]}:{prev_hash},{L[len(s)]}:{s},"
                      f"{L[len(run_id)]}:{run_id},{L[len(step_id)]}:{step_id},"
                      f"{L[len(at)]}:{at},{L[len(type)]}:{type},"
                      f"{L[len(payload_json)]}:{payload_json},")
        except IndexError:  # a field of 1024 or more: the general path below
            record = None
        if record is not None and record.isascii():
            return hashlib.sha256(record.encode("ascii")).hexdigest()
        payload = payload_json.encode("utf-8")
    else:
        payload = payload_json
    fields = [prev_hash.encode("utf-8", "surrogateescape"),
              *(f.encode("utf-8") for f in (str(seq), run_id, step_id, at, type)), payload]
    return hashlib.sha256(b"".join(netstring(f) for f in fields)).hexdigest()

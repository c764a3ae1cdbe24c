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


def chain_hash(
    prev_hash: str,
    seq: int,
    run_id: str,
    step_id: str,
    at: str,
    type: str,
    payload_json: bytes | str,
) -> str:
    """Lowercase hex sha256 over seven netstrings of the fields exactly as stored."""
    payload = payload_json.encode("utf-8") if isinstance(payload_json, str) else payload_json
    p = prev_hash.encode("utf-8")
    s = str(seq).encode("ascii")
    r = run_id.encode("utf-8")
    st = step_id.encode("utf-8")
    a = at.encode("utf-8")
    t = type.encode("utf-8")
    # One buffer, formatted at once: the writer computes this on every append.
    return hashlib.sha256(
        b"%d:%b,%d:%b,%d:%b,%d:%b,%d:%b,%d:%b,%d:%b,"
        % (len(p), p, len(s), s, len(r), r, len(st), st, len(a), a, len(t), t,
           len(payload), payload)
    ).hexdigest()

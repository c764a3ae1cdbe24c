"""Deterministic trace and span ids, derived from what a span represents.

A span id is a hash of the kind and id of the thing the span stands for (a run,
a step, a model call...), so an exporter that restarts, or a run resumed days
later by another process, continues the same trace instead of forking it, and
one run's spans carry the same ids whichever runtime (this one or the Go
reference) exported them. The formulas are the reference's:

- trace id: first 16 bytes of SHA-256(``"agentrt/trace" 0x00 run_id``);
- span id: first 8 bytes of SHA-256(``"agentrt/span" 0x00 kind 0x00 id``);

an all-zero result (invalid in OpenTelemetry) has its last byte set to 1.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

__all__ = ["span_id", "span_id_hex", "trace_id", "trace_id_hex"]

_TRACE_PREFIX = b"agentrt/trace\x00"
_SPAN_PREFIX = b"agentrt/span\x00"


def _not_text(function: str, **args: object) -> TypeError:
    """The TypeError for the first argument that is not a str (called once
    encoding one failed, so the usual call pays nothing for the check)."""
    for name, value in args.items():
        if not isinstance(value, str):
            if value is None:
                shown = "None"
            else:
                kind = type(value).__name__
                article = "an" if kind[:1].lower() in ("a", "e", "i", "o", "u") else "a"
                shown = f"{article} {kind} ({value!r:.60})"
            return TypeError(f"otel: {function}: {name} is {shown}, not a str")
    return TypeError(f"otel: {function}: the arguments are not text")  # pragma: no cover


def trace_id(run_id: str) -> int:
    """The trace id of a run, as the 128-bit integer the SDK uses.

    Raises TypeError when ``run_id`` is not a str."""
    try:
        data = _TRACE_PREFIX + run_id.encode("utf-8", "surrogatepass")
    except (AttributeError, TypeError):
        raise _not_text("trace_id", run_id=run_id) from None
    digest = hashlib.sha256(data).digest()
    value = int.from_bytes(digest[:16], "big")
    return value or 1


@lru_cache(maxsize=32)
def _span_prefix(kind: str) -> hashlib._Hash:
    """SHA-256 fed ``"agentrt/span" 0x00 kind 0x00``, to be copied and fed an id:
    the same digest as hashing the whole text, for a third less per id (a
    span id is derived for every span exported)."""
    return hashlib.sha256(_SPAN_PREFIX + kind.encode("utf-8", "surrogatepass") + b"\x00")


def span_id(kind: str, id: str) -> int:
    """The span id of the ``kind`` thing named ``id``, as a 64-bit integer.

    Raises TypeError when ``kind`` or ``id`` is not a str."""
    try:
        digest = _span_prefix(kind).copy()
        digest.update(id.encode("utf-8", "surrogatepass"))
    except (AttributeError, TypeError):
        raise _not_text("span_id", kind=kind, id=id) from None
    value = int.from_bytes(digest.digest()[:8], "big")
    return value or 1


def trace_id_hex(run_id: str) -> str:
    """:func:`trace_id` as the 32 lowercase hex digits backends show."""
    return f"{trace_id(run_id):032x}"


def span_id_hex(kind: str, id: str) -> str:
    """:func:`span_id` as 16 lowercase hex digits."""
    return f"{span_id(kind, id):016x}"

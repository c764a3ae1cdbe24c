"""Records in their stored form: exactly what a reload of the row would decode to.

The session keeps steps in memory and must keep them equal to a reload (the
agent and the policy are shown the cache). Decoding each row it just wrote
would cost more than the write, so the stored form is built directly: raw
JSON compacted and HTML-escaped as the encoder writes it, strings with lone
surrogates replaced as the encoder escapes them. ``test_the_cache_equals_the
_store_after_every_write`` holds this module to the decoder.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agentrt.gojson import compact, replace_lone_surrogates
from agentrt.records import Decision, Observation, PolicyDecision, Step
from agentrt.timefmt import format_time

__all__ = [
    "evolve",
    "stored_decision",
    "stored_observation",
    "stored_policy",
    "stored_raw",
    "stored_text",
    "stored_time",
]

#: A string as it reads back: the encoder writes a lone surrogate as U+FFFD.
stored_text = replace_lone_surrogates


def stored_raw(data: bytes | None) -> bytes | None:
    """Raw JSON as it reads back: compacted and HTML-escaped; blank is absent."""
    if not data:
        return None
    data = data.strip()
    if not data:
        return None
    return compact(data, html=True)


#: A time as stored: :func:`agentrt.timefmt.format_time`, which remembers recent
#: readings (a step writes the same start time four times).
stored_time = format_time


def _ascii(*texts: str) -> bool:
    """Whether every text is ASCII, which reads back as it is (False for a value
    that is not text: the field by field conversion then fails as it always did)."""
    try:
        return "".join(texts).isascii()
    except TypeError:
        return False


def stored_decision(d: Decision) -> Decision:
    """The decision as it reads back: ``d`` itself when it already does (the usual
    case: ASCII text, raw JSON compact and escaped), so pass a copy you own."""
    args, result = stored_raw(d.args), stored_raw(d.result)
    if (args is d.args and result is d.result and type(d.invalid_base64) is bool
            and _ascii(d.kind, d.tool, d.reason, d.message, d.origin, d.invalid_args,
                       d.invalid_result)):
        return d
    t = stored_text
    return Decision(t(d.kind), t(d.tool), args, t(d.reason), result,
                    t(d.message), t(d.origin), t(d.invalid_args), t(d.invalid_result),
                    bool(d.invalid_base64))


def stored_policy(p: PolicyDecision) -> PolicyDecision:
    """Always a copy: ``p`` is the policy's own object, which it may change later."""
    t = stored_text
    return PolicyDecision(t(p.outcome), t(p.reason), t(p.kind), stored_raw(p.capability),
                          stored_raw(p.presentation))


def stored_observation(o: Observation) -> Observation:
    """The observation as it reads back: ``o`` itself when it already does, as
    :func:`stored_decision`."""
    content = stored_raw(o.content)
    if content is o.content and _ascii(o.kind, o.summary, o.content_hash):
        return o
    t = stored_text
    return Observation(t(o.kind), content, t(o.summary), t(o.content_hash))


_KEEP: Any = object()


def evolve(step: Step, *, status: str = _KEEP, decision: Decision | None = _KEEP,
           policy: PolicyDecision | None = _KEEP, observation: Observation | None = _KEEP,
           started_at: datetime | None = _KEEP, finished_at: datetime | None = _KEEP,
           spec_hash: str = _KEEP, policy_id: str = _KEEP) -> Step:
    """``dataclasses.replace`` for a step, at a fraction of its cost (the loop makes
    a handful per step): the fields given, the others as they were."""
    return Step(step.id, step.run_id, step.index,
                step.status if status is _KEEP else status,
                step.decision if decision is _KEEP else decision,
                step.policy if policy is _KEEP else policy,
                step.observation if observation is _KEEP else observation,
                step.started_at if started_at is _KEEP else started_at,
                step.finished_at if finished_at is _KEEP else finished_at,
                step.spec_hash if spec_hash is _KEEP else spec_hash,
                step.policy_id if policy_id is _KEEP else policy_id,
                step.decode_error)

"""Rebuilding a span whose start event this mapper did not see.

After a restart the mapper meets runs, steps and approvals in the middle.
Their spans must come out as if one process had seen everything: the same
start time and, as far as the store keeps them, the same attributes. This
module reads them from the optional :class:`SpanStartSource` (a read-only
store) and turns them into a start time plus the attributes the missed start
events would have set. Lookups that find nothing return None; a lookup that
fails for another reason is logged once per kind and treated as not found, so
a flaky read never stops the export (the span is then marked
``agentrt.span.start_unknown``, as without a store).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from agentrt.errors import NotFoundError
from agentrt.gojson import compact, is_valid
from agentrt.records import Approval, Decision, Limits, PolicyDecision, Run, Step, duration_ns
from agentrt_otel._payload import Payload
from agentrt_otel.records import AttributeValue, SpanStartSource
from agentrt_otel.text import truncate

__all__ = ["Lookups", "StepStart", "event_time_ns", "limit_attributes", "open_at_run_end"]

_log = logging.getLogger("agentrt_otel")

#: Steps read per page when scanning a run's steps for one id.
STEP_PAGE = 200

Attrs = dict[str, AttributeValue]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def event_time_ns(t: datetime | None) -> int:
    """Nanoseconds since the epoch; the zero time (an unreadable stored time)
    and anything before 1970 clamp to 0, which OTLP can carry."""
    if t is None:
        return 0
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    ns = (t - _EPOCH) // _MICROSECOND * 1000  # exact, and 5x faster than to_unix_nanos
    return ns if ns > 0 else 0


def _trunc_ms(ns: int) -> int:
    """Whole milliseconds, truncating toward zero as Go's Duration.Milliseconds."""
    q = abs(ns) // 1_000_000
    return q if ns >= 0 else -q


def limit_attributes(
    attrs: Attrs,
    max_steps: int,
    max_failures: int,
    loop_threshold: int,
    optional: tuple[tuple[str, int], ...],
    durations_ns: tuple[tuple[str, int], ...],
) -> None:
    """The ``agentrt.limits.*`` attributes: the first three always, the rest
    only when non-zero, durations in whole milliseconds."""
    attrs["agentrt.limits.max_steps"] = max_steps
    attrs["agentrt.limits.max_consecutive_tool_failures"] = max_failures
    attrs["agentrt.limits.loop_threshold"] = loop_threshold
    for key, value in optional:
        if value:
            attrs["agentrt.limits." + key] = value
    for key, ns in durations_ns:
        if ns:
            attrs["agentrt.limits." + key] = _trunc_ms(ns)


def _limits_from_record(attrs: Attrs, limits: Limits) -> None:
    limit_attributes(
        attrs,
        limits.max_steps,
        limits.max_consecutive_tool_failures,
        limits.loop_threshold,
        (
            ("max_model_calls", limits.max_model_calls),
            ("max_output_tokens_per_call", limits.max_output_tokens_per_call),
            ("max_total_tokens", limits.max_total_tokens),
            ("max_estimated_cost_micros", limits.max_estimated_cost_micros),
        ),
        (
            ("max_active_time_ms", duration_ns(limits.max_active_time)),
            ("max_elapsed_time_ms", duration_ns(limits.max_elapsed_time)),
            ("approval_ttl_ms", duration_ns(limits.approval_ttl)),
            ("grant_ttl_ms", duration_ns(limits.grant_ttl)),
        ),
    )


def _raw_text(data: bytes | None) -> str:
    """A stored raw JSON value as the attribute read from an event payload
    would show it: a JSON string's value, else the value's JSON text as Go
    marshals it into a payload (compacted, HTML-escaped)."""
    if not data or not data.strip() or data.strip() == b"null":
        return ""
    if not is_valid(data):
        return data.decode("utf-8", "replace")
    data = compact(data.strip(), html=True)
    if data[:1] == b'"':
        return Payload.parse(b'{"v":' + data + b"}").string("v")
    return data.decode("utf-8", "replace")


def _set(attrs: Attrs, key: str, value: str) -> None:
    if value:
        attrs[key] = value


@dataclass(frozen=True, slots=True)
class StepStart:
    """What the store knows of a step: its start, and the attributes its
    step.started, step.decided and step.policy events would have set."""

    start_ns: int | None
    attributes: Attrs
    interrupted: bool


class Lookups:
    """The source's reads, each turned into span-ready values."""

    def __init__(self, source: SpanStartSource | None, max_text: int) -> None:
        self._source = source
        self._max_text = max_text
        self._warned: set[str] = set()

    def _failed(self, what: str, err: Exception) -> None:
        if what not in self._warned:
            self._warned.add(what)
            _log.warning("otel: reading %s from the store failed (%s); "
                         "spans started before a restart are marked start_unknown", what, err)

    def _text(self, attrs: Attrs, key: str, value: str) -> None:
        if value:
            attrs[key] = truncate(value, self._max_text)

    # -- runs ---------------------------------------------------------------

    def run(self, run_id: str, attrs: Attrs) -> int | None:
        """The run's creation time, adding its goal and limits to ``attrs``."""
        if self._source is None:
            return None
        try:
            run: Run = self._source.get_run_capped(run_id)
        except NotFoundError:
            return None
        except Exception as err:
            self._failed("a run", err)
            return None
        if run.created_at is None:
            return None
        self._text(attrs, "agentrt.run.goal", run.goal)
        _limits_from_record(attrs, run.limits)
        return event_time_ns(run.created_at)

    # -- steps --------------------------------------------------------------

    def _find_step(self, run_id: str, step_id: str) -> Step | None:
        assert self._source is not None
        offset = 0
        while True:
            steps, total = self._source.list_steps_page(run_id, STEP_PAGE, offset)
            for step in steps:
                if step.id == step_id:
                    return step
            offset += len(steps)
            if not steps or offset >= total:
                return None

    def step(self, run_id: str, step_id: str) -> StepStart | None:
        if self._source is None:
            return None
        try:
            step = self._find_step(run_id, step_id)
        except NotFoundError:
            return None
        except Exception as err:
            self._failed("a step", err)
            return None
        return None if step is None else self.step_start(step)

    def last_step(self, run_id: str) -> Step | None:
        """The run's newest step (the only one a run can end with open)."""
        if self._source is None:
            return None
        try:
            _, total = self._source.list_steps_page(run_id, 1, 0)
            if total <= 0:
                return None
            steps, _ = self._source.list_steps_page(run_id, 1, total - 1)
        except NotFoundError:
            return None
        except Exception as err:
            self._failed("a step", err)
            return None
        return steps[-1] if steps else None

    def step_start(self, step: Step) -> StepStart:
        attrs: Attrs = {"agentrt.step.index": step.index}
        if step.decision is not None:
            self._decision(attrs, step.decision)
        if step.policy is not None:
            self._policy(attrs, step.policy, step.policy_id, step.spec_hash)
            decision = step.decision
            if (step.policy.outcome == "allow" and decision is not None
                    and decision.kind == "tool_call" and decision.tool):
                # An allowed call's step.tool_started is written in the same
                # transaction as its step.policy: the tool ran.
                attrs["agentrt.tool.name"] = decision.tool
        start = event_time_ns(step.started_at) if step.started_at is not None else None
        return StepStart(start, attrs, step.status == "interrupted")

    def _decision(self, attrs: Attrs, d: Decision) -> None:
        _set(attrs, "agentrt.decision.kind", d.kind)
        self._text(attrs, "agentrt.decision.tool", d.tool)
        self._text(attrs, "agentrt.decision.args", _raw_text(d.args))
        self._text(attrs, "agentrt.decision.reason", d.reason)
        self._text(attrs, "agentrt.decision.result", _raw_text(d.result))
        self._text(attrs, "agentrt.decision.message", d.message)
        self._text(attrs, "agentrt.decision.invalid_args", d.invalid_args)
        self._text(attrs, "agentrt.decision.invalid_result", d.invalid_result)
        if d.invalid_base64:
            attrs["agentrt.decision.invalid_base64"] = True
        _set(attrs, "agentrt.decision.origin", d.origin)

    def _policy(self, attrs: Attrs, p: PolicyDecision, policy_id: str, spec_hash: str) -> None:
        _set(attrs, "agentrt.policy.outcome", p.outcome)
        self._text(attrs, "agentrt.policy.reason", p.reason)
        _set(attrs, "agentrt.policy.kind", p.kind)
        _set(attrs, "agentrt.policy.id", policy_id)
        _set(attrs, "agentrt.policy.spec_hash", spec_hash)

    # -- approvals ----------------------------------------------------------

    def approval(self, run_id: str, approval_id: str) -> Approval | None:
        if self._source is None:
            return None
        try:
            return self._source.get_approval(run_id, approval_id)
        except NotFoundError:
            return None
        except Exception as err:
            self._failed("an approval", err)
            return None

    def approval_start(self, approval: Approval, attrs: Attrs) -> int | None:
        """The approval's creation time, adding what approval.requested set."""
        if approval.created_at is None:
            return None
        _set(attrs, "agentrt.approval.kind", approval.kind)
        _set(attrs, "agentrt.approval.hash", approval.hash)
        self._text(attrs, "agentrt.approval.capability", _raw_text(approval.capability))
        self._text(attrs, "agentrt.approval.presentation", _raw_text(approval.presentation))
        return event_time_ns(approval.created_at)


def open_at_run_end(step: Step, run_end_ns: int) -> bool:
    """Whether a run's last step was still open when ``run.finished`` came,
    judged from its row by a mapper that did not see the step's events.

    A step ends on ``step.tool_finished`` (a done tool call), ``step.failed``
    (written before the run ended) or the next ``step.started``; a completion
    or failure decision, a step in flight, and a step failed by the run's own
    ending (cancel, rejection: same reading as ``run.finished``) end with the run.
    """
    if step.status == "done":
        return step.decision is None or step.decision.kind != "tool_call"
    if step.status == "failed":
        return step.finished_at is None or event_time_ns(step.finished_at) >= run_end_ns
    return True

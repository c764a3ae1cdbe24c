"""What the mapper keeps between events: the spans that are open."""

from __future__ import annotations

from opentelemetry.trace import SpanKind, StatusCode

from agentrt_otel.records import AttributeValue, SpanEventRecord

__all__ = ["Attrs", "OpenSpan", "RunState", "StepState"]

Attrs = dict[str, AttributeValue]


class OpenSpan:
    """A span that has started and not yet ended."""

    __slots__ = (
        "attrs",
        "events",
        "kind",
        "name",
        "parent_id",
        "run_id",
        "span_id",
        "start_ns",
        "status_code",
        "status_description",
    )

    def __init__(
        self,
        name: str,
        run_id: str,
        span_id_: int,
        parent_id: int | None,
        kind: SpanKind,
        start_ns: int,
        attrs: Attrs,
    ) -> None:
        self.name = name
        self.run_id = run_id
        self.span_id = span_id_
        self.parent_id = parent_id
        self.kind = kind
        self.start_ns = start_ns
        self.attrs = attrs
        self.events: list[SpanEventRecord] = []
        self.status_code = StatusCode.UNSET
        self.status_description = ""


class StepState:
    __slots__ = ("interrupted", "span")

    def __init__(self, span: OpenSpan, interrupted: bool = False) -> None:
        self.span = span
        self.interrupted = interrupted


class RunState:
    """What is open of one run."""

    __slots__ = (
        "approvals",
        "current",
        "ended_approvals",
        "models",
        "run",
        "run_id",
        "steps",
    )

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.run: OpenSpan | None = None
        self.steps: dict[str, StepState] = {}
        self.current = ""
        self.models: dict[str, OpenSpan] = {}
        self.approvals: dict[str, tuple[OpenSpan, str]] = {}
        # Approvals whose span this mapper ended while the run was open.
        self.ended_approvals: set[str] = set()

    def empty(self) -> bool:
        return self.run is None and not self.steps and not self.models and not self.approvals



"""The agent side of the loop: what an agent is given each step and must answer.

An agent returns one :class:`~agentrt.records.Decision` per step: call a tool,
complete, or fail. An exception it raises is recorded as ``agent_error``, or as
the limit a model call hit (:class:`~agentrt.driver.errors.LimitError`,
:class:`~agentrt.driver.errors.ModelUnavailableError`), so the run ends with an
explanation rather than a traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agentrt.driver.cancel import CancelToken
from agentrt.records import Approval, Decision, Run, Step, ToolSpec

if TYPE_CHECKING:
    from agentrt.driver.model import ModelCaller

__all__ = ["Agent", "AgentFunc", "StepInput"]


@dataclass(slots=True)
class StepInput:
    """One step's input, all copies: the run as of this step's start (its
    ``step_count`` includes this step), every earlier step and approval, the
    tools in name order, the step's model caller (None without a model) and
    the caller's cancel token."""

    run: Run
    steps: Sequence[Step]
    approvals: Sequence[Approval]
    tools: list[ToolSpec]
    model: ModelCaller | None
    cancel: CancelToken

    @property
    def index(self) -> int:
        """This step's 0-based index."""
        return self.run.step_count - 1


@runtime_checkable
class Agent(Protocol):
    def decide(self, step: StepInput) -> Decision: ...


class AgentFunc:
    """Adapts a function ``fn(step) -> Decision`` into an Agent."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[StepInput], Decision]) -> None:
        self._fn = fn

    def decide(self, step: StepInput) -> Decision:
        return self._fn(step)

"""Policies: what rules on every tool request before anything runs.

A policy answers allow, require approval, deny or abort. It is handed the
request in policy form (arguments and input schema with sorted keys, no
whitespace, literal numbers) so it sees the same bytes in the loop, on resume
and on a recheck, and a :class:`RunView` of the run as it stood.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentrt.driver.errors import ConfigError
from agentrt.errors import described
from agentrt.gojson import Raw, dumps
from agentrt.records import (
    Approval,
    PolicyDecision,
    PolicyOutcome,
    Run,
    SideEffect,
    Step,
    ToolRequest,
)

__all__ = [
    "DefaultPolicy",
    "IdentifiedPolicy",
    "Policy",
    "PolicyFunc",
    "RunView",
    "SideEffectPolicy",
    "need_approval",
]


@dataclass(slots=True)
class RunView:
    """The run as a policy (or a reconciler) sees it: copies, safe to keep or change."""

    run: Run
    steps: Sequence[Step]
    approvals: Sequence[Approval]


@runtime_checkable
class Policy(Protocol):
    """Rules on one tool request. An exception is a policy error: the run fails
    as ``internal_error`` and the tool does not run."""

    def evaluate(self, request: ToolRequest, view: RunView) -> PolicyDecision: ...


@runtime_checkable
class IdentifiedPolicy(Protocol):
    """A policy that names itself; the name is recorded on every step it rules."""

    def policy_id(self) -> str: ...


class PolicyFunc:
    """Adapts a function ``fn(request, view) -> PolicyDecision`` into a Policy."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[ToolRequest, RunView], PolicyDecision]) -> None:
        self._fn = fn

    def evaluate(self, request: ToolRequest, view: RunView) -> PolicyDecision:
        return self._fn(request, view)


def need_approval(
    kind: str, reason: str = "", capability: Any = None, presentation: Any = None
) -> PolicyDecision:
    """A ``require_approval`` decision; each part is a value to encode, raw JSON
    bytes, or None for ``{}``."""
    return PolicyDecision.need_approval(kind, reason, capability, presentation)


# Read once: ``Enum.MEMBER`` goes through the enum type's ``__getattr__`` hook,
# and the default policy rules on every tool call.
_REQUIRE_APPROVAL = PolicyOutcome.REQUIRE_APPROVAL.value
_SIDE_EFFECTS = tuple(s.value for s in SideEffect)
_OUTCOMES = tuple(o.value for o in PolicyOutcome)


class SideEffectPolicy:
    """Rules by the tool's declared side effect; a class with no rule is denied."""

    __slots__ = ("rules",)

    def __init__(self, rules: Mapping[str, str]) -> None:
        if not isinstance(rules, Mapping):
            raise ConfigError(f"rules is {described(rules)}, not a mapping of side effect to "
                              "policy outcome")
        for side, outcome in rules.items():
            if side not in _SIDE_EFFECTS:
                raise ConfigError(f"rules: {described(side)} is not a side effect (one of "
                                  f"{', '.join(_SIDE_EFFECTS)})")
            if outcome not in _OUTCOMES:
                raise ConfigError(f'rules["{side}"] is {described(outcome)}, not a policy '
                                  f"outcome (one of {', '.join(_OUTCOMES)})")
        self.rules = {str(side): str(outcome) for side, outcome in rules.items()}

    def evaluate(self, request: ToolRequest, view: RunView) -> PolicyDecision:
        side = request.spec.side_effect
        outcome = self.rules.get(side)
        if outcome is None:
            return PolicyDecision.deny(f'no policy for side effect "{side}"')
        reason = f"side effect {side} is {outcome} by policy"
        if outcome == _REQUIRE_APPROVAL:
            shown = dumps({"args": Raw(request.args or b"{}"), "tool": request.spec.name})
            return PolicyDecision(outcome, reason, side, shown, shown)
        return PolicyDecision(outcome, reason)


class DefaultPolicy(SideEffectPolicy):
    """Reads and local changes run, remote changes wait for a person, destructive
    ones are denied."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__({
            SideEffect.READ_ONLY.value: PolicyOutcome.ALLOW.value,
            SideEffect.LOCAL_MUTATION.value: PolicyOutcome.ALLOW.value,
            SideEffect.REMOTE_MUTATION.value: PolicyOutcome.REQUIRE_APPROVAL.value,
            SideEffect.DESTRUCTIVE.value: PolicyOutcome.DENY.value,
        })

"""The driver's resolved configuration, shared by every session it runs.

Built once by :class:`~agentrt.driver.driver.Driver`: tools checked and
compiled, the policy's identity read and checked, the lease owner named. A
session reads it and never changes it.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from agentrt.canonical import policy_json
from agentrt.driver.agent import Agent
from agentrt.driver.checks import check_duration, check_int
from agentrt.driver.errors import ConfigError, DriverFunctionError
from agentrt.driver.lease import WallClock
from agentrt.driver.model import ModelConfig
from agentrt.driver.policy import Policy
from agentrt.driver.tools import RegisteredTool
from agentrt.errors import described, raised_text
from agentrt.events import Event, Observer
from agentrt.records import Limits, ToolRequest, ToolSpec
from agentrt.store import Store

if TYPE_CHECKING:
    from agentrt.driver.recovery import Reconcile

__all__ = [
    "MAX_POLICY_ID_BYTES",
    "Core",
    "check_limits_config",
    "check_policy_id",
    "new_id",
    "safe_observer",
    "system_now",
    "answer",
    "aware_clock",
]

MAX_POLICY_ID_BYTES = 256
_log = logging.getLogger("agentrt")


def new_id() -> str:
    """16 random bytes as 32 lowercase hex characters (``secrets.token_hex(16)``
    without its three Python calls: a step takes one)."""
    return os.urandom(16).hex()


def answer(fn: Callable[[], Any], what: str, error: type[ConfigError] = ConfigError) -> Any:
    """``fn()``; an exception from it (consumer code) said as one ``error``."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - consumer code; said in one sentence
        raise error(raised_text(what, exc)) from exc


def aware_clock(now: Callable[[], datetime], whose: str = "driver",
                call: str = "now()") -> Callable[[], datetime]:
    """The consumer's clock, with a naive reading taken as UTC (stored times are UTC,
    and a naive one could not be compared with them). A reading that raises or is
    not a datetime is a DriverFunctionError before anything is written with it:
    the call stops as a crashed driver would, and a driver with a working clock
    resumes."""

    def reading() -> datetime:
        t = answer(now, f"the {whose}'s clock {call}", DriverFunctionError)
        if not isinstance(t, datetime):
            raise DriverFunctionError(f"the {whose}'s clock {call} returned {described(t)}, "
                                      "not a datetime")
        return t if t.tzinfo is not None else t.replace(tzinfo=UTC)

    return reading


#: The default clock, ``datetime.now(UTC)``: a partial, so that each of a step's
#: readings is a call into C without a Python frame of its own.
system_now: Callable[[], datetime] = functools.partial(datetime.now, UTC)


def safe_observer(observer: Observer | None) -> Observer | None:
    """An observer whose ``Exception`` is logged, never raised into a loop whose
    transaction has already committed (what is not an Exception, a Ctrl-C,
    still stops the program)."""
    if observer is None:
        return None

    def deliver(event: Event) -> None:
        try:
            observer(event)
        except Exception:  # noqa: BLE001 - the record is already durable
            _log.exception("agentrt: observer failed on event %d (%s)", event.seq, event.type)

    return deliver


def check_policy_id(value: Any) -> str:
    """The policy's identity, refused when too long, not UTF-8 or holding a control character."""
    if not isinstance(value, str):
        raise ConfigError(f"policy id is {type(value).__name__}, not a string")
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError("policy id is not valid UTF-8") from exc
    if len(data) > MAX_POLICY_ID_BYTES:
        raise ConfigError(f"policy id is longer than {MAX_POLICY_ID_BYTES} bytes")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in value):
        raise ConfigError("policy id contains a control character")
    return value


_REQUIRED_COUNTS = ("max_steps", "max_consecutive_tool_failures", "loop_threshold")
_OPTIONAL_COUNTS = ("max_model_calls", "max_output_tokens_per_call", "max_total_tokens",
                    "max_estimated_cost_micros")
_DURATIONS = ("max_active_time", "max_elapsed_time", "approval_ttl", "grant_ttl")


def check_limits_config(limits: Limits) -> None:
    """Refuse limits the run record could not hold or read back, before the run exists.

    Counts are ints (never bools, which would be stored as ``true``) within
    int64; the first three must be positive. Durations are timedeltas that
    int64 nanoseconds hold. As in the reference, a negative optional limit is
    accepted and means unlimited, as 0 does (only ``> 0`` sets one).
    """
    if not isinstance(limits, Limits):
        raise ConfigError(f"limits is {described(limits)}, not a Limits")
    for name in _REQUIRED_COUNTS + _OPTIONAL_COUNTS:
        check_int(f"limits: {name}", getattr(limits, name))
    for name in _REQUIRED_COUNTS:
        if getattr(limits, name) <= 0:
            raise ConfigError(f"limits: {name} must be positive")
    for name in _DURATIONS:
        check_duration(f"limits: {name}", getattr(limits, name))


@dataclass(slots=True)
class Core:
    """Everything a session needs from its driver."""

    store: Store
    agent: Agent | None
    policy: Policy
    policy_id: str
    tools: dict[str, RegisteredTool]
    observer: Observer | None
    now: Callable[[], datetime]
    wall: WallClock
    new_id: Callable[[], str]
    model: ModelConfig | None
    reconcile: Reconcile | None
    owner: str
    lease_ttl: timedelta
    monotonic: Callable[[], float]

    def spec_entries(self) -> list[tuple[ToolSpec, str, bytes]]:
        """Every registered tool's current spec and recorded form, in name order,
        for ``run.created``: a spec that now fails its checks refuses the start
        in one sentence naming the tool, before anything is written."""
        out = []
        for name, tool in self.tools.items():
            try:
                spec, spec_hash, text, _ = tool.current()
            except ValueError as exc:
                raise ConfigError(f'start run: tool "{name}": {exc}; nothing was written'
                                  ) from exc
            out.append((spec, spec_hash, text))
        return out


_POLICY_FORMS: dict[bytes, bytes] = {}


def policy_form(request: ToolRequest, args_form: bytes | None = None) -> ToolRequest:
    """The request as a policy is handed it: arguments and input schema in policy form.

    The same bytes on every path (loop, resume, recheck); the tool itself is
    called with the agent's own argument bytes. ``args_form`` is the arguments'
    policy form when the caller already has it (the loop makes it with their check).
    """
    spec = request.spec
    schema = _POLICY_FORMS.get(spec.input_schema)
    if schema is None:
        schema = policy_json(spec.input_schema)
        if len(_POLICY_FORMS) > 256:
            _POLICY_FORMS.clear()
        _POLICY_FORMS[spec.input_schema] = schema
    return ToolRequest(
        request.run_id,
        request.step_id,
        ToolSpec(spec.name, spec.description, schema, spec.side_effect, spec.timeout,
                 spec.terminal),
        args_form if args_form is not None else policy_json(request.args or b"{}"),
    )

"""The limits checked before every step, in the reference's order.

Steps, the consecutive-failure streak, active time, elapsed time (the only
check that reads the clock, and only when that limit is set), then loop
detection. The first that trips ends the run; the model limits (calls,
tokens, cost) are projected by the model caller before each dispatch instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime, timedelta

from agentrt.canonical import content_key
from agentrt.driver.session import Ending, PreEvent
from agentrt.events import EventType
from agentrt.gojson import sorted_map
from agentrt.records import (
    DecisionKind,
    Limits,
    ObservationKind,
    Reason,
    Run,
    RunStatus,
    Step,
    duration_ns,
)
from agentrt.timefmt import format_duration

__all__ = ["check_before_step", "failure_streak", "loop_streak"]


def failure_streak(steps: list[Step], stop_at: int) -> int:
    """Trailing steps whose observation is a failure; a step without one breaks it."""
    n = 0
    for step in reversed(steps):
        obs = step.observation
        if obs is None or not obs.failure:
            break
        n += 1
        if n >= stop_at:
            break
    return n


# Read once: ``Enum.MEMBER`` goes through the enum type's ``__getattr__`` hook.
_TOOL_CALL = DecisionKind.TOOL_CALL.value
_INVALID_DECISION = ObservationKind.INVALID_DECISION.value


def _signature(step: Step, args_keys: dict[str, bytes]) -> tuple[str, bytes, str] | None:
    """(tool, the arguments' :func:`content_key`, the observation's hash), or None."""
    d, obs = step.decision, step.observation
    if d is None or d.kind != _TOOL_CALL or obs is None:
        return None
    if obs.kind == _INVALID_DECISION:
        return None
    args_key = args_keys.get(step.id)
    if args_key is None:
        args_key = args_keys[step.id] = content_key(d.args or b"{}")
    return d.tool, args_key, obs.content_hash


def _streak(steps: list[Step], stop_at: int,
            args_keys: dict[str, bytes]) -> tuple[int, tuple[str, bytes, str] | None]:
    """:func:`loop_streak` with the arguments' content keys (equal keys, equal
    hashes): the hash is taken only for a loop found, not once a step."""
    first: tuple[str, bytes, str] | None = None
    n = 0
    for step in reversed(steps):
        sig = _signature(step, args_keys)
        if sig is None or (first is not None and sig != first):
            break
        first = sig
        n += 1
        if n >= stop_at:
            break
    if len(args_keys) > 2 * stop_at + 16:  # now and then, not once a step
        _forget_older(steps, stop_at, args_keys)
    return n, first


def _forget_older(steps: list[Step], stop_at: int, args_keys: dict[str, bytes]) -> None:
    """Drop the keys of steps a streak of ``stop_at`` can no longer reach: a key
    is a step's whole canonical arguments, which a long run must not keep."""
    keep = {step.id for step in steps[-(stop_at + 1):]}
    for step_id in [k for k in args_keys if k not in keep]:
        del args_keys[step_id]


def loop_streak(steps: list[Step], stop_at: int,
                args_keys: dict[str, bytes]) -> tuple[int, tuple[str, str, str] | None]:
    """How many trailing steps made the same call and got the same observation, and
    that call's (tool, arguments' hash, observation's hash). ``args_keys`` caches
    each step's arguments' :func:`content_key` by step id."""
    n, first = _streak(steps, stop_at, args_keys)
    if first is None:
        return n, None
    return n, (first[0], hashlib.sha256(first[1]).hexdigest(), first[2])


def _failed(reason: Reason, detail: str, limit: bool = True) -> Ending:
    return Ending(RunStatus.FAILED.value, reason.value, detail, limit=limit)


_UNLIMITED = timedelta(0)


def check_before_step(
    run: Run, steps: list[Step], now: Callable[[], datetime], args_keys: dict[str, bytes]
) -> tuple[Ending, list[PreEvent]] | None:
    """The ending the limits call for before the next step, or None to go on."""
    limits: Limits = run.limits
    if run.step_count >= limits.max_steps:
        return _failed(Reason.LIMIT_STEPS, f"step limit {limits.max_steps} reached"), []
    streak = failure_streak(steps, limits.max_consecutive_tool_failures)
    if streak >= limits.max_consecutive_tool_failures:
        return _failed(Reason.REPEATED_TOOL_FAILURES, f"{streak} consecutive failed steps"), []
    max_active = limits.max_active_time
    # In integer nanoseconds, as the spec compares: a timedelta of active_ms overflows
    # long before the int64 that add_active_ms saturates at.
    if max_active > _UNLIMITED and run.active_ms * 1_000_000 >= duration_ns(max_active):
        return _failed(
            Reason.LIMIT_ACTIVE_TIME,
            f"active time {format_duration(run.active_ms * 1_000_000)} reached limit "
            f"{format_duration(duration_ns(max_active))}"), []
    max_elapsed = limits.max_elapsed_time
    if max_elapsed > _UNLIMITED:
        at = now()
        if run.created_at is not None and at - run.created_at >= max_elapsed:
            return _failed(
                Reason.LIMIT_ELAPSED_TIME,
                f"elapsed time reached limit {format_duration(duration_ns(max_elapsed))}"), []
    repeats, sig = _streak(steps, limits.loop_threshold, args_keys)
    if sig is not None and repeats >= limits.loop_threshold:
        at = now()
        tool, args_key, obs_hash = sig
        args_hash = hashlib.sha256(args_key).hexdigest()
        pre = PreEvent("", at, EventType.LOOP_DETECTED.value, sorted_map({
            "args_hash": args_hash,
            "observation_hash": obs_hash,
            "repeats": repeats,
            "tool": tool,
        }))
        ending = _failed(Reason.LOOP_DETECTED,
                         f"{tool} produced the same observation {repeats} times in a row",
                         limit=False)
        return ending, [pre]
    return None

"""Copies handed to consumers, so an agent, a policy and the driver cannot corrupt
each other's view of the run.

A step list is handed over as a :class:`Snapshot`: the list of records as it
stood (a pointer copy), each record deep-copied only when it is read. A step
therefore costs the same with 400 steps behind it as with 10, and an agent
that never looks at old steps pays nothing for them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar, overload

from agentrt.records import Limits, Run, Usage

__all__ = ["Snapshot", "copy_run"]

T = TypeVar("T")


class Snapshot(Sequence[T]):
    """An immutable sequence of records; every read returns a fresh copy.

    It keeps a reference to the owner's list and a length, so taking one costs
    the same at any run length. The owner promises never to change an element
    below that length in place (the session copies its list before it rewrites
    a step a snapshot may cover, see ``Session.write_step``).
    """

    __slots__ = ("_items", "_n")

    def __init__(self, items: Sequence[T] = (), n: int | None = None) -> None:
        self._items = items
        size = len(items)
        self._n = size if n is None or n > size else n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Snapshot[T]: ...

    def __getitem__(self, index: int | slice) -> T | Snapshot[T]:
        if isinstance(index, slice):
            return Snapshot(tuple(self._items[: self._n][index]))
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("snapshot index out of range")
        return copy.deepcopy(self._items[index])

    def __iter__(self) -> Iterator[T]:
        items = self._items
        for i in range(self._n):
            yield copy.deepcopy(items[i])

    def _view(self) -> list[T]:
        return list(self._items[: self._n])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Snapshot):
            return self._view() == other._view()
        if isinstance(other, (list, tuple)):
            return self._view() == list(other)
        return NotImplemented

    def __hash__(self) -> int:  # pragma: no cover - records are unhashable anyway
        raise TypeError("unhashable type: 'Snapshot'")

    def __repr__(self) -> str:
        return f"Snapshot({self._view()!r})"

    def __deepcopy__(self, memo: dict[int, Any]) -> Snapshot[T]:
        return self  # already immutable from the outside


def copy_run(run: Run) -> Run:
    """A copy of a run record (its nested limits and usage too), cheaper than deepcopy."""
    lim, use = run.limits, run.usage
    return Run(
        run.id, run.goal, run.status,
        Limits(lim.max_steps, lim.max_consecutive_tool_failures, lim.loop_threshold,
               lim.max_model_calls, lim.max_output_tokens_per_call, lim.max_total_tokens,
               lim.max_estimated_cost_micros, lim.max_active_time, lim.max_elapsed_time,
               lim.approval_ttl, lim.grant_ttl),
        run.reason, run.reason_detail, run.step_count, run.created_at, run.started_at,
        run.finished_at, run.result, run.model_calls,
        Usage(use.input_tokens, use.output_tokens, use.cached_input_tokens),
        run.estimated_cost_micros, run.active_ms, run.lease_owner, run.lease_expires_at,
    )

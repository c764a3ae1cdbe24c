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
    """An immutable sequence of records; every read returns a fresh copy."""

    __slots__ = ("_items",)

    def __init__(self, items: Sequence[T] = ()) -> None:
        self._items: tuple[T, ...] = tuple(items)

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Snapshot[T]: ...

    def __getitem__(self, index: int | slice) -> T | Snapshot[T]:
        if isinstance(index, slice):
            return Snapshot(self._items[index])
        return copy.deepcopy(self._items[index])

    def __iter__(self) -> Iterator[T]:
        for item in self._items:
            yield copy.deepcopy(item)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Snapshot):
            return self._items == other._items
        if isinstance(other, (list, tuple)):
            return list(self._items) == list(other)
        return NotImplemented

    def __hash__(self) -> int:  # pragma: no cover - records are unhashable anyway
        raise TypeError("unhashable type: 'Snapshot'")

    def __repr__(self) -> str:
        return f"Snapshot({list(self._items)!r})"

    def __deepcopy__(self, memo: dict[int, Any]) -> Snapshot[T]:
        return self  # already immutable from the outside


def copy_run(run: Run) -> Run:
    """A copy of a run record (its nested limits and usage too), cheaper than deepcopy."""
    out = copy.copy(run)
    out.limits = copy.copy(run.limits) if run.limits is not None else Limits()
    out.usage = copy.copy(run.usage) if run.usage is not None else Usage()
    return out

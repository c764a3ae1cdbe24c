"""The view's errors: what an operator's decision ran into, in the operator's words.

The decision wrappers map the runtime's errors onto these, so a front end can
say "the run is already finished" without knowing which core error a race
produced. Each also subclasses the core error it stands for where there is
one (``except RunStateError`` still catches :class:`RunFinishedError`), and
keeps the core error as ``__cause__``. Messages read ``<detail>: <sentinel>``,
as the reference's wrapped errors do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import PurePath

from agentrt.errors import (
    AgentrtError,
    ApprovalExpiredError,
    NotPendingError,
    RunStateError,
    described,
)
from agentrt.store import Store

__all__ = [
    "ECHO_CHARS",
    "AmbiguousApprovalError",
    "ApprovalDecidedError",
    "ApprovalNotPendingError",
    "DatabaseLockedError",
    "ExpiredApprovalError",
    "NoPendingApprovalError",
    "RunFinishedError",
    "RunNotWaitingError",
    "ViewError",
    "echo",
    "echo_in",
    "require_store",
]


def require_store(store: object) -> None:
    """Refuse what is not a Store (a database path, say) in one sentence, before
    a read fails on it with an AttributeError naming a method."""
    if not isinstance(store, Store):
        hint = ": open one with open_existing(path)" if isinstance(store, (str, PurePath)) else ""
        raise TypeError(f"agentrt: store is {described(store)}, not a Store{hint}")

#: How much of a value (a run id, an approval id) an error quotes. An id the
#: runtime makes is 32 characters; one typed or stored by anyone else may be
#: megabytes, and an error line should still be a line.
ECHO_CHARS = 80


def echo(value: str, limit: int = ECHO_CHARS) -> str:
    """``value`` as an error quotes it: whole up to ``limit`` characters, else its
    first ``limit`` and ``…(N characters)``. Not escaped: whatever prints the
    sentence sanitizes it whole."""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}…({len(value)} characters)"


def echo_in(text: str, values: Iterable[str], limit: int = ECHO_CHARS) -> str:
    """``text`` with each of ``values`` that it quotes whole cut as :func:`echo` cuts
    it (for a sentence built by code that quoted them in full)."""
    for value in sorted({v for v in values if len(v) > limit}, key=len, reverse=True):
        text = text.replace(value, echo(value, limit))
    return text


class ViewError(AgentrtError):
    """Base class of the view's errors; ``sentinel`` is the fixed part of the text."""

    sentinel = "view error"

    def __init__(self, detail: str = "") -> None:
        self.detail = detail
        Exception.__init__(self, f"{detail}: {self.sentinel}" if detail else self.sentinel)


class DatabaseLockedError(ViewError):
    """Another connection held the write lock past the busy timeout."""

    sentinel = "database is locked by another consumer"


class RunNotWaitingError(ViewError, RunStateError):
    """An approval was to be decided on a run that is not waiting for one."""

    sentinel = "run is not waiting for approval"


class ApprovalDecidedError(ViewError, NotPendingError):
    """The approval was decided (or expired) before this decision landed."""

    sentinel = "approval is already decided"


class ExpiredApprovalError(ApprovalDecidedError, ApprovalExpiredError):
    """The approval had expired when the decision came: the decision expired it
    instead, and the run was cancelled as approval_expired."""

    sentinel = "approval has expired"


class RunFinishedError(ViewError, RunStateError):
    """A cancel found the run already ended."""

    sentinel = "run is already finished"


class ApprovalNotPendingError(ViewError, NotPendingError):
    """The approval an operator named is no longer pending."""

    sentinel = "approval is not pending"


class NoPendingApprovalError(ViewError):
    """The run has no pending approval to decide."""

    sentinel = "no pending approval"


class AmbiguousApprovalError(ViewError):
    """The run has several pending approvals and none was named."""

    sentinel = "more than one pending approval"

    def __init__(self, detail: str, ids: Sequence[str] = (), total: int = 0) -> None:
        self.ids = list(ids)
        self.total = total
        super().__init__(detail)

"""One call's hold on one run: its cached view and every transaction it writes.

A session is what ``Driver.start`` and ``Driver.resume`` run. It keeps the
run's steps and approvals in memory, updated from the exact rows each write
stores (so a reload always equals the cache), and writes through a handful
of primitives: start a step, record a decision, end a step, settle the run,
pause it, fail it as internal. Each is ONE transaction holding the rows and
the events that explain them.

Every write to a RUNNING run names this session's lease owner, so a run taken
over by another process, or cancelled by an operator, refuses the write and
the loop stops there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from agentrt.canonical import content_hash
from agentrt.driver.cancel import CancelToken
from agentrt.driver.core import Core
from agentrt.driver.errors import CancelledError
from agentrt.driver.jsonenc import encode
from agentrt.driver.lease import Lease, lost_to_another
from agentrt.driver.model import InFlight
from agentrt.driver.policy import RunView
from agentrt.driver.snapshot import Snapshot, copy_run
from agentrt.driver.stored import (
    evolve,
    stored_decision,
    stored_observation,
    stored_policy,
    stored_time,
)
from agentrt.driver.worker import Worker
from agentrt.errors import EncodeError, LeaseLostError, RunLeasedError, RunStateError
from agentrt.events import EventType
from agentrt.gojson import Raw, dumps, sorted_map
from agentrt.records import (
    Approval,
    ApprovalStatus,
    Decision,
    Observation,
    ObservationKind,
    PolicyDecision,
    Reason,
    Run,
    RunStatus,
    Step,
    StepStatus,
    ToolRequest,
    approval_hash,
)
from agentrt.store.rows import approval_from_row
from agentrt.store.tx import Tx
from agentrt.store.writes import (
    add_active_ms,
    check_run,
    fail_open_steps,
    insert_approval,
    insert_step,
    put_tool_spec,
    read_run,
    transition,
    update_step,
)
from agentrt.timefmt import format_time, format_time_nano, parse_time

__all__ = [
    "ACTIVE",
    "RUNNING",
    "WAITING",
    "Ending",
    "PreEvent",
    "Session",
    "StepEnd",
    "encode",
    "observation",
]

RUNNING = (RunStatus.RUNNING.value,)
WAITING = (RunStatus.WAITING_FOR_APPROVAL.value,)
#: What Resume and Cancel accept as "still running" (INTERRUPTED is never written).
ACTIVE = (RunStatus.RUNNING.value, RunStatus.INTERRUPTED.value)
# Read once, as in the loop: ``Enum.MEMBER`` goes through the enum type's
# ``__getattr__`` hook.
_FAILED = StepStatus.FAILED.value
_STEP_TOOL_FINISHED = EventType.STEP_TOOL_FINISHED.value


def observation(kind: str, fields: dict[str, Any], summary: str) -> Observation:
    """A runtime-built observation: string-only content, so it always encodes."""
    content = encode(sorted_map(fields))
    return Observation(kind, content, summary, content_hash(content))


_Part = TypeVar("_Part", Decision, PolicyDecision, Observation)


def _part(new: _Part | None, make: Callable[[_Part], _Part]) -> tuple[_Part | None, str]:
    """(stored form, column text) of one JSON part of a step."""
    if new is None:
        return None, ""
    return make(new), encode(new.to_json()).decode("utf-8")


#: Stands for "no earlier write of this step": no part or time is reused from it.
_NOTHING_WRITTEN = Step("", "", 0, "")


_RUN_STATE = (
    "SELECT status, step_count, model_calls, input_tokens, output_tokens, cached_input_tokens, "
    "estimated_cost_micros, active_ms, lease_owner, limits_json, lease_expires_at "
    "FROM runs WHERE id = ?"
)


_MS = timedelta(milliseconds=1)


def _ms(later: datetime | None, earlier: datetime | None) -> int:
    if later is None or earlier is None:
        return 0
    return max(int((later - earlier) / _MS), 0)


@dataclass(slots=True)
class StepEnd:
    """How a step ends inside a transaction.

    ``step`` is the step's new state (status, observation, policy), a copy
    made for this end (``evolve``); its ``finished_at`` is set from the
    reading the writer takes, and it becomes the stored step. ``tool`` names
    the tool when the step was executing (a ``step.tool_finished`` is written).
    """

    step: Step
    expected: tuple[str, ...]
    detail: str = ""
    tool: str = ""
    duration_ms: int = 0


@dataclass(slots=True)
class Ending:
    """How a run ends: its terminal status and the explanation."""

    status: str
    reason: str
    detail: str = ""
    result: bytes = b""
    limit: bool = False
    by: str = ""


@dataclass(slots=True)
class PreEvent:
    """An event written first in a settle (``step.policy`` or ``loop.detected``)."""

    step_id: str
    at: datetime
    type: str
    payload: bytes | dict[str, Any]


def blank_as_empty(data: bytes | None) -> bytes:
    """JSON bytes as stored and hashed: blank or None is ``{}``."""
    return data if data and data.strip() else b"{}"


def _encoded(payload: bytes | dict[str, Any] | None) -> bytes:
    """An event payload as stored: a dict encoded, encoded bytes as they are,
    blank or None as ``{}``."""
    if isinstance(payload, dict):
        return encode(payload)
    return blank_as_empty(payload)


def require_latest(tx: Any, a: Approval, status: str) -> None:
    """Inside a transaction: ``a`` must still be its step's latest approval, with
    ``status`` (RunStateError): what a resumer read may since have been replaced."""
    latest = tx.one("SELECT id, status FROM approvals WHERE step_id = ? ORDER BY rowid DESC "
                    "LIMIT 1", (a.step_id,))
    if latest is None or (str(latest[0]), str(latest[1])) != (a.id, status):
        raise RunStateError(f"approval {a.id} is no longer the latest {status} approval of "
                            f"step {a.step_id}: a later pause of the step replaced it")


@dataclass(slots=True)
class Session:
    core: Core
    run_id: str
    cancel: CancelToken
    lease: Lease
    run: Run | None = None
    steps: list[Step] | None = None
    approvals: list[Approval] | None = None
    worker: Worker = field(default_factory=Worker)
    model_in_flight: InFlight = field(default_factory=InFlight)
    specs_written: set[str] = field(default_factory=set)
    #: Each step's arguments' content key (``canonical.content_key``) for the loop check.
    signatures: dict[str, bytes] = field(default_factory=dict)
    _last: tuple[Step, tuple[str, str, str, str]] | None = None
    _limits_text: str = ""
    _shared: int = 0
    _expires_text: str = ""

    # -- reading -----------------------------------------------------------

    def reload(self) -> Run:
        """The run as stored now. While it stays RUNNING only the columns others change
        (status, counts, totals, lease) are read, into the cached record."""
        run = self.run
        if run is None:
            self.run = self.core.store.get_run(self.run_id)
            return self.run
        row = self.core.store.read_row(_RUN_STATE, (self.run_id,))
        if row is None or row[0] != RUNNING[0] or row[9] != self._limits_text:
            self.run = self.core.store.get_run(self.run_id)
            self._limits_text = str(row[9]) if row is not None else ""
            return self.run
        (run.status, run.step_count, run.model_calls, run.usage.input_tokens,
         run.usage.output_tokens, run.usage.cached_input_tokens, run.estimated_cost_micros,
         run.active_ms, run.lease_owner) = row[:9]
        if row[10] != self._expires_text:
            self._expires_text = str(row[10])
            run.lease_expires_at = parse_time(self._expires_text)
        return run

    def load(self) -> str:
        """Read steps and approvals once; the first decode problem, or ''."""
        store = self.core.store
        self.steps = store.list_steps(self.run_id)
        self.approvals = store.list_approvals(self.run_id)
        for s in self.steps:
            if s.decode_error:
                return f"step {s.id} does not decode: {s.decode_error}"
        for a in self.approvals:
            if a.decode_error:
                return f"approval {a.id} does not decode: {a.decode_error}"
        return ""

    def view(self, run: Run, n_steps: int) -> RunView:
        return RunView(copy_run(run), self.step_snapshot(n_steps), self.approval_snapshot())

    # -- writing -------------------------------------------------------------

    def check_cancel(self) -> None:
        if self.cancel.cancelled:
            raise CancelledError(self.cancel.reason)

    def tx(self, *, detached: bool = False) -> AbstractContextManager[Tx]:
        """A write transaction; unless ``detached`` (recording an effect that already
        happened), a cancelled caller writes nothing."""
        if not detached and self.cancel.cancelled:
            raise CancelledError(self.cancel.reason)
        return self.core.store.tx(self.core.observer, own_writes=True)

    def owner_terms(self, statuses: Sequence[str]) -> str | None:
        return self.core.owner if RUNNING[0] in statuses else None

    def put_spec(self, tx: Tx, spec_hash: str, text: bytes) -> None:
        if spec_hash and spec_hash not in self.specs_written:
            put_tool_spec(tx, spec_hash, text)
            self.specs_written.add(spec_hash)

    def step_snapshot(self, n: int) -> Snapshot[Step]:
        """The first ``n`` steps as consumers see them, at O(1) cost."""
        steps = self.steps or []
        if n > self._shared:
            self._shared = n
        return Snapshot(steps, n)

    def approval_snapshot(self) -> Snapshot[Approval]:
        approvals = self.approvals or []
        return Snapshot(approvals, len(approvals))  # approvals are only ever appended

    def write_step(self, tx: Tx, step: Step, expected: tuple[str, ...] | None, *,
                   running: bool = False, live_at: datetime | None = None) -> Step:
        """Insert (``expected`` None) or compare-and-set a step; the cache gets the row
        in its stored form, equal to what a reload decodes.

        ``step`` must be a copy no one else holds (made by ``evolve``): it is
        turned into the stored form, cached and returned.

        A part unchanged since this step's last write (the same object) is neither
        encoded nor converted again. ``running``: the same statement requires the
        run to be RUNNING under this session's lease; ``live_at`` (a wall-clock
        reading, for a step about to start its tool) also that the lease has not
        expired by then (``check_run``'s ``live_at``), from the expiry last read.
        """
        last = self._last
        if last is not None and last[0].id == step.id:
            prev, (d_text, p_text, o_text, s_text) = last
        else:  # a new step: nothing to reuse
            prev, (d_text, p_text, o_text, s_text) = _NOTHING_WRITTEN, ("", "", "", "")
        # A part that is the very object last written for this step (None included)
        # keeps its stored form and text.
        decision, policy, observation_ = step.decision, step.policy, step.observation
        if decision is not prev.decision:
            decision, d_text = _part(decision, stored_decision)
        if policy is not prev.policy:
            policy, p_text = _part(policy, stored_policy)
        if observation_ is not prev.observation:
            observation_, o_text = _part(observation_, stored_observation)
        started, finished = step.started_at, step.finished_at
        if started is not prev.started_at or started is None:
            s_text = stored_time(started)
        row = (
            step.id,
            step.run_id,
            step.index,
            step.status,
            d_text,
            p_text,
            o_text,
            observation_.content_hash if observation_ is not None else "",
            s_text,
            "" if finished is None else stored_time(finished),
            step.spec_hash,
            step.policy_id,
        )
        if expected is None:
            insert_step(tx, row)
        elif live_at is not None:
            update_step(tx, row, expected, running_for=self.core.owner,
                        live=(self._expires_text, live_at))
        else:
            update_step(tx, row, expected, running_for=self.core.owner if running else None)
        # The step is the caller's own copy (``evolve``): it becomes the stored
        # form in place rather than being copied once more.
        step.decision, step.policy, step.observation = decision, policy, observation_
        step.decode_error = ""
        self._last = (step, (d_text, p_text, o_text, s_text))
        # Into the cache (inline: four writes a step).
        steps = self.steps
        assert steps is not None
        index = step.index
        if index < len(steps):
            if index < self._shared:
                # A snapshot handed out may cover this step: leave it the old list.
                steps = self.steps = list(steps)
                self._shared = 0
            steps[index] = step
        else:
            steps.append(step)
        return step

    def decision_json(self) -> str:
        """The decision column just written (``step.decided`` carries the same bytes)."""
        assert self._last is not None
        return self._last[1][0]

    def append(self, tx: Tx, step_id: str, at: datetime, type: str,
               payload: bytes | dict[str, Any] | None = None) -> None:
        """Append one of the run's events. Every payload the loop writes is a dict
        or bytes this package's encoder wrote, so it is not parsed again."""
        # _encoded, inline: five events a step.
        if isinstance(payload, dict):
            data = encode(payload)
        else:
            data = payload if payload and payload.strip() else b"{}"
        tx.append_encoded(self.run_id, step_id, at, type, data)

    def end_in_tx(self, tx: Tx, end: StepEnd, at: datetime, *, running: bool = False) -> Step:
        """The step-end rows and events: the run's active time, the step, then
        ``step.tool_finished`` (if it ran a tool) and ``step.failed`` (if it failed).

        ``running``: the active-time update also checks that the run is RUNNING
        under this session's lease (the run continues, so nothing else checks it).
        """
        new = end.step  # the end's own copy (see StepEnd)
        new.finished_at = at
        add_active_ms(tx, self.run_id, _ms(at, new.started_at),
                      running_for=self.core.owner if running else None)
        obs = new.observation
        stored = self.write_step(tx, new, end.expected)
        failed = new.status == _FAILED
        if end.tool:
            if failed:
                finished: dict[str, Any] = {
                    "duration_ms": end.duration_ms,
                    "error": obs.summary if obs is not None else end.detail,
                    "tool": end.tool,
                }
            else:
                finished = {
                    "content_hash": obs.content_hash if obs is not None else "",
                    "duration_ms": end.duration_ms,
                    "summary": obs.summary if obs is not None else "",
                    "tool": end.tool,
                }
            self.append(tx, new.id, at, _STEP_TOOL_FINISHED, finished)
        if failed:
            if obs is not None:
                self.append(tx, new.id, at, EventType.STEP_FAILED, {
                    "content_hash": obs.content_hash, "detail": end.detail,
                    "observation": obs.kind})
            else:
                self.append(tx, new.id, at, EventType.STEP_FAILED, {"detail": end.detail})
        return stored

    def end_step(self, end: StepEnd, *, detached: bool = False) -> None:
        """End a step while the run goes on (one Now reading)."""
        at = self.core.now()
        with self.tx(detached=detached) as tx:
            self.end_in_tx(tx, end, at, running=True)

    def settle(
        self,
        from_: tuple[str, ...],
        ending: Ending,
        *,
        end: StepEnd | None = None,
        pre: Sequence[PreEvent] = (),
        detached: bool = False,
        spec_entry: tuple[str, bytes] = ("", b""),
        grant: Approval | None = None,
    ) -> Run:
        """End the run (two Now readings with a step end, one without): the
        ``pre`` events, the step end, the terminal status, ``limit.exceeded`` for a
        limit, then ``run.finished``, all in one transaction. Ending a resumed
        run on its ``grant`` needs the grant still the step's latest approval."""
        step_at = self.core.now() if end is not None else None
        now = self.core.now()
        owner = self.owner_terms(from_)
        with self.tx(detached=detached) as tx:
            check_run(tx, self.run_id, from_, owner=owner)
            if grant is not None:
                require_latest(tx, grant, ApprovalStatus.APPROVED.value)
            self.put_spec(tx, *spec_entry)
            for ev in pre:
                tx.append_encoded(self.run_id, ev.step_id, ev.at, ev.type, _encoded(ev.payload))
            if end is not None:
                assert step_at is not None
                self.end_in_tx(tx, end, step_at)
            transition(tx, self.run_id, from_, ending.status, reason=ending.reason,
                       detail=ending.detail, finished_at=now, result=ending.result, owner=owner)
            if ending.limit:
                self.append(tx, "", now, EventType.LIMIT_EXCEEDED,
                            sorted_map({"detail": ending.detail, "reason": ending.reason}))
            run = read_run(tx, self.run_id)
            finished: dict[str, Any] = {
                "detail": ending.detail,
                "reason": ending.reason,
                "status": ending.status,
                "steps": run.step_count,
            }
            if ending.by:
                finished["by"] = ending.by
            self.append(tx, "", now, EventType.RUN_FINISHED, sorted_map(finished))
        self.run = run
        return run

    def fail_internal(self, cause: str, from_: tuple[str, ...]) -> Run:
        """Fail the run as internal_error without rewriting a damaged row: open steps
        get only their outcome columns."""
        now = self.core.now()
        detail = f"internal: {cause}"
        obs = observation(ObservationKind.INVALID_DECISION.value, {"error": detail}, detail)
        owner = self.owner_terms(from_)
        with self.tx(detached=True) as tx:
            check_run(tx, self.run_id, from_, owner=owner)
            fail_open_steps(tx, self.run_id, dumps(obs.to_json()), obs.content_hash, now)
            transition(tx, self.run_id, from_, RunStatus.FAILED.value,
                       reason=Reason.INTERNAL_ERROR.value, detail=detail, finished_at=now,
                       owner=owner)
            run = read_run(tx, self.run_id)
            self.append(tx, "", now, EventType.RUN_FINISHED, sorted_map({
                "detail": detail, "reason": Reason.INTERNAL_ERROR.value,
                "status": RunStatus.FAILED.value, "steps": run.step_count}))
        self.run = run
        return run

    def pause(
        self,
        step: Step,
        expected: tuple[str, ...],
        request: ToolRequest,
        pd: PolicyDecision,
        policy_event: bytes | dict[str, Any],
        policy_at: datetime,
        from_: tuple[str, ...],
        spec_entry: tuple[str, bytes] = ("", b""),
        grant: Approval | None = None,
    ) -> Run:
        """Wait for a person: the step awaits approval, a pending approval binds the
        exact request by its hash, the run is WAITING with no lease (one Now reading).
        Pausing a resumed step again needs its ``grant`` still the latest approval:
        else two resumes of one grant would leave two pending approvals."""
        now = self.core.now()
        assert self.run is not None
        capability, presentation = blank_as_empty(pd.capability), blank_as_empty(pd.presentation)
        try:
            digest = approval_hash(pd.kind, capability, presentation, request)
            request_json = dumps(request.to_json())
        except (ValueError, TypeError) as exc:
            raise EncodeError(f"approval request: {exc}") from exc
        ttl = self.run.limits.approval_ttl
        approval_id = self.core.new_id()
        row = (
            approval_id, self.run_id, step.id, pd.kind,
            capability.decode("utf-8"), presentation.decode("utf-8"),
            request_json.decode("utf-8"), digest, ApprovalStatus.PENDING.value,
            format_time(now), format_time(now + ttl if ttl > timedelta(0) else None),
            "", "", "",
        )
        owner = self.owner_terms(from_)
        new = evolve(step, status=StepStatus.AWAITING_APPROVAL.value, policy=pd)
        with self.tx() as tx:
            check_run(tx, self.run_id, from_, owner=owner)
            if grant is not None:
                require_latest(tx, grant, ApprovalStatus.APPROVED.value)
            self.write_step(tx, new, expected)
            transition(tx, self.run_id, from_, RunStatus.WAITING_FOR_APPROVAL.value, owner=owner)
            self.put_spec(tx, *spec_entry)
            self.append(tx, step.id, policy_at, EventType.STEP_POLICY, policy_event)
            insert_approval(tx, row)
            self.append(tx, step.id, now, EventType.APPROVAL_REQUESTED, sorted_map({
                "approval_id": approval_id,
                "capability": Raw(capability),
                "hash": digest,
                "kind": pd.kind,
                "presentation": Raw(presentation),
                "reason": pd.reason,
            }))
            run = read_run(tx, self.run_id)
            assert self.approvals is not None
            self.approvals.append(approval_from_row(row))
        self.run = run
        return run

    # -- losing the run ------------------------------------------------------

    def lost(self, exc: BaseException | None) -> Run:
        """The run is no longer ours to write: return it if an operator cancelled it,
        otherwise raise LeaseLostError (wrapping who holds it now)."""
        run = self.core.store.get_run(self.run_id)
        if run.status == RunStatus.CANCELLED and run.reason == Reason.OPERATOR_CANCELLED:
            self.run = run
            return run
        if isinstance(exc, LeaseLostError):
            raise exc
        if (isinstance(exc, RunStateError) and not isinstance(exc, RunLeasedError)
                and run.status == RunStatus.RUNNING and run.lease_owner == self.core.owner):
            raise exc
        if isinstance(exc, RunLeasedError):
            raise LeaseLostError(exc.detail) from exc
        taken = lost_to_another(run, self.core.owner)
        if taken is not None:  # the heartbeat found it first: who holds it, all the same
            raise taken
        if (run.status == RunStatus.RUNNING and run.lease_owner == self.core.owner
                and run.lease_expires_at is not None):
            # still ours by name: it lapsed (a frozen process, a starved heartbeat)
            raise LeaseLostError(f"run {self.run_id}: the lease expired at "
                                 f"{format_time_nano(run.lease_expires_at)}") from exc
        raise LeaseLostError(
            f"run {self.run_id} is {run.status}, and the lease of {self.core.owner} is no "
            "longer held") from exc

    def close(self) -> None:
        self.worker.close()


"""The Driver: start a run, resume one, and take the operator's decisions on its clock.

A driver is built once from a store, an agent, a policy and tools, and may run
many runs (one call per run at a time). ``start`` and ``resume`` block until
the run pauses for an approval, ends, loses its lease, or the caller's
:class:`~agentrt.driver.cancel.CancelToken` fires.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import PurePath

import apsw

from agentrt.driver.agent import Agent
from agentrt.driver.approvals import check_shown, decide, resume_approved
from agentrt.driver.cancel import CancelToken
from agentrt.driver.checks import (
    MAX_LEASE_TTL,
    MIN_LEASE_TTL,
    check_callable,
    check_method,
    check_text,
    clipped,
    wait_duration,
)
from agentrt.driver.core import (
    Core,
    answer,
    aware_clock,
    check_limits_config,
    check_policy_id,
    new_id,
    safe_observer,
    system_now,
)
from agentrt.driver.errors import ConfigError, DriverFunctionError
from agentrt.driver.lease import Lease, WallClock, lease_owner_id, wall_now
from agentrt.driver.loop import run_loop, too_big_text
from agentrt.driver.model import ModelConfig
from agentrt.driver.operator import cancel_run
from agentrt.driver.policy import IdentifiedPolicy, Policy
from agentrt.driver.recovery import Reconcile, recover
from agentrt.driver.session import ACTIVE, WAITING, Session
from agentrt.driver.tools import Tool, register_tools
from agentrt.errors import (
    AgentrtError,
    EncodeError,
    NotFoundError,
    RunLeasedError,
    RunStateError,
    described,
)
from agentrt.events import EventType, Observer
from agentrt.gojson import Raw, dumps, sorted_map
from agentrt.records import (
    DEFAULT_LEASE_TTL,
    Approval,
    Limits,
    Reason,
    Run,
    RunStatus,
    ToolSpec,
    default_limits,
)
from agentrt.store import Store
from agentrt.store.tx import StoreWriteError
from agentrt.store.writes import insert_run
from agentrt.timefmt import format_time

__all__ = ["Driver"]


def _ttl(value: timedelta | float | None) -> timedelta:
    """The lease TTL: None or 0 is the default (30 s), as in the reference; anything
    else must be a positive wait between MIN_LEASE_TTL and MAX_LEASE_TTL."""
    if value is None:
        return DEFAULT_LEASE_TTL
    ttl = wait_duration("lease_ttl", value, hi=MAX_LEASE_TTL)
    if ttl == timedelta(0):
        return DEFAULT_LEASE_TTL
    if ttl < timedelta(0):
        raise ConfigError(f"lease_ttl is {described(value)}, negative: give a positive TTL, "
                          "or 0 for the default of 30 s")
    if ttl < MIN_LEASE_TTL:
        raise ConfigError(
            f"lease_ttl is {described(value)}, shorter than the minimum of "
            f"{MIN_LEASE_TTL.total_seconds():g} s: the "
            "heartbeat renews the lease every third of its TTL, and a shorter lease "
            "expires before the run's first write, so the run stops with its lease lost")
    return ttl


_NOT_UTF8_OWNER = "the lease owner would be stored as U+FFFD and never match this driver"
_NOT_UTF8_ID = ("it would be stored as U+FFFD, and the run could not be addressed by the id "
                "given")


def _check_store(store: object) -> None:
    if store is None:
        raise ConfigError("store is required")
    if not isinstance(store, Store):
        hint = "; open one with open_store(path)" if isinstance(store, (str, PurePath)) else ""
        raise ConfigError(f"store is {described(store)}, not a Store{hint}")
    try:
        store.read_row("SELECT 1", ())
    except apsw.Error as exc:
        raise ConfigError(f"store {store.path} cannot be read ({exc}); is it closed?") from exc
    if store.read_only:
        raise ConfigError(
            f"store {store.path} was opened read-only and a driver writes every step; open "
            "it with open_store(path) or open_existing(path, read_only=False)")


def _check_cancel(cancel: object) -> None:
    if cancel is not None and not isinstance(cancel, CancelToken):
        raise ConfigError(f"cancel is {described(cancel)}, not a CancelToken")


class Driver:
    """Runs an agent's loop against a store, recording every transition.

    ``now`` is the driver's clock for every recorded time (a deterministic
    consumer keys its records on the sequence of readings); leases always use
    the wall clock (``wall``, replaceable only for tests). ``lease_token`` fixes
    the random part of the lease owner id and ``monotonic`` the clock tool
    durations are measured on (``time.monotonic``): both only for a record that
    must be reproduced byte for byte, such as the export fixtures. A ``now`` or
    ``new_id`` that raises or answers something unusable mid-run stops the call
    with a ConfigError before anything is written with that answer; the run is
    left as a crashed driver leaves it, for a resume.
    """

    def __init__(
        self,
        store: Store,
        agent: Agent | None,
        policy: Policy,
        tools: Sequence[Tool] = (),
        *,
        observer: Observer | None = None,
        now: Callable[[], datetime] | None = None,
        new_id: Callable[[], str] | None = None,
        model: ModelConfig | None = None,
        reconcile: Reconcile | None = None,
        lease_owner: str = "",
        lease_ttl: timedelta | float = DEFAULT_LEASE_TTL,
        wall: WallClock | None = None,
        lease_token: str = "",
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        _check_store(store)
        if agent is None:
            raise ConfigError("agent is required")
        check_method("agent", agent, ("decide",),
                     "an Agent (an object with a decide(step) method)",
                     "wrap a function in AgentFunc")
        if policy is None:
            raise ConfigError("policy is required")
        check_method("policy", policy, ("evaluate",),
                     "a Policy (an object with an evaluate(request, view) method)",
                     "wrap a function in PolicyFunc")
        if model is not None:
            if not isinstance(model, ModelConfig):
                raise ConfigError(f"model is {described(model)}, not a ModelConfig")
            model.check()  # again: its fields may have changed since it was made
            if model.model is None:
                raise ConfigError("model config without a model")
        registered = register_tools(tools)
        for name, value, expected in (
            ("observer", observer, "a function observer(event)"),
            ("now", now, "a clock function now() -> datetime"),
            ("new_id", new_id, "a function new_id() -> str"),
            ("reconcile", reconcile, "a function reconcile(view) -> Reconciliation"),
            ("wall", wall, "a clock function wall() -> datetime"),
            ("monotonic", monotonic, "a clock function monotonic() -> float"),
        ):
            if value is not None:
                check_callable(name, value, expected, sync=name != "reconcile")
        check_text("lease_owner", lease_owner, utf8=_NOT_UTF8_OWNER)
        check_text("lease_token", lease_token, utf8=_NOT_UTF8_OWNER)
        lease_ttl_ = _ttl(lease_ttl)
        policy_id = ""
        if isinstance(policy, IdentifiedPolicy):  # it has a policy_id attribute
            named = policy.policy_id
            check_callable("policy.policy_id", named, "a method policy_id(self) -> str",
                           sync=True)
            policy_id = check_policy_id(answer(named, "policy.policy_id()"))
        self._core = Core(
            store=store,
            agent=agent,
            policy=policy,
            policy_id=policy_id,
            tools=registered,
            observer=safe_observer(observer),
            now=aware_clock(now) if now is not None else system_now,
            wall=aware_clock(wall, call="wall()") if wall is not None else wall_now,
            new_id=_checked_ids(new_id) if new_id is not None else _default_id,
            model=model.resolved() if model is not None else None,
            reconcile=reconcile,
            owner=lease_owner_id(lease_owner, lease_token),
            lease_ttl=lease_ttl_,
            monotonic=monotonic or time.monotonic,
        )
        self._lock = threading.Lock()
        self._live: dict[str, Session] = {}

    @property
    def owner(self) -> str:
        """This driver's lease owner id (``<lease_owner>/<12 hex>`` when named)."""
        return self._core.owner

    @property
    def store(self) -> Store:
        return self._core.store

    # -- runs ----------------------------------------------------------------

    def start(self, goal: str, limits: Limits | None = None, run_id: str | None = None,
              cancel: CancelToken | None = None) -> Run:
        """Create a run and drive it until it pauses or ends."""
        core = self._core
        check_text("goal", goal)
        if run_id is None:
            run_id = core.new_id()
            check_text("the run id new_id() returned", run_id, utf8=_NOT_UTF8_ID)
        else:
            check_text("run_id", run_id, utf8=_NOT_UTF8_ID)
        if not run_id:
            raise ConfigError("run id is required")
        limits = limits if limits is not None else default_limits()
        check_limits_config(limits)
        _check_cancel(cancel)
        with self._session(run_id, cancel) as s:
            return self._finish(s, lambda: self._begin(s, goal, limits))

    def resume(self, run_id: str, cancel: CancelToken | None = None) -> Run:
        """Continue a run: an approved WAITING run executes its grant; a RUNNING run
        whose driver stopped is taken over and recovered."""
        check_text("run_id", run_id, utf8=_NOT_UTF8_ID)
        _check_cancel(cancel)
        with self._session(run_id, cancel) as s:
            run = s.reload()
            if run.status == RunStatus.WAITING_FOR_APPROVAL:
                return self._finish(s, lambda: self._continue(s, resume_approved, WAITING))
            if run.status in ACTIVE:
                return self._finish(s, lambda: self._continue(s, recover, ACTIVE))
            raise RunStateError(f"run {run_id} is {run.status}, not "
                                "RUNNING, INTERRUPTED or WAITING_FOR_APPROVAL")

    def _begin(self, s: Session, goal: str, limits: Limits) -> Run:
        core = self._core
        now = core.now()
        wall_at = core.wall()
        entries = core.spec_entries()
        run = Run(s.run_id, goal, RunStatus.RUNNING.value, limits, created_at=now,
                  started_at=now)
        limits_json = dumps(limits.to_json())
        with s.tx() as tx:
            try:
                insert_run(tx, run, limits_json, core.owner, wall_at + core.lease_ttl)
            except apsw.TooBigError as exc:
                raise ConfigError(_too_big_start(s, goal, entries, exc)) from None
            except apsw.ConstraintError as exc:
                raise ConfigError(f"start run: {exc}") from exc
            s.lease.taking()  # an id already used took nothing: its lease is not ours
            try:
                for _, spec_hash, text in entries:
                    s.put_spec(tx, spec_hash, text)
                s.append(tx, "", now, EventType.RUN_CREATED, sorted_map({
                    "goal": goal,
                    "limits": Raw(limits_json),
                    "tools": [spec_hash for _, spec_hash, _ in entries],
                }))
            except apsw.TooBigError as exc:
                s.specs_written.clear()  # rolled back with the run
                raise ConfigError(_too_big_start(s, goal, entries, exc)) from None
            s.append(tx, "", now, EventType.RUN_STARTED, {})
        s.lease.start(wall_at)
        s.steps, s.approvals = [], []
        return run_loop(s)

    @staticmethod
    def _continue(s: Session, first: Callable[[Session], Run | None],
                  from_: tuple[str, ...]) -> Run:
        try:
            done = first(s)
        except EncodeError as exc:
            return s.fail_internal(str(exc), from_)
        except apsw.TooBigError as exc:
            return s.fail_internal(too_big_text(exc), from_)
        except RunStateError as exc:
            if isinstance(exc, RunLeasedError) and s.lease.expires_at is not None:
                # It took the run over (its lease was written) and another owner took
                # it since, during the recovery: lost, not refused (spec 6.2).
                return s.lost(exc)
            # an operator's cancel won the race with the resume's first write:
            # the run is returned, as the loop returns it at its next write
            run = s.core.store.get_run(s.run_id)
            if (run.status == RunStatus.CANCELLED
                    and run.reason == Reason.OPERATOR_CANCELLED):
                s.run = run
                return run
            raise
        return done if done is not None else run_loop(s)

    @contextmanager
    def _session(self, run_id: str, cancel: CancelToken | None) -> Iterator[Session]:
        """One call's session; a second concurrent call on the same run is refused."""
        core = self._core
        with self._lock:
            live = self._live.get(run_id)
            if live is not None:
                raise RunLeasedError.in_another_call(run_id, core.owner, live.lease.expires_at)
            lease = Lease(core.store, run_id, core.owner, core.lease_ttl, core.wall)
            token, timer = _call_token(cancel)
            s = Session(core, run_id, token, lease)
            self._live[run_id] = s
        try:
            yield s
        except StoreWriteError as exc:
            raise _unwritten(core, run_id, exc) from exc.__cause__
        except apsw.ConstraintError as exc:
            table = _reused_id_table(exc)
            if table and core.new_id is not _default_id:
                raise ConfigError(
                    f"new_id() returned an id already in {table} ({exc}): each call must "
                    "return an id not used before; the run is left for a resume") from exc
            raise
        finally:
            with self._lock:
                self._live.pop(run_id, None)
            if timer is not None:
                timer.cancel()
                timer.join()
                assert cancel is not None
                cancel.release(token)

    @staticmethod
    def _finish(s: Session, body: Callable[[], Run]) -> Run:
        """Run ``body``; whatever happens, stop the heartbeat, and free the lease at
        once unless the run paused or ended (which already cleared it)."""
        result: Run | None = None
        try:
            result = body()
            return result
        finally:
            s.lease.stop()
            s.close()
            if result is None or not (result.status == RunStatus.WAITING_FOR_APPROVAL
                                      or RunStatus(result.status).terminal):
                s.lease.release()

    # -- the operator's decisions, on the driver's clock ----------------------

    def approve(self, run_id: str, approval_id: str, by: str, note: str = "") -> Approval:
        core = self._core
        return decide(core.store, core.observer, core.now, run_id, approval_id,
                      approve=True, by=by, note=note)

    def reject(self, run_id: str, approval_id: str, by: str, note: str = "") -> Approval:
        core = self._core
        return decide(core.store, core.observer, core.now, run_id, approval_id,
                      approve=False, by=by, note=note)

    def approve_shown(self, run_id: str, approval_id: str, shown_hash: str, by: str,
                      note: str = "") -> Approval:
        core = self._core
        return decide(core.store, core.observer, core.now, run_id, approval_id,
                      approve=True, by=by, note=note, shown_hash=check_shown(shown_hash))

    def reject_shown(self, run_id: str, approval_id: str, shown_hash: str, by: str,
                     note: str = "") -> Approval:
        core = self._core
        return decide(core.store, core.observer, core.now, run_id, approval_id,
                      approve=False, by=by, note=note, shown_hash=check_shown(shown_hash))

    def cancel(self, run_id: str, by: str, note: str = "") -> Run:
        core = self._core
        return cancel_run(core.store, core.observer, core.now, run_id, by, note)


def _too_big_start(s: Session, goal: str, entries: Sequence[tuple[ToolSpec, str, bytes]],
                   exc: apsw.TooBigError) -> str:
    """Why a run could not be created: the largest of what it records, too large to
    store (nothing was written)."""
    sizes = [(len(goal.encode("utf-8", "replace")), "the goal"),
             (len(s.run_id.encode("utf-8", "replace")), "the run id"),
             (len(s.core.owner.encode("utf-8", "replace")), "the lease owner")]
    sizes += [(len(text), f"the spec of tool {clipped(spec.name)!r}") for spec, _, text in entries]
    size, what = max(sizes)
    return (f"start run: {what} ({size} bytes) is too large to store ({exc}); "
            "nothing was written")


_ENDED = (RunStatus.COMPLETED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value)


def _unwritten(core: Core, run_id: str, exc: StoreWriteError) -> StoreWriteError:
    """A transaction the disk refused, said with what to do next: resume the run (or
    start it again, if not even its start was written). The lease could not be
    released on a full disk either: another driver's resume waits for its expiry."""
    try:
        owner, expires = core.store.lease(run_id)
        status = core.store.get_run_capped(run_id).status
    except NotFoundError:
        return exc.retold(core.store.path, "start the run again")
    except (AgentrtError, apsw.Error):
        owner, expires, status = "", None, ""
    if status in _ENDED:  # a cancel ended it meanwhile: nothing is left to resume
        return exc.retold(core.store.path, "note that nothing can record what was refused "
                          "(an outcome that came after the run ended) now: run "
                          f"{run_id} is already {status}")
    action = f"resume run {run_id}"
    if owner == core.owner and expires is not None:
        action += (f" (this driver at once; another once the lease it holds, which could not "
                   f"be released either, expires at {format_time(expires)})")
    return exc.retold(core.store.path, action)


def _call_token(cancel: CancelToken | None) -> tuple[CancelToken, threading.Timer | None]:
    """The call's token, and the timer that cancels it when the caller's deadline passes.

    The loop reads only ``cancelled`` (a deadline would cost a clock reading at
    every check), so a caller's ``CancelToken(timeout=...)`` stopped nothing:
    the run went on past it, every tool's token already timed out. A token with
    a deadline is given a child that a timer cancels then, as a cancel would.
    """
    if cancel is None:
        return CancelToken(), None
    deadline = cancel.deadline
    if deadline is None:
        return cancel, None
    left = deadline - time.monotonic()
    if not left < threading.TIMEOUT_MAX:  # inf, or past any wait a thread can make
        return cancel, None
    token = cancel.child()
    timer = threading.Timer(max(left, 0.0), token.cancel, ("deadline exceeded",))
    timer.name, timer.daemon = "agentrt-deadline", True
    timer.start()
    return token, timer


#: The default id function (``core.new_id is _default_id`` tells it from a consumer's).
_default_id = new_id


def _reused_id_table(exc: apsw.ConstraintError) -> str:
    """The table whose id a refused insert reused ('' for another constraint)."""
    for table in ("steps", "model_calls", "approvals"):
        if str(exc).endswith(f"UNIQUE constraint failed: {table}.id"):
            return table
    return ""


def _checked_ids(new_id: Callable[[], str]) -> Callable[[], str]:
    """The consumer's id function, each id checked before a row or event carries it:
    an empty step id would read as a run-level event, a non-str one is unstorable.
    A failure stops the call as a crashed driver would (the run stays resumable)."""

    def fresh() -> str:
        return check_text("the id new_id() returned",
                          answer(new_id, "new_id()", DriverFunctionError),
                          blank="every step, call and approval needs an id",
                          utf8=_NOT_UTF8_ID, error=DriverFunctionError)

    return fresh

"""The run lease: taken, renewed by a heartbeat, checked before every side effect."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta

import pytest
from _driver_kit import call, fixture_tools, limits, make, stopped_while_deciding, types

from agentrt.driver import (
    FuncTool,
    Message,
    ModelConfig,
    ModelRequest,
    ModelResponse,
    Reconciliation,
    ToolResult,
    cancel,
)
from agentrt.errors import LeaseLostError, RunLeasedError, RunStateError
from agentrt.records import Decision
from agentrt.store import open_store
from agentrt.testing import FakeClock, ScriptedModel


class Background:
    """Runs a driver call on a thread and keeps its result or exception."""

    def __init__(self, fn) -> None:
        self.result = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # noqa: BLE001
            self.error = exc

    def join(self) -> None:
        self.thread.join(10)
        assert not self.thread.is_alive()


def blocking_tool(release: threading.Event, entered: threading.Event, name: str = "write",
                  calls: list | None = None, timeout: float = 30) -> FuncTool:
    def fn(c):
        if calls is not None:
            calls.append(c)
        entered.set()
        release.wait(20)
        return ToolResult(b'{"late":true}', "finished")
    return FuncTool(name, fn, side_effect="local_mutation", timeout=timeout)


def wait_for(predicate, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_resume_of_a_live_run_is_refused_without_change_or_clock_reading(tmp_path):
    path = str(tmp_path / "runs.db")
    release, entered = threading.Event(), threading.Event()
    a, store, _, _ = make(store=open_store(path), script=[call("write"), Decision.complete()],
                          tools=[blocking_tool(release, entered)], lease_owner="a")
    bg = Background(lambda: a.start("g", limits(), run_id="r"))
    entered.wait(10)
    c = FakeClock()
    b, store_b, _, _ = make(store=open_store(path), script=[Decision.complete()],
                            tools=[blocking_tool(release, entered)], now=c, lease_owner="b")
    before = store_b.list_events("r")
    with pytest.raises(RunLeasedError) as info:
        b.resume("r")
    assert info.value.owner == a.owner and info.value.expires_at is not None
    assert str(info.value).startswith(f"agentrt: run r is leased by {a.owner} until ")
    assert c.readings == 0 and store_b.list_events("r") == before
    release.set()
    bg.join()
    assert bg.result.status == "COMPLETED"


def test_an_expired_lease_is_taken_over_and_reconciled_once(tmp_path):
    path = str(tmp_path / "runs.db")
    wall = FakeClock()
    release, entered = threading.Event(), threading.Event()
    a, store, _, _ = make(store=open_store(path), script=[call("write")],
                          tools=[blocking_tool(release, entered)], lease_owner="a",
                          lease_ttl=10, wall=wall)
    bg = Background(lambda: a.start("g", limits(), run_id="r"))
    entered.wait(10)
    reconciled: list = []

    def reconcile(view):
        reconciled.append([s.status for s in view.steps])
        return Reconciliation("continue")

    b, store_b, _, _ = make(store=open_store(path), script=[None, Decision.complete()],
                            tools=[blocking_tool(release, entered)], lease_owner="b",
                            lease_ttl=10, wall=wall, reconcile=reconcile)
    wall.advance(timedelta(seconds=9))
    with pytest.raises(RunLeasedError):
        b.resume("r")
    wall.advance(timedelta(seconds=2))
    run = b.resume("r")
    assert run.status == "COMPLETED" and reconciled == [["interrupted"]]
    seq = types(store_b, "r")
    assert seq[-6:] == ["lease.taken_over", "step.interrupted", "run.resumed", "step.started",
                        "step.decided", "run.finished"]
    taken = json.loads(store_b.list_events("r")[-6].payload)
    assert (taken["previous_owner"], taken["owner"]) == (a.owner, b.owner)
    assert json.loads(store_b.list_events("r")[-5].payload) == {
        "previous_status": {"previous_status": "executing"}}
    release.set()
    bg.join()
    assert isinstance(bg.error, LeaseLostError)
    assert types(store_b, "r") == seq  # the dead loop's outcome is not recorded


def test_a_loop_that_loses_its_lease_stops_before_the_next_tool_call(tmp_path):
    calls: list = []
    holder: dict = {}

    def steal(c):
        calls.append(c)
        with holder["store"].tx() as tx:
            tx.execute("UPDATE runs SET lease_owner = 'thief/1' WHERE id = 'r'")
        return ToolResult(b"{}", "done")

    d, store, _, _ = make(script=[call("write"), call("write"), Decision.complete()],
                          tools=[FuncTool("write", steal, timeout=5)])
    holder["store"] = store
    with pytest.raises(LeaseLostError, match="leased by thief/1") as info:
        d.start("g", limits(), run_id="r")
    # The reference's lost lease wraps its run-state error: one except catches both.
    assert isinstance(info.value, RunStateError)
    assert isinstance(info.value.__cause__, RunLeasedError)
    assert len(calls) == 1
    assert store.list_steps("r")[0].status == "executing"  # left for the new owner
    assert store.lease("r")[0] == "thief/1"


def test_an_expired_lease_stops_the_loop_before_its_next_side_effect():
    wall = FakeClock()
    calls: list = []

    def slow(c):
        calls.append(c)
        wall.advance(timedelta(seconds=31))  # past the lease, and no heartbeat ran
        return ToolResult(b"{}", "done")

    d, store, _, _ = make(script=[call("write"), call("write"), Decision.complete()],
                          tools=[FuncTool("write", slow, timeout=5)], wall=wall)
    # Said as the lapse it is: the run still names this owner, nobody took it over.
    with pytest.raises(LeaseLostError, match=r"run r: the lease expired at 2026-"):
        d.start("g", limits(), run_id="r")
    assert len(calls) == 1
    assert store.list_steps("r")[0].status == "done"  # the in-flight outcome is recorded
    assert store.lease("r") == ("", None)  # released at once
    d2, _, _, _ = make(store=store, script=[None, Decision.complete()], wall=wall)
    assert d2.resume("r").status == "COMPLETED"
    assert "lease.taken_over" not in types(store, "r")


def test_a_lapsed_lease_starts_no_side_effect():
    wall = FakeClock()
    calls: list = []

    def decide(step):
        wall.advance(timedelta(seconds=31))
        return call("write")

    d, store, _, _ = make(script=[decide], tools=[FuncTool("write", calls.append, timeout=5)],
                          wall=wall)
    with pytest.raises(LeaseLostError, match="the lease expired at"):
        d.start("g", limits(), run_id="r")
    assert calls == []
    assert "step.tool_started" not in types(store, "r")


def test_no_model_call_after_the_lease_is_lost():
    wall = FakeClock()
    model = ScriptedModel([])

    def decide(step):
        wall.advance(timedelta(minutes=5))
        step.model.generate(ModelRequest([Message("user", "hi")], max_output_tokens=5))
        return Decision.complete()

    d, store, _, _ = make(script=[decide], model=ModelConfig(model), wall=wall)
    # Said as the lapse it is, as the loop says it: nobody took the run over.
    with pytest.raises(LeaseLostError, match=r"run r: the lease expired at 2026-"):
        d.start("g", limits(), run_id="r")
    assert model.requests == [] and store.list_model_calls("r") == []


def test_cancel_needs_no_lease(tmp_path):
    path = str(tmp_path / "runs.db")
    release, entered = threading.Event(), threading.Event()
    a, store, _, _ = make(store=open_store(path), script=[call("write"), Decision.complete()],
                          tools=[blocking_tool(release, entered)])
    bg = Background(lambda: a.start("g", limits(), run_id="r"))
    entered.wait(10)
    other = open_store(path)
    run = cancel(other, "r", "operator", "stop")
    assert (run.status, run.lease_owner) == ("CANCELLED", "")
    release.set()
    bg.join()
    assert bg.result.status == "CANCELLED"


def test_a_long_tool_call_keeps_the_lease(tmp_path):
    path = str(tmp_path / "runs.db")
    seen: list = []

    def long(c):
        first = open_store(path).lease("r")[1]
        time.sleep(1.0)
        seen.append((first, open_store(path).lease("r")[1]))
        return ToolResult(b"{}", "done")

    d, store, _, _ = make(store=open_store(path), script=[call("write"), Decision.complete()],
                          tools=[FuncTool("write", long, timeout=5)], lease_ttl=0.3)
    run = d.start("g", limits(), run_id="r")
    assert run.status == "COMPLETED"
    first, later = seen[0]
    assert later > first  # renewed by the heartbeat while the tool ran


class Boom(BaseException):
    """Not an Exception: it propagates out of the loop, as a Go panic does."""


def heartbeats(run_id: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"agentrt-lease-{run_id}"]


def test_the_heartbeat_stops_on_return_and_on_a_panic():
    d, store, _, _ = make(script=[Decision.complete()])
    d.start("g", limits(), run_id="r1")
    assert heartbeats("r1") == []

    def panic(step):
        raise Boom()

    d2, store2, _, _ = make(script=[panic])
    with pytest.raises(Boom):
        d2.start("g", limits(), run_id="r2")
    assert heartbeats("r2") == []
    assert store2.lease("r2") == ("", None)  # released at once
    assert store2.get_run("r2").status == "RUNNING"


def test_the_same_lease_owner_name_is_two_owners():
    a, _, _, _ = make(lease_owner="worker")
    b, _, _, _ = make(lease_owner="worker")
    assert a.owner != b.owner
    assert a.owner.startswith("worker/") and len(a.owner) == len("worker/") + 12


def test_a_lease_token_fixes_the_owner_id_for_a_reproducible_record():
    a, store, _, _ = make(script=[call("read", b'{"n":1}'), Decision.complete()],
                          lease_owner="fixtures", lease_token="000000000001")
    b, _, _, _ = make(lease_owner="fixtures", lease_token="000000000001")
    assert a.owner == b.owner == "fixtures/000000000001"
    c, _, _, _ = make(lease_token="abc")
    assert c.owner == "abc"
    assert a.start("g", limits(), run_id="r").status == "COMPLETED"


def test_one_driver_refuses_a_second_call_on_its_run():
    release, entered = threading.Event(), threading.Event()
    d, store, _, _ = make(script=[call("write"), Decision.complete()],
                          tools=[blocking_tool(release, entered)])
    bg = Background(lambda: d.start("g", limits(), run_id="r"))
    entered.wait(10)
    with pytest.raises(RunLeasedError) as info:
        d.resume("r")
    assert info.value.owner == d.owner
    release.set()
    bg.join()
    assert bg.result.status == "COMPLETED"


def test_a_takeover_of_the_drivers_own_expired_lease_is_recorded():
    d, store = stopped_while_deciding()
    with store.tx() as tx:  # as if this driver had crashed holding the lease
        tx.execute("UPDATE runs SET lease_owner = ?, lease_expires_at = '2020-01-01T00:00:00Z'",
                   (d.owner,))
    assert d.resume("r").status == "COMPLETED"
    taken = [json.loads(e.payload) for e in store.list_events("r")
             if e.type == "lease.taken_over"]
    assert taken == [{"owner": d.owner, "previous_expires_at": "2020-01-01T00:00:00Z",
                      "previous_owner": d.owner}]


def test_a_held_connection_does_not_starve_the_heartbeat(tmp_path):
    path = str(tmp_path / "runs.db")
    seen: list = []
    holder: dict = {}

    def hold(c):
        with holder["store"].locked():  # a consumer holding the main connection
            first = open_store(path).lease("r")[1]
            time.sleep(1.0)
            seen.append((first, open_store(path).lease("r")[1]))
        return ToolResult(b"{}", "done")

    d, store, _, _ = make(store=open_store(path), script=[call("write"), Decision.complete()],
                          tools=[FuncTool("write", hold, timeout=5)], lease_ttl=0.3)
    holder["store"] = store
    assert d.start("g", limits(), run_id="r").status == "COMPLETED"
    first, later = seen[0]
    assert later > first


def test_a_run_started_under_the_in_memory_stores_lock_ends_while_the_heartbeat_waits():
    # An in-memory store has one connection, so its heartbeat needs the lock the
    # caller holds; it must give up the tick, not hold the run's end forever.
    def slow(c):
        time.sleep(0.2)  # two heartbeat ticks, each finding the lock held
        return ToolResult(b"{}", "done")

    d, store, _, _ = make(script=[call("write"), Decision.complete()],
                          tools=[FuncTool("write", slow, timeout=5)], lease_ttl=0.3)

    def start_holding_the_lock():
        with store.locked():
            return d.start("g", limits(), run_id="r")

    bg = Background(start_holding_the_lock)
    bg.join()
    assert bg.error is None and bg.result.status == "COMPLETED"
    assert heartbeats("r") == []


def test_closing_the_store_while_the_heartbeat_renews_closes_its_connection(tmp_path):
    path = str(tmp_path / "runs.db")
    store = open_store(path)
    renewing = threading.Event()

    def renew_slowly():  # a renewal still running on the lease connection
        with store.lease_connection() as conn:
            renewing.set()
            conn.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                         "WHERE i < 3000000) SELECT count(*) FROM n").fetchall()

    beat = threading.Thread(target=renew_slowly)
    beat.start()
    renewing.wait(10)
    store.close()
    beat.join(10)
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
           if os.path.exists(f"/proc/self/fd/{fd}")]
    assert [f for f in fds if f.startswith(path)] == []


def test_a_second_start_of_a_run_id_being_started_says_another_call_drives_it():
    # The first start is inside its session and has not written the run (and its
    # lease expiry) yet: the clock it reads first holds it there.
    reading, go = threading.Event(), threading.Event()
    clock = FakeClock()

    def now():
        if not reading.is_set():
            reading.set()
            go.wait(10)
        return clock()

    d, store, _, _ = make(script=[Decision.complete()], now=now)
    bg = Background(lambda: d.start("g", limits(), run_id="r"))
    assert reading.wait(10)
    with pytest.raises(RunLeasedError) as info:
        d.start("g", limits(), run_id="r")
    go.set()
    bg.join()
    assert bg.result.status == "COMPLETED"
    assert info.value.owner == d.owner and info.value.expires_at is None
    assert str(info.value) == (f"agentrt: run r is leased by {d.owner}: another call of "
                               "this driver is driving it; wait for that call to return")


def test_a_lease_with_no_expiry_stored_is_said_as_such():
    assert str(RunLeasedError("r", "", None)) == (
        "agentrt: run r is leased by (no owner) with no expiry recorded")


def test_a_refused_resume_writes_nothing_so_it_waits_for_no_writer(tmp_path):
    """Refused on a live lease, a resume changes nothing: it must not release a lease
    it never took, which needs the write lock and waited out the busy timeout
    behind any other writer."""
    import apsw

    from agentrt.driver import DefaultPolicy, Driver
    from agentrt.testing import ScriptedAgent

    db = str(tmp_path / "runs.db")
    entered, release = threading.Event(), threading.Event()

    def hang(c):
        entered.set()
        release.wait(20)
        return ToolResult(b"{}", "done")

    tools = [FuncTool("write", hang, side_effect="local_mutation")]
    owner = Driver(open_store(db), ScriptedAgent([Decision.tool_call("write", b"{}"),
                                                  Decision.complete()]),
                   DefaultPolicy(), tools, lease_owner="owner")
    running = threading.Thread(target=lambda: owner.start("g", run_id="r"), daemon=True)
    running.start()
    assert entered.wait(10)
    other = Driver(open_store(db), ScriptedAgent([]), DefaultPolicy(), tools,
                   lease_owner="other")
    writer = apsw.Connection(db)
    writer.execute("BEGIN IMMEDIATE")  # another consumer's transaction
    try:
        began = time.monotonic()
        with pytest.raises(RunLeasedError):
            other.resume("r")
        took = time.monotonic() - began
    finally:
        writer.execute("ROLLBACK")
        release.set()
        running.join(10)
    assert took < 1.0


# -- a lease another owner took is named in the error, whoever finds it first ---------

_THIEF = ("UPDATE runs SET lease_owner = 'thief/1', "
          "lease_expires_at = '2099-01-01T00:00:00Z' WHERE id = 'r'")
_HELD = "agentrt: run lease lost: run r is leased by thief/1 until 2099-01-01T00:00:00Z"


def _take_the_lease(db: str) -> None:
    other = open_store(db)
    with other.tx() as tx:
        tx.execute(_THIEF)
    other.close()


def _hi() -> ModelRequest:
    return ModelRequest([Message("user", "hi")], max_output_tokens=5)


def _names_the_new_owner(error: LeaseLostError) -> None:
    """Spec 10: ErrLeaseLost wrapping ErrRunLeased when another owner holds it."""
    assert str(error) == _HELD
    assert isinstance(error.__cause__, RunLeasedError)
    assert error.__cause__.owner == "thief/1"


def test_a_model_call_on_a_run_another_owner_took_names_it_once(tmp_path):
    """The dispatch's write finds the new owner: the sentence said 'agentrt:' twice."""
    db = str(tmp_path / "r.db")
    model = ScriptedModel([ModelResponse("a")])

    def decide(step):
        _take_the_lease(db)  # before any heartbeat tick: the dispatch's write finds it
        step.model.generate(_hi())
        return Decision.complete()

    d, _, _, _ = make(store=open_store(db), script=[decide], model=ModelConfig(model))
    with pytest.raises(LeaseLostError) as info:
        d.start("g", limits(), run_id="r")
    assert model.requests == []
    _names_the_new_owner(info.value)


def test_a_lease_the_heartbeat_found_taken_between_two_model_calls_names_the_new_owner(
        tmp_path):
    db = str(tmp_path / "r.db")
    model = ScriptedModel([ModelResponse("a"), ModelResponse("b")])

    def decide(step):
        step.model.generate(_hi())
        _take_the_lease(db)
        deadline = time.monotonic() + 10
        while step.model._lease.ok() and time.monotonic() < deadline:  # the heartbeat's turn
            time.sleep(0.01)
        step.model.generate(_hi())
        return Decision.complete()

    d, _, _, _ = make(store=open_store(db), script=[decide], model=ModelConfig(model),
                      lease_ttl=0.3)
    with pytest.raises(LeaseLostError) as info:
        d.start("g", limits(), run_id="r")
    assert len(model.requests) == 1
    _names_the_new_owner(info.value)


def test_a_lease_the_heartbeat_found_taken_between_two_steps_names_the_new_owner(tmp_path):
    db = str(tmp_path / "r.db")
    calls: list = []
    sessions: list = []

    def observer(event):  # consumer code between two steps (or a process frozen there)
        if event.type == "step.tool_finished":
            _take_the_lease(db)
            lease = d._live["r"].lease
            deadline = time.monotonic() + 10
            while not lease.lost and time.monotonic() < deadline:  # the heartbeat's turn
                time.sleep(0.01)
            sessions.append(lease.lost)

    d, _, _, _ = make(store=open_store(db), tools=fixture_tools(calls), observer=observer,
                      script=[call("write", b'{"n":1}'), call("write", b'{"n":2}'),
                              Decision.complete()], lease_ttl=0.3)
    with pytest.raises(LeaseLostError) as info:
        d.start("g", limits(), run_id="r")
    assert sessions == [True] and len(calls) == 1
    _names_the_new_owner(info.value)


def test_a_resume_that_loses_the_lease_during_its_recovery_raises_lease_lost():
    """Taken over (step.interrupted written), then lost to another owner while the
    reconcile function ran: lost, not the refusal a resume that changed nothing gets."""
    _, store = stopped_while_deciding("r")

    def reconcile(view):
        with store.tx() as tx:  # another process takes the run meanwhile
            tx.execute(_THIEF)
        return Reconciliation("continue")

    d, _, _, _ = make(store=store, script=[None, Decision.complete()], reconcile=reconcile)
    with pytest.raises(LeaseLostError) as info:
        d.resume("r")
    assert "step.interrupted" in types(store, "r")
    _names_the_new_owner(info.value)

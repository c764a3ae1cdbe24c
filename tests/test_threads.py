"""Thread safety within one process: drivers, operators, followers and readers
sharing a store, and a store closed under them. Every wait is bounded."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from _driver_kit import call, fixture_tools, limits, make, types
from stress import rounds

from agentrt import open_existing
from agentrt.driver import FuncTool, ToolResult, approve, cancel, reject
from agentrt.errors import NotFoundError, NotPendingError, RunLeasedError, RunStateError
from agentrt.events import Event
from agentrt.records import Decision
from agentrt.store import Store, StoreClosedError, open_store
from agentrt_export import Follower, MemoryCursor

TOOL_STEP = ["step.started", "step.decided", "step.policy", "step.tool_started",
             "step.tool_finished"]
END = ["step.started", "step.decided", "run.finished"]


class Outcomes:
    """Runs functions on threads at once (released together by a barrier) and keeps
    each one's result or exception, by key."""

    def __init__(self, fns: dict[Any, Callable[[], Any]]) -> None:
        self.results: dict[Any, Any] = {}
        self.errors: dict[Any, BaseException] = {}
        gate = threading.Barrier(len(fns))
        self.threads = [threading.Thread(target=self._run, args=(k, fn, gate), daemon=True)
                        for k, fn in fns.items()]
        for t in self.threads:
            t.start()

    def _run(self, key: Any, fn: Callable[[], Any], gate: threading.Barrier) -> None:
        try:
            gate.wait(10)
            self.results[key] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            self.errors[key] = exc

    def join(self, seconds: float = 20) -> Outcomes:
        deadline = time.monotonic() + seconds
        for t in self.threads:
            t.join(max(deadline - time.monotonic(), 0))
        assert not any(t.is_alive() for t in self.threads), "a thread did not finish in time"
        return self


def wait_for(predicate: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.002)


def tool_steps(n: int) -> list:
    return [call("read", b'{"n":%d}' % i) for i in range(n)] + [Decision.complete()]


def assert_completed_exactly(store: Store, run_id: str, steps: int) -> None:
    """The run completed after ``steps`` tool steps, and its record says exactly that."""
    run = store.get_run(run_id)
    assert (run.status, run.reason, run.step_count) == ("COMPLETED", "goal_completed", steps + 1)
    assert types(store, run_id) == ["run.created", "run.started"] + TOOL_STEP * steps + END
    stored = store.list_steps(run_id)
    assert [s.index for s in stored] == list(range(steps + 1))
    assert {s.status for s in stored} == {"done"}
    finished = json.loads(store.list_events(run_id)[-1].payload)
    assert finished["steps"] == steps + 1


def gapless(events: list[Event]) -> bool:
    return [e.seq for e in events] == list(range(1, len(events) + 1))


class Follow:
    """A follower on a thread, collecting what it delivers."""

    def __init__(self, follower: Follower) -> None:
        self.got: list[Event] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(follower,), daemon=True)
        self.thread.start()

    def _run(self, follower: Follower) -> None:
        try:
            follower.follow(self.got.append, self.stop)
        except BaseException as exc:  # noqa: BLE001
            self.error = exc

    def until(self, count: int) -> list[Event]:
        wait_for(lambda: len(self.got) >= count)
        self.stop.set()
        self.thread.join(5)
        assert not self.thread.is_alive()
        assert self.error is None
        return self.got


# -- many loops at once ---------------------------------------------------------


def test_one_driver_runs_eight_runs_from_eight_threads_each_with_its_exact_record(tmp_path):
    calls: list = []
    store = open_store(str(tmp_path / "runs.db"))
    d, _, _, obs = make(store=store, script=tool_steps(6), tools=fixture_tools(calls))
    out = Outcomes({i: (lambda i=i: d.start("g", limits(), run_id=f"run{i}"))
                    for i in range(8)}).join()
    assert out.errors == {}
    for i in range(8):
        assert out.results[i].status == "COMPLETED"
        assert_completed_exactly(store, f"run{i}", 6)
        assert sum(c.run_id == f"run{i}" for c in calls) == 6
        # each run's events reach the shared observer in the run's own order
        assert [e for e in obs.events if e.run_id == f"run{i}"] == store.list_events(f"run{i}")
    everything = store.list_events_after("", 0, 10_000)
    assert gapless(everything) and len(everything) == len(obs.events) == 8 * 35
    assert store.verify_events().broken is None


def test_drivers_on_one_store_and_on_another_handle_of_its_file_extend_one_gapless_chain(
        tmp_path):
    path = str(tmp_path / "runs.db")
    first, second = open_store(path), open_store(path)
    drivers = [make(store=first, script=tool_steps(5))[0],
               make(store=first, script=tool_steps(5))[0],
               make(store=second, script=tool_steps(5))[0]]
    out = Outcomes({i: (lambda i=i: drivers[i % 3].start("g", limits(), run_id=f"run{i}"))
                    for i in range(9)}).join()
    assert out.errors == {}
    for store in (first, second):
        everything = store.list_events_after("", 0, 10_000)
        assert gapless(everything) and len(everything) == 9 * 30
        assert store.verify_events().broken is None
    for i in range(9):
        assert_completed_exactly(second, f"run{i}", 5)


def test_concurrent_starts_of_one_run_id_create_the_run_once():
    calls: list = []
    d, store, _, _ = make(script=tool_steps(2), tools=fixture_tools(calls))
    out = Outcomes({i: (lambda: d.start("g", limits(), run_id="same")) for i in range(4)}).join()
    assert [r.status for r in out.results.values()] == ["COMPLETED"]
    assert len(out.errors) == 3
    # refused while the first holds the run, or as a duplicate once it exists
    assert all(isinstance(e, RunLeasedError) or "start run" in str(e)
               for e in out.errors.values())
    assert_completed_exactly(store, "same", 2)
    assert len(calls) == 2


# -- followers and readers beside the writers --------------------------------------


def test_followers_in_threads_deliver_every_event_once_in_seq_order_while_threads_write(
        tmp_path):
    path = str(tmp_path / "runs.db")
    store = open_store(path)
    d, _, _, _ = make(store=store, script=tool_steps(8))
    every = Follow(Follower(open_existing(path), interval=0.01, page_size=7,
                            cursor=MemoryCursor()))
    one_run = Follow(Follower(store, run_id="run3", interval=0.01, page_size=3))
    out = Outcomes({i: (lambda i=i: d.start("g", limits(), run_id=f"run{i}"))
                    for i in range(6)}).join()
    assert out.errors == {}
    stored = store.list_events_after("", 0, 10_000)
    assert len(stored) == 6 * 45
    assert every.until(len(stored)) == stored
    assert one_run.until(45) == store.list_events("run3")


def test_reads_from_many_threads_during_writes_see_gapless_pages_and_whole_runs(tmp_path):
    path = str(tmp_path / "runs.db")
    store = open_store(path)
    reader = open_existing(path)
    d, _, _, _ = make(store=store, script=tool_steps(30), lease_ttl=5)
    done = threading.Event()
    problems: list[str] = []

    def read(s: Store) -> int:
        last = reads = 0
        while not done.is_set() or reads == 0:
            page = s.list_events_after("", last, 40)
            if [e.seq for e in page] != list(range(last + 1, last + 1 + len(page))):
                problems.append(f"a page after {last} is not the next seqs")
            if page:
                last = page[-1].seq
            runs, _ = s.list_runs_page(20, 0)
            for r in runs:
                run = s.get_run(r.id)
                if run.status not in ("RUNNING", "COMPLETED"):
                    problems.append(f"run {r.id} is {run.status}")
            reads += 1
        return last

    readers = Outcomes({k: (lambda k=k: read(store if k % 2 else reader)) for k in range(4)})
    writers = Outcomes({i: (lambda i=i: d.start("g", limits(), run_id=f"run{i}"))
                        for i in range(4)}).join()
    done.set()
    readers.join()
    assert writers.errors == {} and readers.errors == {} and problems == []
    head = store.chain_head()[0]
    assert head == 4 * 155
    assert all(0 < last <= head for last in readers.results.values())
    assert store.verify_events().broken is None


# -- operators racing loops and each other -----------------------------------------


def blocking(entered: threading.Semaphore, release: threading.Event) -> FuncTool:
    def fn(c):
        entered.release()
        release.wait(10)
        return ToolResult(b'{"moved":1}', "moved")
    return FuncTool("move", fn, side_effect="local_mutation", timeout=20)


def test_operator_cancels_from_other_threads_stop_live_loops_and_only_late_outcomes_follow():
    entered, release = threading.Semaphore(0), threading.Event()
    d, store, _, _ = make(script=[call("move"), call("move"), Decision.complete()],
                          tools=[blocking(entered, release)])
    loops = Outcomes({i: (lambda i=i: d.start("g", limits(), run_id=f"run{i}"))
                      for i in range(6)})
    for _ in range(6):
        assert entered.acquire(timeout=10)  # every loop is inside its first tool call
    cancelled = {f"run{i}" for i in range(0, 6, 2)}
    ops = Outcomes({r: (lambda r=r: cancel(store, r, "ops", "stop")) for r in cancelled}).join()
    assert ops.errors == {}
    release.set()
    loops.join()
    assert loops.errors == {}
    for i in range(6):
        run_id = f"run{i}"
        run = loops.results[i]
        if run_id in cancelled:
            assert (run.status, run.reason) == ("CANCELLED", "operator_cancelled")
            events = store.list_events(run_id)
            assert [e.type for e in events] == ["run.created", "run.started"] + TOOL_STEP[:4] + [
                "run.finished", "step.tool_finished"]
            assert json.loads(events[-1].payload)["late"] is True
            assert json.loads(events[-2].payload)["steps"] == 1
            assert [s.status for s in store.list_steps(run_id)] == ["failed"]
        else:
            assert run.status == "COMPLETED"
            assert_completed_exactly(store, run_id, 2)
    assert store.verify_events().broken is None


def paused_run(tmp_path=None, calls: list | None = None):
    """A run WAITING for the approval of a ``publish`` call."""
    store = open_store(str(tmp_path / "runs.db")) if tmp_path is not None else None
    d, store, _, _ = make(store=store, script=[call("publish"), Decision.complete()],
                          tools=fixture_tools(calls))
    assert d.start("g", limits(), run_id="r").status == "WAITING_FOR_APPROVAL"
    (a,) = store.list_approvals("r")
    return d, store, a


def test_concurrent_approvals_of_one_approval_grant_it_once():
    d, store, a = paused_run()
    out = Outcomes({k: (lambda k=k: approve(store, "r", a.id, f"op{k}")) for k in range(6)}).join()
    assert len(out.results) == 1
    assert all(isinstance(e, NotPendingError) for e in out.errors.values())
    (granted,) = out.results.values()
    assert granted.status == "approved"
    decided = [e for e in store.list_events("r") if e.type == "approval.decided"]
    assert len(decided) == 1 and json.loads(decided[0].payload)["by"] == granted.decided_by
    assert d.resume("r").status == "COMPLETED"
    assert store.verify_events().broken is None


def race_an_approval_and_a_rejection() -> None:
    d, store, a = paused_run()

    def decide(k: int):
        return (approve if k % 2 else reject)(store, "r", a.id, f"op{k}")

    out = Outcomes({("approve" if k % 2 else "reject", k): (lambda k=k: decide(k))
                    for k in range(6)}).join()
    assert len(out.results) == 1
    ((kind, _), decided) = next(iter(out.results.items()))
    assert all(isinstance(e, (NotPendingError, RunStateError)) for e in out.errors.values())
    run = store.get_run("r")
    if kind == "approve":
        assert decided.status == "approved" and run.status == "WAITING_FOR_APPROVAL"
        assert d.resume("r").status == "COMPLETED"
    else:
        assert decided.status == "rejected"
        assert (run.status, run.reason) == ("CANCELLED", "approval_rejected")
    assert types(store, "r").count("approval.decided") == 1
    assert types(store, "r").count("run.finished") == 1
    assert store.verify_events().broken is None


def test_an_approval_and_a_rejection_racing_on_one_approval_decide_it_once():
    for _ in range(4):
        race_an_approval_and_a_rejection()


def test_concurrent_cancels_of_one_live_run_finish_it_once():
    entered, release = threading.Semaphore(0), threading.Event()
    d, store, _, _ = make(script=[call("move"), Decision.complete()],
                          tools=[blocking(entered, release)])
    loop = Outcomes({"loop": lambda: d.start("g", limits(), run_id="r")})
    assert entered.acquire(timeout=10)
    ops = Outcomes({k: (lambda k=k: cancel(store, "r", f"op{k}", "")) for k in range(5)}).join()
    release.set()
    loop.join()
    assert len(ops.results) == 1
    assert all(isinstance(e, RunStateError) for e in ops.errors.values())
    assert loop.results["loop"].status == "CANCELLED"
    assert types(store, "r").count("run.finished") == 1
    assert types(store, "r")[-2:] == ["run.finished", "step.tool_finished"]


def test_two_threads_resuming_one_approved_run_on_one_driver_execute_it_once():
    calls: list = []
    d, store, a = paused_run(calls=calls)
    approve(store, "r", a.id, "ops")
    out = Outcomes({k: (lambda: d.resume("r")) for k in range(3)}).join()
    assert [r.status for r in out.results.values()] == ["COMPLETED"]
    assert all(isinstance(e, RunStateError) for e in out.errors.values())
    assert len(calls) == 1
    assert types(store, "r").count("run.resumed") == 1
    assert store.verify_events().broken is None


# -- closing under use -------------------------------------------------------------


def test_close_waits_for_a_transaction_in_another_thread_and_later_calls_say_closed(tmp_path):
    path = str(tmp_path / "runs.db")
    store = open_store(path)
    d, _, _, _ = make(store=store, script=tool_steps(1))
    d.start("g", limits(), run_id="r")
    head = store.chain_head()[0]
    inside, closing = threading.Event(), threading.Event()
    closer = threading.Thread(target=lambda: (inside.wait(5), closing.set(), store.close()),
                              daemon=True)
    closer.start()
    with store.tx() as tx:
        inside.set()
        assert closing.wait(5)
        time.sleep(0.1)
        assert closer.is_alive()  # close() waits for this transaction
        tx.append("r", "", store.get_run("r").created_at, "consumer.note", {"i": 1})
    closer.join(5)
    assert not closer.is_alive()
    with pytest.raises(StoreClosedError):
        store.list_events_after("", 0, 10)
    with pytest.raises(StoreClosedError), store.tx():
        pass
    reopened = open_existing(path)
    assert reopened.chain_head()[0] == head + 1  # the transaction committed whole
    assert reopened.verify_events().broken is None


def test_closing_the_store_under_live_loops_raises_store_closed_in_each_and_ends_heartbeats(
        tmp_path):
    path = str(tmp_path / "runs.db")
    store = open_store(path)
    entered, release = threading.Semaphore(0), threading.Event()
    d, _, _, _ = make(store=store, script=[call("move"), Decision.complete()],
                      tools=[blocking(entered, release)])
    loops = Outcomes({i: (lambda i=i: d.start("g", limits(), run_id=f"run{i}"))
                      for i in range(4)})
    for _ in range(4):
        assert entered.acquire(timeout=10)
    store.close()
    release.set()
    loops.join()
    assert loops.results == {}
    assert all(isinstance(e, StoreClosedError) for e in loops.errors.values())
    wait_for(lambda: not [t for t in threading.enumerate()
                          if t.name.startswith("agentrt-lease-run")], 5)
    reopened = open_existing(path)
    for i in range(4):  # nothing was written after the close
        assert types(reopened, f"run{i}")[-1] == "step.tool_started"
        assert reopened.get_run(f"run{i}").status == "RUNNING"
    assert reopened.verify_events().broken is None


def test_a_follower_whose_store_is_closed_from_another_thread_stops_saying_so(tmp_path):
    path = str(tmp_path / "runs.db")
    d, _, _, _ = make(store=open_store(path), script=tool_steps(1))
    d.start("g", limits(), run_id="r")
    reader = open_existing(path)
    following = Follow(Follower(reader, interval=0.01))
    wait_for(lambda: len(following.got) == 10)
    reader.close()
    following.thread.join(5)
    assert not following.thread.is_alive()
    assert isinstance(following.error, StoreClosedError)
    assert [e.seq for e in following.got] == list(range(1, 11))


# -- the lease beside busy threads ---------------------------------------------------


def test_a_long_tool_keeps_its_lease_while_other_threads_drive_runs_on_the_same_store(
        tmp_path):
    path = str(tmp_path / "runs.db")
    store = open_store(path)

    def long(c):
        time.sleep(2.0)  # longer than the lease TTL
        return ToolResult(b"{}", "long done")

    slow, _, _, _ = make(store=store, script=[call("long"), Decision.complete()],
                         tools=[FuncTool("long", long, timeout=10)], lease_ttl=1.2)
    busy, _, _, _ = make(store=store, script=tool_steps(150),
                         lease_ttl=5)
    out = Outcomes({"slow": lambda: slow.start("g", limits(), run_id="slow"),
                    **{i: (lambda i=i: busy.start("g", limits(max_steps=200,
                                                              loop_threshold=1000),
                                                  run_id=f"busy{i}"))
                       for i in range(2)}}).join(30)
    assert out.errors == {}
    assert out.results["slow"].status == "COMPLETED"
    assert "lease.taken_over" not in types(store, "slow")
    assert store.verify_events().broken is None


# -- stress ------------------------------------------------------------------------


def quick(c):
    time.sleep(random.random() * 0.003)
    return ToolResult(b'{"ok":1}', "ok")


def cancels_racing_live_loops(path: str) -> None:
    """Eight loops on two drivers, four of them cancelled at random moments, and a
    follower beside them; then every record is checked."""
    store = open_store(path)
    tool = FuncTool("t", quick, side_effect="local_mutation", timeout=5)
    script = [call("t", b'{"n":%d}' % i) for i in range(20)] + [Decision.complete()]
    drivers = [make(store=store, script=script, tools=[tool])[0] for _ in range(2)]
    following = Follow(Follower(open_existing(path), interval=0.01, page_size=50))

    def created(run_id: str) -> None:
        """Wait for the run's first commit: a cancel before it is a NotFoundError."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(NotFoundError):
                store.get_run(run_id)
                return
            time.sleep(0.0005)

    def cancels() -> None:
        for i in random.sample(range(8), 4):
            created(f"run{i}")
            time.sleep(random.random() * 0.02)
            with contextlib.suppress(RunStateError):  # it ended first
                cancel(store, f"run{i}", "ops", "")

    out = Outcomes({"ops": cancels,
                    **{i: (lambda i=i: drivers[i % 2].start("g", limits(), run_id=f"run{i}"))
                       for i in range(8)}}).join(60)
    assert out.errors == {}
    for i in range(8):
        run_id = f"run{i}"
        events = store.list_events(run_id)
        kinds = [e.type for e in events]
        assert kinds.count("run.finished") == 1
        after = events[kinds.index("run.finished") + 1:]
        assert all(e.type == "step.tool_finished" and json.loads(e.payload)["late"]
                   for e in after)
        run = store.get_run(run_id)
        assert run.status in ("COMPLETED", "CANCELLED")
        assert run.step_count == len(store.list_steps(run_id))
    stored = store.list_events_after("", 0, 100_000)
    assert gapless(stored) and store.verify_events().broken is None
    assert following.until(len(stored)) == stored


@pytest.mark.slow
def test_random_cancels_racing_eight_live_loops_leave_records_that_hold(tmp_path):
    for n in range(rounds(2, 30)):
        cancels_racing_live_loops(str(tmp_path / f"runs{n}.db"))


def test_a_page_and_its_total_come_from_one_snapshot_while_another_connection_commits(tmp_path):
    path = str(tmp_path / "runs.db")
    writer, reader = open_store(path), open_existing(path)
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            with writer.tx() as tx:
                tx.run("INSERT INTO runs (id, goal, status, limits_json, created_at) "
                       "VALUES (?, 'g', 'RUNNING', '{}', '2026-10-01T09:00:00Z')", (f"run{i}",))
            i += 1

    thread = threading.Thread(target=write)
    thread.start()
    try:
        disagreed = []
        for _ in range(60):  # the writer commits between the two reads about half the time
            runs, total = reader.list_runs_page(100_000, 0)
            if len(runs) != total:
                disagreed.append((len(runs), total))
    finally:
        stop.set()
        thread.join(10)
    assert disagreed == []
    reader.close()
    writer.close()

"""Time limits: active time excludes approval waits, elapsed time includes them."""

from __future__ import annotations

from datetime import timedelta

from _driver_kit import call, limits, make, types

from agentrt.driver import FuncTool, ToolResult, approve
from agentrt.records import Decision
from agentrt.testing import FakeClock


def slow_tools(c: FakeClock, seconds: float) -> list:
    """read (read_only) and publish (remote_mutation), each taking `seconds` of the clock."""
    def work(call_):
        c.advance(timedelta(seconds=seconds))
        return ToolResult(b"{}", "worked")
    return [FuncTool("read", work, timeout=5),
            FuncTool("publish", work, side_effect="remote_mutation", timeout=5)]


def test_active_time_excludes_the_approval_wait():
    c = FakeClock()
    d, store, _, _ = make(script=[call("read"), call("publish"), Decision.complete()],
                          tools=slow_tools(c, 20), now=c)
    run = d.start("g", limits(), run_id="r")
    assert run.status == "WAITING_FOR_APPROVAL" and run.active_ms == 20_000
    c.advance(timedelta(hours=3))
    approve(store, "r", store.list_approvals("r")[0].id, "operator")
    c.step = timedelta(0)
    run = d.resume("r")
    assert run.status == "COMPLETED"
    assert run.active_ms == 40_000  # 20 s before the pause, 20 s after, not the 3 h


def test_active_time_stops_the_run():
    c = FakeClock()
    d, store, _, _ = make(script=[call("read", f'{{"n":{i}}}') for i in range(5)],
                          tools=slow_tools(c, 20), now=c)
    run = d.start("g", limits(max_active_time=timedelta(seconds=25)), run_id="r")
    assert (run.status, run.reason, run.step_count) == ("FAILED", "limit_active_time", 2)
    assert run.reason_detail == "active time 40s reached limit 25s"
    assert types(store, "r")[-2:] == ["limit.exceeded", "run.finished"]


def test_elapsed_time_includes_the_waits():
    c = FakeClock()
    d, store, _, _ = make(script=[call("publish"), call("read"), Decision.complete()],
                          tools=slow_tools(c, 1), now=c)
    run = d.start("g", limits(max_elapsed_time=timedelta(hours=1)), run_id="r")
    c.advance(timedelta(hours=3))
    approve(store, "r", store.list_approvals("r")[0].id, "operator")
    run = d.resume("r")
    assert (run.status, run.reason) == ("FAILED", "limit_elapsed_time")
    assert run.reason_detail == "elapsed time reached limit 1h0m0s"
    steps = store.list_steps("r")
    assert len(steps) == 1 and steps[0].status == "done"  # the approved step still ran


def test_active_time_survives_the_finish():
    c = FakeClock(step=timedelta(seconds=1))
    d, store, _, _ = make(script=[Decision.complete()], now=c)
    run = d.start("g", limits(), run_id="r")
    # start 0; step starts at 1; decision 2; the step ends at 3, the run at 4.
    assert run.active_ms == 2000 == store.get_run("r").active_ms

"""Driver processes killed with SIGKILL, or cancelled by an operator's
command, at random points, and what the record then holds.

After kills: an intact chain, every step's events in a canonical order, and
no side effect run again without an operator's approval; and, mapped to
OpenTelemetry spans, one trace whose spans a restarted exporter rebuilds
exactly. After a cancel: the run ends at once, nothing starts after it, and
only what was in flight (a tool's outcome, a model call's result) is
appended after ``run.finished``.

Each round runs ``driver_worker.py`` on one run, kills it a random
time after it is ready, waits out its lease and starts the next, until the
run has been killed ``KILLS_PER_RUN`` times; then a last worker finishes it.
The kill lands anywhere: in a tool, between a tool's effect and its record,
in a model call or its retry's backoff, inside a commit. The tools write a
ledger outside the database, so executions the record never saw are counted
too.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from _cli_kit import invoke
from span_helpers import full, one_pass, restarted
from stress import rounds

from agentrt.records import Step
from agentrt.store import open_store
from agentrt_otel import SpanMapper

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "driver_worker.py"
LEASE_TTL = 0.5  # the worker's
KILLS_PER_RUN = 6
#: A whole run takes about 60 ms once the worker is ready.
MAX_DELAY = 0.08

#: One letter per event type a step's events may hold.
CODES = {
    "step.started": "S", "model.dispatched": "D", "model.completed": "C",
    "model.failed": "F", "step.decided": "E", "step.policy": "P",
    "step.tool_started": "T", "step.tool_finished": "R", "step.interrupted": "I",
    "approval.requested": "Q", "approval.decided": "A", "run.resumed": "U",
}
_DECIDING = r"S(?:D[CF])*"
STEP_ORDERS = {
    # the completing step, and a step interrupted while it was deciding
    "complete": re.compile(rf"{_DECIDING}E"),
    "interrupted deciding": re.compile(rf"{_DECIDING}[DE]?I"),
    # a read-only tool interrupted is not run again: the agent decides anew
    "look": re.compile(rf"{_DECIDING}EPT[RI]"),
    # an interrupted side effect waits for an approval, then runs once more
    "write": re.compile(rf"{_DECIDING}EPT(?:IPQAUPT)*R"),
}


def _worker(db: Path, run_id: str, ledger: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, str(WORKER), str(db), run_id, str(ledger)],
                            env=env, cwd=str(ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _rest(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """What a worker wrote after the line already read, once it has ended. Not
    ``communicate()``: it reads the pipe itself and misses what ``readline()``
    already buffered (a run that completed before the line was read)."""
    proc.wait(timeout=60)
    assert proc.stdout is not None and proc.stderr is not None
    return proc.stdout.read(), proc.stderr.read()


def _kill_randomly(db: Path, run_id: str, ledger: Path, rng: random.Random) -> int:
    """Kill workers on ``run_id`` until it has been killed KILLS_PER_RUN times
    or has ended; then let one finish it. Returns the kills that landed."""
    kills = 0
    while kills < KILLS_PER_RUN:
        proc = _worker(db, run_id, ledger)
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n", proc.communicate(timeout=30)
        time.sleep(rng.uniform(0, MAX_DELAY))
        proc.kill()
        out, err = _rest(proc)
        if proc.returncode == 0:  # it finished before the kill
            assert out == "COMPLETED\n", err
            return kills
        assert proc.returncode == -signal.SIGKILL, err
        kills += 1
        time.sleep(LEASE_TTL)  # the dead worker's lease has expired by now
    proc = _worker(db, run_id, ledger)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, "ready\nCOMPLETED\n"), err
    return kills


def _tool(step: Step) -> str:
    """The tool a step called ('' for a step that completed the run or never decided)."""
    decision = step.decision
    return decision.tool if decision is not None and decision.kind == "tool_call" else ""


def _check_record(db: Path, run_id: str, ledger: Path, kills: int) -> None:
    store = open_store(str(db))
    try:
        run = store.get_run(run_id)
        events = store.list_events(run_id)
        steps = store.list_steps(run_id)
        approvals = store.list_approvals(run_id)
        calls = store.list_model_calls(run_id)
        assert store.verify_events().broken is None
    finally:
        store.close()
    assert run.status == "COMPLETED"
    types = [e.type for e in events]
    assert types[:2] == ["run.created", "run.started"] and types[-1] == "run.finished"
    assert types.count("run.finished") == 1
    finished = json.loads(events[-1].payload)
    assert finished["steps"] == len(steps) == run.step_count

    # Every takeover follows a kill; each interrupts at most the one step in flight.
    assert types.count("lease.taken_over") <= kills
    assert types.count("step.interrupted") <= types.count("lease.taken_over")

    # Each attempt that reported is charged once; one a kill cut short stays dispatched.
    results = types.count("model.completed") + types.count("model.failed")
    assert run.model_calls == results
    assert (run.usage.input_tokens, run.usage.output_tokens) == (
        5 * types.count("model.completed"), 2 * types.count("model.completed"))
    assert len(calls) == types.count("model.dispatched")
    assert sum(c.status == "dispatched" for c in calls) == len(calls) - results

    # Each step's events in a canonical order; every step ended.
    by_step: dict[str, str] = {}
    for e in events:
        if e.step_id:
            by_step[e.step_id] = by_step.get(e.step_id, "") + CODES[e.type]
    for step in steps:
        assert step.status in ("done", "interrupted"), (step.index, step.status)
        order = by_step[step.id]
        tool = _tool(step)
        shapes = [name for name, pattern in STEP_ORDERS.items() if pattern.fullmatch(order)]
        expected = {"write": ["write", "interrupted deciding"],
                    "look": ["look", "interrupted deciding"]}.get(
            tool, ["complete", "interrupted deciding"])
        assert set(shapes) & set(expected), (step.index, tool, order)

    # No side effect ran again unless an operator approved running it again;
    # no read-only tool ran twice for one step; every recorded result ran.
    ran = Counter(tuple(line.split()) for line in ledger.read_text().splitlines())
    granted = Counter(a.step_id for a in approvals
                      if a.kind == "interrupted_side_effect" and a.status == "approved")
    assert all(a.status != "pending" for a in approvals)
    for step in steps:
        tool = _tool(step)
        times = ran[(tool, step.id)] if tool else 0
        assert times <= 1 + granted[step.id], (step.index, tool, times, granted[step.id])
        if "R" in by_step[step.id]:
            assert times >= 1, (step.index, tool)
    assert sum(ran.values()) == sum(ran[(t, s.id)] for s in steps for t in ("look", "write"))


def _check_commands(db: Path, run_id: str) -> None:
    """The operator command shows the record and finds its chain intact."""
    for command in (["show", run_id], ["events", run_id], ["verify"], ["runs"]):
        shown = invoke("--db", str(db), *command)
        assert shown.code == 0 and shown.stdout, (command, shown.stderr)


def _check_spans(db: Path, run_id: str, rng: random.Random) -> None:
    """The record as OpenTelemetry shows it: one run span, one span per step,
    model attempt, approval and late tool or model outcome, every start known,
    and exporters restarted at random cursors give exactly one pass's spans."""
    store = open_store(str(db))
    try:
        events = store.list_events(run_id)
        steps = store.list_steps(run_id)
        spans = SpanMapper().map_all(events)
        counts = Counter(sp.name for sp in spans)
        end = next((i for i, e in enumerate(events) if e.type == "run.finished"), len(events))
        late_results = sum(e.type in ("model.completed", "model.failed") for e in events[end:])
        assert counts == Counter({
            "agentrt.run": 1, "agentrt.step": len(steps),
            "agentrt.model": len(store.list_model_calls(run_id)) + late_results,
            "agentrt.approval": len(store.list_approvals(run_id)),
            "agentrt.tool.late": sum(e.type == "step.tool_finished"
                                     and json.loads(e.payload).get("late") is True
                                     for e in events)}), counts
        assert not [sp for sp in spans if "agentrt.span.start_unknown" in sp.attributes]
        assert len({sp.span_id for sp in spans}) == len(spans)
        cuts = rng.sample(range(1, len(events)), 3)
        again = restarted(events, cuts, store)  # each restart replays from the database
        assert sorted(map(full, again)) == one_pass(events)
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(rounds(2, 24)))
def test_a_driver_killed_at_random_points_leaves_a_record_that_holds(tmp_path, attempt):
    rng = random.Random(attempt)
    db, ledger = tmp_path / "runs.db", tmp_path / "ledger"
    open_store(str(db)).close()
    kills = _kill_randomly(db, "r", ledger, rng)
    _check_record(db, "r", ledger, kills)
    _check_spans(db, "r", rng)
    _check_commands(db, "r")


# -- an operator's cancel at a random point ----------------------------------

#: An operator's process, started and imported before it is told to act, so
#: the cancel lands a chosen time into the run, not after an interpreter's start.
CANCELLER = """
import sys
from agentrt.cli import main
import agentrt.driver, agentrt.view  # loaded on first use; load them before "go"
print("ready", flush=True)
sys.stdin.readline()
main(["cancel", sys.argv[1], "--db", sys.argv[2], "--by", "ops", "--note", "enough"])
"""


def _cancel_randomly(db: Path, rng: random.Random) -> str:
    """Cancel a run with ``agentrt cancel`` a random time after its worker is
    ready, on new runs until a cancel lands before a run completes; returns the
    cancelled run's id (its tools' ledger is ``<db>.<run id>``)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for attempt in range(10):
        run_id = f"r{attempt}"
        ledger = db.with_suffix(f".{run_id}")
        operator = subprocess.Popen([sys.executable, "-c", CANCELLER, run_id, str(db)],
                                    env=env, cwd=str(ROOT), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert operator.stdout is not None and operator.stdout.readline() == "ready\n"
        proc = _worker(db, run_id, ledger)
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n", proc.communicate(timeout=30)
        time.sleep(rng.uniform(0, MAX_DELAY))
        said, complaint = operator.communicate("go\n", timeout=60)
        out, err = _rest(proc)
        assert proc.returncode == 0 and "Traceback" not in err, err
        if operator.returncode == 0:
            assert out == "CANCELLED\n", (out, err)
            return run_id
        # too early (the run did not exist yet) or too late (it had completed)
        assert operator.returncode == 1, complaint
        assert "not found" in complaint or "COMPLETED" in complaint, complaint
    raise AssertionError("ten runs in a row ended before their cancel")


def _check_cancelled(db: Path, run_id: str, ledger: Path) -> None:
    store = open_store(str(db))
    try:
        run = store.get_run(run_id)
        events = store.list_events(run_id)
        steps = {s.id: s for s in store.list_steps(run_id)}
        assert store.verify_events().broken is None
    finally:
        store.close()
    assert (run.status, run.reason, run.reason_detail) == (
        "CANCELLED", "operator_cancelled", "enough")
    types = [e.type for e in events]
    end = types.index("run.finished")
    assert json.loads(events[end].payload)["by"] == "ops"
    before, after = events[:end], events[end + 1:]

    # After the cancel, only what was in flight: at most one late tool outcome,
    # on the step whose tool had started, and the results of calls dispatched.
    late = [e for e in after if e.type == "step.tool_finished"]
    assert len(late) <= 1 and all(json.loads(e.payload)["late"] is True for e in late)
    dispatched = {json.loads(e.payload)["call_id"] for e in before
                  if e.type == "model.dispatched"}
    for e in after:
        if e.type != "step.tool_finished":
            assert e.type in ("model.completed", "model.failed"), e.type
            assert json.loads(e.payload)["call_id"] in dispatched
    started = [e.step_id for e in before if e.type == "step.tool_started"]
    for e in late:
        assert started and e.step_id == started[-1]
        assert steps[e.step_id].status == "failed"
    # ... and nothing in flight is lost: a tool running at the cancel reports
    # late, and every call dispatched has its one result.
    if started:
        in_time = any(e.type == "step.tool_finished" and e.step_id == started[-1]
                      for e in before)
        assert len(late) == (0 if in_time else 1)
    results = Counter(json.loads(e.payload)["call_id"] for e in events
                      if e.type in ("model.completed", "model.failed"))
    assert results == Counter(dispatched)

    # Every step ended; no tool ran for a step that had not started it, nor twice.
    assert {s.status for s in steps.values()} <= {"done", "failed"}
    ran = Counter(tuple(line.split()) for line in ledger.read_text().splitlines())
    assert all(times == 1 for times in ran.values()), ran
    assert {step for _, step in ran} <= set(started)


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(rounds(3, 40)))
def test_an_operator_cancel_at_a_random_point_ends_the_run_and_appends_only_what_was_in_flight(
        tmp_path, attempt):
    rng = random.Random(1000 + attempt)
    db = tmp_path / "runs.db"
    open_store(str(db)).close()
    run_id = _cancel_randomly(db, rng)
    _check_cancelled(db, run_id, db.with_suffix(f".{run_id}"))
    _check_spans(db, run_id, rng)
    _check_commands(db, run_id)

"""Approvals and recovery at their edges: races between processes resuming one run."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from _driver_kit import call, limits, make
from eventdb import child_process

from agentrt.driver import DefaultPolicy, Driver, FuncTool, ToolResult, approve
from agentrt.errors import RunLeasedError, RunStateError
from agentrt.store import open_store
from agentrt.testing import ScriptedAgent


def _resume_losing_the_race_to_expire(tmp_path, loser_within_ttl: bool):
    """A grant of a 5-minute TTL; the slower resume has read it when another driver,
    an hour later by its clock, expires it and ends the run first. The slower one's
    clock is an hour on too, or (``loser_within_ttl``) a minute. Returns the store,
    what the winner's resume returned, and the loser's error."""
    db = str(tmp_path / "runs.db")
    store = open_store(db)
    d, _, _, _ = make(store=store, script=[call("publish")])
    d.start("g", limits(grant_ttl=timedelta(minutes=5)), run_id="r")
    approve(store, "r", store.list_approvals("r")[0].id, "operator", "")
    decided_at = store.list_approvals("r")[0].decided_at
    assert decided_at is not None
    later = decided_at + timedelta(hours=1)
    winner, _, _, _ = make(store=open_store(db), script=[], now=lambda: later)
    raced: list[str] = []

    def loser_now():
        # the loser has read the grant; the other process expires it first
        if not raced:
            raced.append(winner.resume("r").status)
        return decided_at + timedelta(minutes=1) if loser_within_ttl else later

    loser, _, _, _ = make(store=open_store(db), script=[], now=loser_now)
    with pytest.raises(RunStateError) as info:
        loser.resume("r")
    return store, raced, info.value


def test_a_resume_that_loses_the_race_to_expire_a_grant_is_told_the_run_is_not_waiting(
        tmp_path):
    store, raced, error = _resume_losing_the_race_to_expire(tmp_path, loser_within_ttl=False)
    assert "is CANCELLED, not WAITING_FOR_APPROVAL" in str(error)
    assert raced == ["CANCELLED"]
    run = store.get_run("r")
    assert (run.status, run.reason) == ("CANCELLED", "approval_expired")
    assert [e.type for e in store.list_events("r")].count("run.finished") == 1


STALE_RESUMER = r"""
import os, sys, time
from agentrt.driver import DefaultPolicy, Driver, FuncTool, PolicyFunc, ToolResult
from agentrt.records import Decision
from agentrt.store import open_store
from agentrt.testing import ScriptedAgent
db, d, who = sys.argv[1], sys.argv[2], sys.argv[3]
def publish(c):
    with open(os.path.join(d, "ledger"), "a") as f:
        f.write(who + "\n")
    if who == "dies":
        os._exit(0)  # mid-tool: the effect happened, its outcome is never recorded
    return ToolResult(b"{}", "published")
def rule(req, view):
    # the stale resumer has read the grant and is slow (policy, GIL, swap) here
    if who == "stale" and view.run.status == "WAITING_FOR_APPROVAL":
        open(os.path.join(d, "ready"), "w").close()
        while not os.path.exists(os.path.join(d, "go")):
            time.sleep(0.005)
    return DefaultPolicy().evaluate(req, view)
drv = Driver(open_store(db), ScriptedAgent([None, Decision.complete()]), PolicyFunc(rule),
             [FuncTool("publish", publish, side_effect="remote_mutation", timeout=5)],
             lease_ttl=0.3)
try:
    print(drv.resume("r").status)
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_a_stale_resume_does_not_execute_a_grant_a_later_pause_replaced(tmp_path: Path):
    d = str(tmp_path)
    db = str(tmp_path / "runs.db")
    store = open_store(db)

    def tools() -> list:
        return [FuncTool("publish", lambda c: ToolResult(b"{}", "ok"),
                         side_effect="remote_mutation", timeout=5)]

    Driver(store, ScriptedAgent([call("publish")]), DefaultPolicy(), tools()).start(
        "g", limits(), run_id="r")
    approve(store, "r", store.list_approvals("r")[0].id, "operator", "")
    script = [sys.executable, "-c", STALE_RESUMER, db, d]
    with child_process([*script, "stale"]) as stale:
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(d, "ready")):
            assert stale.poll() is None, stale.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.005)
        with child_process([*script, "dies"]) as dies:  # resumes, dies inside the tool
            dies.communicate(timeout=30)
        recoverer = Driver(store, ScriptedAgent([]), DefaultPolicy(), tools())
        while True:
            try:
                run = recoverer.resume("r")
                break
            except RunLeasedError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert run.status == "WAITING_FOR_APPROVAL"
        assert store.list_approvals("r")[-1].kind == "interrupted_side_effect"
        Path(d, "go").touch()
        stale.communicate(timeout=30)
    # No one approved running it again: the spent grant must not run it a second time.
    assert Path(d, "ledger").read_text().split() == ["dies"]
    assert store.get_run("r").status == "WAITING_FOR_APPROVAL"
    assert [a.status for a in store.list_approvals("r")] == ["approved", "pending"]
    assert store.verify_events().broken is None


def test_expiring_a_grant_a_later_pause_replaced_leaves_the_waiting_run_alone(tmp_path):
    """A slow resumer that read the grant, and finds it past its TTL after another
    process paused the step again, cancelled a run waiting on the newer approval."""
    from agentrt.driver.approvals import expire

    store = open_store(str(tmp_path / "runs.db"))
    d, _, _, _ = make(store=store, script=[call("publish")])
    d.start("g", limits(grant_ttl=timedelta(minutes=5)), run_id="r")
    approve(store, "r", store.list_approvals("r")[0].id, "operator", "")
    stale = store.list_approvals("r")[0]
    with store.tx() as tx:  # the step paused again: a newer pending approval
        tx.run("INSERT INTO approvals (id, run_id, step_id, kind, capability_json, "
               "presentation_json, request_json, hash, status, created_at) SELECT 'newer', "
               "run_id, step_id, kind, capability_json, presentation_json, request_json, "
               "hash, 'pending', created_at FROM approvals WHERE id = ?", (stale.id,))
    assert stale.decided_at is not None
    with pytest.raises(RunStateError, match="no longer the latest approved approval"):
        expire(store, None, stale, stale.decided_at + timedelta(hours=1))
    assert store.get_run("r").status == "WAITING_FOR_APPROVAL"
    assert [a.status for a in store.list_approvals("r")] == ["approved", "pending"]


def test_a_resume_within_the_grant_ttl_by_its_clock_that_lost_the_race_is_told_the_run_is_not_waiting(  # noqa: E501
        tmp_path):
    """The slower resume read the grant while its own clock was within the grant TTL;
    another driver, whose clock was past it, expired the grant and ended the run
    first. It was told of 'a later pause of the step' that never happened."""
    store, raced, error = _resume_losing_the_race_to_expire(tmp_path, loser_within_ttl=True)
    assert raced == ["CANCELLED"]
    run = store.get_run("r")
    assert (run.status, run.reason) == ("CANCELLED", "approval_expired")
    assert str(error) == ("agentrt: run is not in the required state: run r is CANCELLED, "
                          "not WAITING_FOR_APPROVAL")

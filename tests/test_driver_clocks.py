"""The driver's clocks and deadlines at their extremes: a caller's deadline no thread
can wait for, an operator's clock read as the driver's, an active-time total past
timedelta's range, and a sub-microsecond duration the reference stored."""
from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta

import apsw
import pytest
from _driver_kit import call, fixture_tools, limits, make

from agentrt.driver import CancelToken, ConfigError, Operator
from agentrt.records import Decision
from agentrt.store import open_store
from agentrt.testing import FakeClock

# -- a caller's deadline past what a thread can wait -----------------------

@pytest.mark.parametrize("timeout", [1e10, float("inf")])
def test_a_far_caller_deadline_raises_nothing_in_a_background_thread(timeout, monkeypatch):
    errors: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda a: errors.append(
        f"{a.thread.name}: {a.exc_type.__name__}: {a.exc_value}"))
    d, store, _, _ = make(script=[call("read", '{"n":1}'), Decision.complete()])
    run = d.start("g", limits(), run_id="r", cancel=CancelToken(timeout=timeout))
    assert run.status == "COMPLETED"
    assert errors == []


def test_a_nan_timeout_is_refused_not_taken_as_a_deadline_already_past():
    with pytest.raises((ValueError, ConfigError)):
        CancelToken(timeout=float("nan"))


# -- Operator(now=...) readings are not checked as the driver's are --------------

def _waiting(ttl: timedelta | None = None):
    c = FakeClock()
    d, store, _, _ = make(script=[call("publish")], now=c)
    d.start("g", limits(approval_ttl=ttl) if ttl else limits(), run_id="r")
    return store, store.list_approvals("r")[0]


def test_an_operator_clock_with_naive_readings_is_taken_as_utc_as_the_drivers_is():
    store, a = _waiting(timedelta(minutes=1))
    op = Operator(store, now=lambda: datetime(2026, 10, 1, 9, 0, 30))  # 30 s into a 1 min TTL
    assert op.approve("r", a.id, "op").status == "approved"


@pytest.mark.parametrize("clock", [lambda: "2026-10-01T09:00:30Z", lambda: 1 / 0])
def test_an_unusable_operator_clock_reading_is_one_config_error(clock):
    store, a = _waiting()
    with pytest.raises(ConfigError):
        Operator(store, now=clock).approve("r", a.id, "op")


# -- active_ms past timedelta's range (a valid int64) ---------------------------

def test_an_active_total_past_timedeltas_range_ends_the_run_at_its_limit(tmp_path):
    path = str(tmp_path / "a.db")
    d, store, _, _ = make(store=open_store(path), script=[call("publish"), Decision.complete()])
    d.start("g", limits(max_active_time=timedelta(hours=1)), run_id="r")
    store.close()
    db = apsw.Connection(path)
    db.execute("UPDATE runs SET active_ms = ?", (10**17,))  # < 2**63-1, the store's own cap
    db.close()
    d, store, _, _ = make(store=open_store(path), script=[None, Decision.complete()])
    d.approve("r", store.list_approvals("r")[0].id, "op")
    run = d.resume("r")
    assert (run.status, run.reason) == ("FAILED", "limit_active_time")


# -- a sub-microsecond duration the reference stored reads as "no limit" --------

def test_a_go_written_sub_microsecond_grant_ttl_still_expires_the_grant(tmp_path):
    path = str(tmp_path / "g.db")
    c = FakeClock()
    calls: list = []
    d, store, _, _ = make(store=open_store(path), script=[call("publish"), Decision.complete()],
                          now=c, tools=fixture_tools(calls))
    d.start("g", limits(), run_id="r")
    store.close()
    db = apsw.Connection(path)  # Limits{GrantTTL: 500} as the Go reference stores it (ns)
    (text,) = db.execute("SELECT limits_json FROM runs WHERE id = 'r'").fetchone()
    lim = json.loads(text)
    lim["grant_ttl"] = 500
    db.execute("UPDATE runs SET limits_json = ? WHERE id = 'r'",
               (json.dumps(lim, separators=(",", ":")),))
    db.close()
    d, store, _, _ = make(store=open_store(path), script=[None, Decision.complete()],
                          now=c, tools=fixture_tools(calls))
    d.approve("r", store.list_approvals("r")[0].id, "op")
    c.advance(timedelta(hours=1))
    run = d.resume("r")
    assert (run.status, run.reason) == ("CANCELLED", "approval_expired")  # as the reference
    assert calls == []  # the publish did not run an hour after a 500 ns grant

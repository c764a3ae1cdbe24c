"""Reads: insertion order, undecodable rows, bounded page reads, and the three side reads."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from store_helpers import REQUEST, T0, fill, insert_approval, insert_run, insert_step

from agentrt import MAX_PAGE_TEXT, NotFoundError, open_existing, open_store
from agentrt.store import PageError
from agentrt.timefmt import ZERO_TIME

N = MAX_PAGE_TEXT


@pytest.fixture
def store(tmp_path):
    with open_store(str(tmp_path / "a.db")) as s:
        yield s


def marker(length: int) -> str:
    return f"…[truncated: {length} characters]"


# -- order ------------------------------------------------------------------------


def test_lists_follow_insertion_order_not_timestamps(store):
    # Stored times drop trailing zeros, so "…00.5Z" sorts before "…00Z" as text.
    later, earlier = T0 + timedelta(seconds=0.5), T0
    with store.tx() as tx:
        insert_run(tx, "first", created=later)
        insert_run(tx, "second", created=earlier)
        insert_step(tx, "s1", "first", 1, started=earlier)
        insert_step(tx, "s0", "first", 0, started=later)
        insert_approval(tx, "ap-old", "first", "s0", created=later)
        insert_approval(tx, "ap-new", "first", "s0", created=earlier)
        for i, mc in enumerate(("mc-b", "mc-a")):
            tx.execute("INSERT INTO model_calls (id, run_id, step_id, attempt, status, model, "
                       "dispatched_at) VALUES (?, 'first', 's0', ?, 'ok', 'm', ?)",
                       (mc, i, "2026-10-01T09:00:00.5Z" if i == 0 else "2026-10-01T09:00:00Z"))
        tx.append("first", "", later, "run.created", {})
        tx.append("first", "", earlier, "run.started", {})
    assert [r.id for r in store.list_runs()] == ["second", "first"]  # newest first
    assert [s.id for s in store.list_steps("first")] == ["s0", "s1"]  # by index
    assert [a.id for a in store.list_approvals("first")] == ["ap-old", "ap-new"]
    assert [m.id for m in store.list_model_calls("first")] == ["mc-b", "mc-a"]
    assert [e.type for e in store.list_events("first")] == ["run.created", "run.started"]
    assert [r.id for r in store.list_runs_page(10, 0)[0]] == ["second", "first"]
    assert [a.id for a in store.list_approvals_page("first", "", 10, 0)[0]] == [
        "ap-old", "ap-new"]


def test_full_reads_decode_every_field(store):
    with store.tx() as tx:
        insert_run(tx, "r", limits='{"max_steps":7,"loop_threshold":2,"grant_ttl":5000000000}')
        insert_step(tx, "s0", "r", 0)
        insert_approval(tx, "ap", "r", "s0")
    run = store.get_run("r")
    assert (run.id, run.goal, run.status, run.created_at) == ("r", "a goal", "RUNNING", T0)
    assert (run.limits.max_steps, run.limits.loop_threshold) == (7, 2)
    assert run.limits.grant_ttl == timedelta(seconds=5)
    step = store.list_steps("r")[0]
    assert step.decision is not None and step.decision.tool == "echo"
    assert step.decision.args == b'{"n":1}'
    assert step.observation is not None and step.observation.content == b'{"ok":"yes"}'
    assert step.decode_error == ""
    approval = store.get_approval("r", "ap")
    assert approval.request is not None and approval.request.spec.name == "push"
    assert approval.request.args == b'{"n":7}'
    with pytest.raises(NotFoundError):
        store.get_run("nope")
    with pytest.raises(NotFoundError):
        store.get_approval("other-run", "ap")  # an approval of another run is not found


def test_limits_without_grant_ttl_decode_to_zero(store):
    with store.tx() as tx:
        insert_run(tx, "r", limits='{"max_steps":50,"max_consecutive_tool_failures":3,'
                                   '"loop_threshold":3,"approval_ttl":60000000000}')
    for run in (store.get_run("r"), store.get_run_capped("r"), store.list_runs_page(1, 0)[0][0]):
        assert run.limits.grant_ttl == timedelta(0)
        assert run.limits.approval_ttl == timedelta(minutes=1)
        assert run.limits.max_steps == 50


# -- undecodable rows ---------------------------------------------------------------


def test_undecodable_rows_do_not_wedge_the_run(store):
    with store.tx() as tx:
        insert_run(tx, "r")
        insert_step(tx, "good", "r", 0)
        insert_step(tx, "bad", "r", 1, decision="{not json", observation='["a list"]',
                    started=T0)
        tx.execute("UPDATE steps SET finished_at = 'yesterday' WHERE id = 'bad'")
        insert_approval(tx, "ap-bad", "r", "bad", request="{{{")
        tx.execute("UPDATE approvals SET created_at = 'noon' WHERE id = 'ap-bad'")
        tx.append("r", "bad", T0, "step.started", {})
    steps = store.list_steps("r")
    assert [s.id for s in steps] == ["good", "bad"]
    assert steps[0].decode_error == ""
    bad = steps[1]
    assert bad.decision is None and bad.observation is None
    assert bad.policy is not None  # the columns that do decode are kept
    assert bad.decode_error.startswith("decision: ")
    assert "; observation: " in bad.decode_error and "; finished_at: " in bad.decode_error
    (approval,) = store.list_approvals("r")
    assert approval.request is None
    assert approval.decode_error.startswith("request: ")
    assert "created_at: time 'noon' is not RFC 3339" in approval.decode_error
    # The run itself stays readable, listable and writable.
    assert store.get_run("r").status == "RUNNING"
    assert [r.id for r in store.list_runs()] == ["r"]
    assert [s.id for s in store.list_steps_page("r", 10, 0)[0]] == ["good", "bad"]
    with store.tx() as tx:
        tx.execute("UPDATE runs SET status = 'CANCELLED' WHERE id = 'r'")
    assert store.get_run("r").status == "CANCELLED"


def _poke_bytes(store, table: str, column: str, key: str, value: bytes) -> None:
    # Text that is not UTF-8: SQLite keeps whatever bytes a writer gives it.
    store.db().execute(f"UPDATE {table} SET {column} = CAST(? AS TEXT) WHERE rowid = "
                       f"(SELECT rowid FROM {table} WHERE {key})", (value,))


def test_text_that_is_not_utf8_reads_with_replacement_characters(store):
    with store.tx() as tx:
        insert_run(tx, "r")
        insert_step(tx, "s0", "r", 0)
        insert_approval(tx, "ap", "r", "s0")
        tx.append("r", "s0", T0, "step.started", {"n": 1})
    _poke_bytes(store, "runs", "goal", "id = 'r'", b"caf\xe9")
    _poke_bytes(store, "steps", "decision_json", "id = 's0'", b'{"kind":"tool_call\xff"}')
    _poke_bytes(store, "approvals", "note", "id = 'ap'", b"\xc3")
    _poke_bytes(store, "events", "type", "seq = 1", b"step.\xfe")
    assert store.get_run("r").goal == "caf\ufffd"
    assert store.list_runs_page(10, 0)[0][0].goal == "caf\ufffd"
    assert store.list_steps("r")[0].decision.kind == "tool_call\ufffd"  # type: ignore[union-attr]
    assert store.list_approvals("r")[0].note == "\ufffd"
    for events in (store.list_events("r"), store.list_events_page("r", 10, 0)[0],
                   store.list_events_after("", 0, 10), store.list_events_after("r", 0, 10)):
        assert [e.type for e in events] == ["step.\ufffd"]
        assert events[0].payload == b'{"n":1}'


def test_values_of_another_type_read_as_the_fields_type(tmp_path):
    # A hand-made file whose columns allow what the runtime never writes.
    path = tmp_path / "odd.db"
    with open_store(str(path)) as store:
        conn = store.db()
        conn.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) "
                     "VALUES ('r', 'g', 'RUNNING', '{}', '')")
        conn.execute("INSERT INTO events (run_id, step_id, at, type, payload_json) "
                     "VALUES ('r', X'6869', 12, 'run.started', X'7B7D')")
        events = store.list_events("r") + store.list_events_after("", 0, 10)
        for event in events:
            assert (event.step_id, event.at_text, event.type, event.payload) == (
                "hi", "12", "run.started", b"{}")
            assert event.at == ZERO_TIME


# -- page reads ---------------------------------------------------------------------


def test_pages_are_bounded(store):
    goal = "g" * (N + 10)
    huge_json = json.dumps({"content": "x" * (N + 100)})
    with store.tx() as tx:
        insert_run(tx, "r", goal=goal)
        tx.execute("UPDATE runs SET result_json = ? WHERE id = 'r'", (huge_json,))
        insert_step(tx, "s0", "r", 0,
                    decision=json.dumps({"kind": "tool_call", "tool": "echo",
                                         "args": {"x": "y" * N}}),
                    observation=json.dumps({"kind": "tool_result", "summary": "ok",
                                            "content": {"x": "z" * N}}))
        insert_approval(tx, "ap", "r", "s0",
                        request=json.dumps({"run_id": "r", "step_id": "s0",
                                            "spec": {"name": "push"},
                                            "args": {"x": "a" * N}}))
        tx.execute("UPDATE approvals SET capability_json = ? WHERE id = 'ap'", (huge_json,))
        tx.append("r", "s0", T0, "step.tool_finished", huge_json.encode())
    # A text column: the head and the marker with the full length.
    for run in (store.get_run_capped("r"), store.list_runs_page(1, 0)[0][0]):
        assert len(goal) == 65546
        assert run.goal == "g" * N + "…[truncated: 65546 characters]"
        capped = json.loads(run.result)  # a JSON column: still JSON
        assert capped == {"truncated": True, "length": len(huge_json),
                          "head": huge_json[:N]}
    # A step column over the cap is read as its identifying fields.
    (step,), total = store.list_steps_page("r", 10, 0)
    assert total == 1
    assert step.decision is not None and (step.decision.kind, step.decision.tool) == (
        "tool_call", "echo")
    assert step.decision.args is None
    assert step.observation is not None and step.observation.summary == "ok"
    assert step.observation.content is None
    assert "decision: " in step.decode_error and "over MaxPageText, not read whole" in (
        step.decode_error)
    # An oversized request keeps its identity, not its arguments.
    (approval,), _ = store.list_approvals_page("r", "", 10, 0)
    assert approval.request is not None and approval.request.spec.name == "push"
    assert json.loads(approval.request.args)["truncated"] is True
    assert "its arguments were not read" in approval.decode_error
    assert json.loads(approval.capability)["truncated"] is True
    assert store.get_approval("r", "ap").request.args.startswith(b'{"x": "aaa')  # type: ignore[union-attr]
    # Events: the payload becomes the truncation object, valid JSON, bounded.
    for events in (store.list_events_page("r", 10, 0)[0], store.list_events_after("", 0, 10)):
        payload = events[0].payload
        assert len(payload) <= N + 100
        assert json.loads(payload) == {"truncated": True, "length": len(huge_json),
                                       "head": huge_json[:N]}


def test_cap_counts_characters_not_bytes(store):
    exactly = "é" * N  # 131072 bytes, 65536 characters: not over the cap
    over = "é" * (N + 1)
    with store.tx() as tx:
        insert_run(tx, "a", goal=exactly)
        insert_run(tx, "b", goal=over)
        tx.append("a", "é" * (N + 1), T0, "t", {})
    assert store.get_run_capped("a").goal == exactly
    assert store.get_run_capped("b").goal == "é" * N + marker(N + 1)
    (event,) = store.list_events_after("", 0, 10)
    assert event.step_id == "é" * N + marker(N + 1)


def test_page_totals_come_from_a_count(store):
    fill(store, runs=5, events=2)
    runs, total = store.list_runs_page(2, 1)
    assert [r.id for r in runs] == ["r3", "r2"] and total == 5
    events, total = store.list_events_page("r1", 1, 1)
    assert [e.payload for e in events] == [b'{"n":1,"run":"r1"}'] and total == 2
    assert store.list_runs_page(10, 10) == ([], 5)


@pytest.mark.parametrize(("call", "what"), [
    (lambda s: s.list_runs_page(0, 0), "runs: limit 0 and offset 0"),
    (lambda s: s.list_runs_page(5, -1), "runs: limit 5 and offset -1"),
    (lambda s: s.list_steps_page("r", -2, 0), "steps: limit -2 and offset 0"),
    (lambda s: s.list_approvals_page("r", "", 0, 3), "approvals: limit 0 and offset 3"),
    (lambda s: s.list_events_page("r", 0, 0), "events: limit 0 and offset 0"),
    (lambda s: s.list_events_after("", 0, 0), "events: limit 0 and offset 0"),
])
def test_page_reads_refuse_an_empty_or_negative_window(store, call, what):
    with pytest.raises(PageError) as info:
        call(store)
    assert str(info.value) == f"agentrt: list {what}"


def _bytes_read() -> int:
    """Bytes this process has read through read(2)/pread(2) so far (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts reads on Linux")
def test_page_reads_only_the_page(tmp_path):
    """A page of a database full of huge rows reads a small part of the file."""
    path = str(tmp_path / "huge.db")
    big = "x" * (200 * 1024)
    with open_store(path) as store, store.tx() as tx:
        for i in range(60):
            insert_run(tx, f"r{i:02d}", goal=big)
            insert_step(tx, f"s{i:02d}", f"r{i:02d}", 0,
                        observation='{"kind":"tool_result","summary":"' + big + '"}')
            tx.append(f"r{i:02d}", "", T0, "run.created", ('"' + big + '"').encode())
    size = os.path.getsize(path)
    assert size > 30 * 2**20  # ~36 MB of runs, steps and events

    def read(fn) -> tuple[int, object]:
        with open_existing(path) as store:
            start = _bytes_read()
            out = fn(store)
            return _bytes_read() - start, out

    whole, _ = read(lambda s: s.list_runs())
    assert whole > 60 * len(big)  # a full read pulls in every goal
    two_rows = 2 * 2 * len(big) + 2**20  # each of two rows read at most twice, plus 1 MiB
    for fn in (lambda s: s.list_runs_page(2, 40), lambda s: s.get_run_capped("r30"),
               lambda s: s.list_steps_page("r30", 2, 0),
               lambda s: s.list_events_page("r30", 2, 0),
               lambda s: s.list_events_after("", 40, 2)):
        got, out = read(fn)
        assert got < two_rows, (got, two_rows)
    _, (runs, total) = read(lambda s: s.list_runs_page(2, 40))
    assert total == 60 and [len(r.goal) for r in runs] == [N + len(marker(len(big)))] * 2


# -- lease, events after, approval reason, pending ids ----------------------------------


def test_lease_reads_the_stored_lease(store):
    with store.tx() as tx:
        insert_run(tx, "held")
        insert_run(tx, "free", status="WAITING_FOR_APPROVAL")
        insert_run(tx, "stale")
        insert_run(tx, "garbled")
        tx.execute("UPDATE runs SET lease_owner = 'host/1', "
                   "lease_expires_at = '2026-10-01T09:00:30.5Z' WHERE id = 'held'")
        tx.execute("UPDATE runs SET lease_owner = 'host/2', "
                   "lease_expires_at = '2000-01-01T00:00:00Z' WHERE id = 'stale'")
        tx.execute("UPDATE runs SET lease_owner = 'host/3', "
                   "lease_expires_at = 'soon' WHERE id = 'garbled'")
    assert store.lease("held") == ("host/1", datetime(2026, 10, 1, 9, 0, 30, 500000,
                                                       tzinfo=UTC))
    assert store.lease("free") == ("", None)
    # A lease whose time has passed is stale, not released: its owner is still there.
    assert store.lease("stale") == ("host/2", datetime(2000, 1, 1, tzinfo=UTC))
    assert store.lease("garbled") == ("host/3", None)
    with pytest.raises(NotFoundError):
        store.lease("missing")


def test_list_events_after_follows_seq_across_runs(store):
    with store.tx() as tx:
        insert_run(tx, "a")
        insert_run(tx, "b")
    order = ["a", "b", "a", "a", "b", "b", "a"]
    for i, run_id in enumerate(order):
        with store.tx() as tx:
            tx.append(run_id, "", T0 + timedelta(seconds=i), "step.started", {"i": i})
    all_events = store.list_events_after("", 0, 100)
    assert [e.seq for e in all_events] == list(range(1, 8))
    assert [e.run_id for e in all_events] == order  # interleaved in commit order
    assert [e.seq for e in store.list_events_after("", 2, 3)] == [3, 4, 5]
    assert [e.seq for e in store.list_events_after("b", 0, 100)] == [2, 5, 6]
    assert [e.seq for e in store.list_events_after("b", 2, 1)] == [5]
    assert store.list_events_after("", 7, 100) == []
    assert store.list_events_after("nobody", 0, 100) == []
    with pytest.raises(PageError, match="limit 0 and offset 0"):
        store.list_events_after("", 0, 0)
    # A hand-inserted row: a time that does not parse, a payload over the cap.
    store.db().execute(
        "INSERT INTO events (run_id, at, type, payload_json) VALUES ('a', 'not a time', "
        "'step.started', ?)", ('"' + "p" * (N + 5) + '"',))
    (odd,) = store.list_events_after("a", 7, 10)
    assert odd.at == ZERO_TIME and odd.at_text == "not a time"
    assert len(odd.payload) <= N + 100
    assert json.loads(odd.payload)["length"] == N + 7
    # Reading it again from a cursor before it still works after the fallback.
    assert [e.seq for e in store.list_events_after("", 6, 10)] == [7, 8]


def test_approval_reason_is_the_pausing_policys(store):
    with store.tx() as tx:
        insert_run(tx, "r", status="WAITING_FOR_APPROVAL")
        insert_step(tx, "s0", "r", 0, status="awaiting_approval",
                    policy='{"outcome":"require_approval","reason":"pushes need a human"}')
        insert_approval(tx, "ap1", "r", "s0")
        insert_approval(tx, "ap2", "r", "s0")
        insert_approval(tx, "quiet", "r", "s0")
        tx.append("r", "s0", T0, "approval.requested",
                  {"approval_id": "ap1", "reason": "pushes need a human"})
        tx.append("r", "s0", T0, "approval.requested",
                  {"approval_id": "ap2", "reason": "asked again"})
        tx.append("r", "s0", T0, "approval.requested",
                  {"approval_id": "ap1", "reason": "a later event"})
    # The resume records the policy's decision at resume on the step.
    with store.tx() as tx:
        tx.execute("UPDATE steps SET policy_json = '{\"outcome\":\"allow\",\"reason\":\"ok "
                   "now\"}' WHERE id = 's0'")
        tx.execute("UPDATE approvals SET status = 'approved' WHERE id = 'ap1'")
    assert store.approval_reason("r", "ap1") == "pushes need a human"
    assert store.approval_reason("r", "ap2") == "asked again"
    assert store.approval_reason("r", "quiet") == ""
    with pytest.raises(NotFoundError):
        store.approval_reason("other", "ap1")
    with store.tx() as tx:
        insert_approval(tx, "long", "r", "s0")
        tx.append("r", "s0", T0, "approval.requested",
                  {"approval_id": "long", "reason": "w" * (N + 3)})
    assert store.approval_reason("r", "long") == "w" * N + marker(N + 3)


def test_approval_reasons_answer_as_approval_reason_does_for_each_id(store):
    from agentrt.store.store import REASONS_AT_ONCE

    count = REASONS_AT_ONCE * 2 + 7  # three queries' worth of ids
    with store.tx() as tx:
        insert_run(tx, "r", status="WAITING_FOR_APPROVAL")
        insert_run(tx, "other")
        for i in range(count):
            insert_step(tx, f"s{i}", "r", i)
            insert_approval(tx, f"a{i}", "r", f"s{i}")
            if i % 5:  # every fifth approval has no request event: ''
                tx.append("r", f"s{i}", T0, "approval.requested",
                          {"approval_id": f"a{i}", "reason": f"because {i}"})
        tx.append("r", "s1", T0, "approval.requested", {"approval_id": "a1", "reason": "later"})
        # Requests that must not count: another step's, and an id that is a JSON number.
        insert_approval(tx, "7", "r", "s7")
        tx.append("r", "s3", T0, "approval.requested", {"approval_id": "a2", "reason": "no"})
        tx.append("r", "s7", T0, "approval.requested", {"approval_id": 7, "reason": "no"})
    ids = [f"a{i}" for i in range(count)] + ["7", "missing", "a1"]
    reasons = store.approval_reasons("r", ids)
    assert reasons == {i: store.approval_reason("r", i) for i in ids if i != "missing"}
    assert (reasons["a1"], reasons["a2"], reasons["a5"], reasons["7"]) == (
        "because 1", "because 2", "", "")
    assert store.approval_reasons("other", ids) == {}
    assert store.approval_reasons("r", []) == {}
    with pytest.raises(TypeError, match="one id, not a sequence"):
        store.approval_reasons("r", "a1")
    with pytest.raises(TypeError, match="approval_id is"):
        store.approval_reasons("r", ["a1", 7])  # type: ignore[list-item]


def test_approval_reasons_read_the_runs_events_once_not_once_per_approval(store):
    """SQLite's virtual-machine steps, counted by its progress handler, do not drift:
    asked one approval at a time (or with the approvals as the outer loop), the
    run's events would be scanned once per approval, 200 times here."""
    approvals, events = 200, 20_000
    with store.tx() as tx:
        insert_run(tx, "r", status="WAITING_FOR_APPROVAL")
        for i in range(approvals):
            insert_step(tx, f"s{i}", "r", i)
            insert_approval(tx, f"a{i}", "r", f"s{i}")
        for n in range(events):
            i = n * approvals // events
            if n % (events // approvals) == events // approvals - 1:
                tx.append("r", f"s{i}", T0, "approval.requested",
                          {"approval_id": f"a{i}", "reason": f"because {i}"})
            else:
                tx.append("r", f"s{i}", T0, "step.decided", {"n": n})
    steps = [0]

    def count() -> bool:
        steps[0] += 1
        return False

    store.db().set_progress_handler(count, 100)
    try:
        reasons = store.approval_reasons("r", [f"a{i}" for i in range(approvals)])
    finally:
        store.db().set_progress_handler(None)
    assert reasons == {f"a{i}": f"because {i}" for i in range(approvals)}
    # About 6 steps an event in one pass (SQLite 3.54); 1,000 when asked one by one.
    assert steps[0] * 100 < 20 * events, f"{steps[0] * 100} virtual-machine steps"


def test_pending_approval_ids_of_waiting_runs(store):
    with store.tx() as tx:
        insert_run(tx, "wait", status="WAITING_FOR_APPROVAL")
        insert_run(tx, "done", status="COMPLETED")
        insert_step(tx, "s", "wait", 0)
        for i in range(3):
            insert_approval(tx, f"w{i}", "wait", "s")
        insert_approval(tx, "decided", "wait", "s", status="approved")
        insert_approval(tx, "left", "done", "s")
    assert store.pending_approval_ids() == {"wait": ["w0", "w1", "w2"]}
    assert store.pending_approval_ids_of(["wait", "done"], 2) == {"wait": ["w0", "w1"]}
    assert store.pending_approval_ids_of([], 2) == {}


def test_tool_spec_is_re_hashed_on_the_way_out(store):
    from agentrt import ToolSpec

    spec = ToolSpec("push", "push it", b'{ "type": "object" }', "remote_mutation",
                    timedelta(seconds=30))
    digest, text = spec.spec_hash()
    with store.tx() as tx:
        tx.execute("INSERT INTO tool_specs (hash, spec_json) VALUES (?, ?)", (digest, text))
    assert store.tool_spec(digest).name == "push"
    store.db().execute("UPDATE tool_specs SET spec_json = replace(spec_json, 'push it', 'rm')")
    with pytest.raises(ValueError, match="does not match its hash"):
        store.tool_spec(digest)
    with pytest.raises(NotFoundError):
        store.tool_spec("0" * 64)


def test_events_read_back_are_events_equal_to_the_observed_ones(store):
    import copy
    import pickle

    from agentrt import Event

    seen: list[Event] = []
    with store.tx(seen.append) as tx:
        insert_run(tx, "r")
        tx.append("r", "s", T0 + timedelta(microseconds=1), "step.started", {"i": 1})
    for read in (store.list_events("r"), store.list_events_after("", 0, 10),
                 store.list_events_page("r", 10, 0)[0]):
        (event,) = read
        assert isinstance(event, Event)
        assert event == seen[0] and hash(event) == hash(seen[0])
        assert (event.seq, event.run_id, event.step_id, event.type, event.payload) == (
            1, "r", "s", "step.started", b'{"i":1}')
        assert event.at_text == "2026-10-01T09:00:00.000001Z"
        assert event.at == T0 + timedelta(microseconds=1)
        assert pickle.loads(pickle.dumps(event)) == event == copy.copy(event)
        assert repr(event).startswith("Event(seq=1, run_id='r'")
        assert event._replace(seq=9).seq == 9


def test_json_columns_stored_as_blobs_read_like_text(store):
    """A writer that binds its JSON as bytes stores BLOBs (a Go []byte does): same reads."""
    big = ('{"content":"' + "é" * (N + 10) + '"}').encode()
    small_decision = b'{"kind":"tool_call","tool":"echo","args":{"n":1}}'
    with store.tx() as tx:
        insert_run(tx, "r")
        insert_step(tx, "s0", "r", 0)
        insert_step(tx, "s1", "r", 1)
        insert_approval(tx, "ap", "r", "s0")
        tx.execute("UPDATE runs SET result_json = ? WHERE id = 'r'", (big,))
        tx.execute("UPDATE steps SET decision_json = ? WHERE id = 's0'", (small_decision,))
        tx.execute("UPDATE steps SET observation_json = ? WHERE id = 's1'",
                   (b'{"kind":"tool_result","summary":"s","content":' + big + b"}",))
        tx.execute("UPDATE approvals SET request_json = ?, capability_json = ? "
                   "WHERE id = 'ap'", ((REQUEST % ("r", "s0")).encode(), big))
        tx.append("r", "s0", T0, "approval.requested",
                  b'{"approval_id":"ap","reason":"because"}')
        tx.append("r", "s0", T0, "step.tool_finished", big)
    conn = store.db()
    conn.execute("UPDATE events SET payload_json = CAST(payload_json AS BLOB)")
    assert conn.execute("SELECT DISTINCT typeof(payload_json) FROM events").fetchall() == [
        ("blob",)]
    assert store.verify_events().intact  # the chain covers the bytes either way
    assert store.list_steps("r")[0].decision.tool == "echo"  # type: ignore[union-attr]
    assert store.get_approval("r", "ap").request.spec.name == "push"  # type: ignore[union-attr]
    assert store.approval_reason("r", "ap") == "because"
    for run in (store.get_run_capped("r"), store.list_runs_page(5, 0)[0][0]):
        assert json.loads(run.result)["length"] == N + 10 + len('{"content":""}')
    steps, _ = store.list_steps_page("r", 5, 0)
    assert steps[0].decision.tool == "echo"  # type: ignore[union-attr]
    assert steps[1].observation.summary == "s"  # type: ignore[union-attr]
    (approval,), _ = store.list_approvals_page("r", "", 5, 0)
    assert approval.request is not None and json.loads(approval.capability)["truncated"]
    for events in (store.list_events_after("", 0, 10), store.list_events_page("r", 10, 0)[0]):
        assert events[0].payload == b'{"approval_id":"ap","reason":"because"}'
        assert json.loads(events[1].payload)["length"] == N + 10 + len('{"content":""}')


def test_approvals_page_after_an_approval_starts_after_it_whatever_left_the_status(store):
    with store.tx() as tx:
        insert_run(tx, "r")
        insert_step(tx, "s0", "r", 0)
        for name in ("a", "b", "c", "d"):
            insert_approval(tx, name, "r", "s0")
        insert_run(tx, "other")
        insert_approval(tx, "x", "other", "s0")
    with store.tx() as tx:
        tx.execute("UPDATE approvals SET status = 'approved' WHERE id IN ('a', 'b')")
    # Keyed on an approval that is no longer pending, the page still starts after it.
    assert store.list_approvals_page("r", "pending", 10, 0, after_id="b") == (
        store.list_approvals_page("r", "pending", 10, 0)[0], 2)
    assert [a.id for a in store.list_approvals_page("r", "", 1, 0, after_id="a")[0]] == ["b"]
    # Found, the approval decides where the page starts, not the offset.
    assert [a.id for a in store.list_approvals_page("r", "", 5, 3, after_id="a")[0]] == [
        "b", "c", "d"]
    assert store.list_approvals_page("r", "", 5, 0, after_id="d") == ([], 4)
    # Not an approval of the run (another run's, or none): the offset decides.
    for other in ("no such", "x"):
        assert [a.id for a in store.list_approvals_page("r", "", 5, 2, after_id=other)[0]] == [
            "c", "d"]
    with pytest.raises(PageError) as info:
        store.list_approvals_page("r", "", 5, 0, after_id=7)  # type: ignore[arg-type]
    assert str(info.value) == ("agentrt: list approvals: after_id is an int (7), not a str: "
                               "name the last approval read, or None for the first page")

"""The read model: summaries, the pending-approval rule, bounding, decisions in the
operator's terms, and the chain check (spec core.md section 14)."""

from __future__ import annotations

import json
from dataclasses import replace

import apsw
import pytest
from _cli_kit import Kit

from agentrt import view
from agentrt.errors import (
    ApprovalChangedError,
    NotFoundError,
    NotPendingError,
    RunStateError,
)
from agentrt.gojson import dumps
from agentrt.records import Approval, approval_hash


@pytest.fixture
def kit(tmp_path):
    k = Kit(str(tmp_path / "view.db"))
    yield k
    k.close()


def _add_pending(kit: Kit, run_id: str, n: int, prefix: str = "extra") -> list[str]:
    """``n`` more pending approvals on the run's awaiting step, copies of its own
    (the driver makes one per pause; the view must cope with a database that has more)."""
    ids = []
    with kit.store.tx() as tx:
        for i in range(n):
            new = f"{prefix}-{i:02d}"
            tx.execute(
                "INSERT INTO approvals (id, run_id, step_id, kind, capability_json, "
                "presentation_json, request_json, hash, status, created_at) "
                "SELECT ?, run_id, step_id, kind, capability_json, presentation_json, "
                "request_json, hash, status, created_at FROM approvals WHERE run_id = ? "
                "LIMIT 1", (new, run_id))
            ids.append(new)
    return ids


# -- summaries -------------------------------------------------------------------


def test_runs_summaries_carry_the_waiting_approval(kit):
    done = kit.completed()
    waiting = kit.waiting()
    approval = kit.store.list_approvals(waiting.id)[0]
    for summaries in (view.runs(kit.store), view.runs_page(kit.store, 10, 0)[0]):
        assert [s.id for s in summaries] == [waiting.id, done.id]  # newest first
        assert summaries[0].pending_approval_id == approval.id
        assert summaries[1].pending_approval_id == ""
    assert view.runs_page(kit.store, 1, 1)[1] == 2


def test_a_run_with_several_pending_approvals_names_none_of_them(kit):
    waiting = kit.waiting()
    _add_pending(kit, waiting.id, 1)
    assert view.summary(kit.store, waiting.id).pending_approval_id == ""
    assert view.runs_page(kit.store, 10, 0)[0][0].pending_approval_id == ""
    assert view.detail_page(kit.store, waiting.id, 10, 0).waiting is None


def test_summary_terminal_run_has_no_pending_approval(kit):
    waiting = kit.waiting()
    view.cancel(kit.store, waiting.id, "ops", "stop")
    # Cancel leaves the approval pending; a finished run still waits on nothing.
    assert [a.status for a in kit.store.list_approvals(waiting.id)] == ["pending"]
    assert view.summary(kit.store, waiting.id).pending_approval_id == ""
    assert view.summary_capped(kit.store, waiting.id).pending_approval_id == ""
    assert view.runs_page(kit.store, 10, 0)[0][0].pending_approval_id == ""
    assert view.detail(kit.store, waiting.id).waiting is None


def test_summary_json_has_the_reference_keys_and_leaves_out_empty_ones(kit):
    waiting = kit.waiting()
    approval_id = kit.store.list_approvals(waiting.id)[0].id
    doc = view.summary(kit.store, waiting.id).to_json()
    assert list(doc) == ["id", "goal", "status", "steps", "created_at", "pending_approval_id"]
    assert doc["created_at"] == "2026-10-01T09:00:00Z"
    assert doc["pending_approval_id"] == approval_id
    done = kit.completed()
    with kit.store.tx() as tx:
        tx.execute("UPDATE runs SET model_calls = 2, input_tokens = 120, output_tokens = 30, "
                   "estimated_cost_micros = 4500 WHERE id = ?", (done.id,))
    doc = view.summary(kit.store, done.id).to_json()
    assert list(doc) == ["id", "goal", "status", "reason", "steps", "created_at",
                         "finished_at", "model_calls", "usage", "estimated_cost_micros"]
    assert doc["usage"] == {"input_tokens": 120, "output_tokens": 30}
    assert (doc["reason"], doc["model_calls"], doc["estimated_cost_micros"]) == (
        "goal_completed", 2, 4500)


def test_steps_summarize_decision_policy_and_observation(kit):
    waiting = kit.waiting()
    steps = view.steps(kit.store, waiting.id)
    assert [(s.index, s.tool, s.decision, s.status, s.policy, s.observation) for s in steps] == [
        (0, "read_file", "tool_call", "done", "allow", "tool_result"),
        (1, "drop_table", "tool_call", "failed", "deny", "policy_denied"),
        (2, "deploy", "tool_call", "awaiting_approval", "require_approval", ""),
    ]
    assert steps[0].summary == "read 42 lines"
    assert list(steps[0].to_json()) == ["index", "id", "tool", "decision", "status", "policy",
                                        "observation", "summary"]
    assert list(steps[2].to_json()) == ["index", "id", "tool", "decision", "status", "policy"]
    assert view.steps_page(kit.store, waiting.id, 2, 1) == (steps[1:3], 3)


def test_full_detail_and_detail_page_agree_on_a_small_run(kit):
    waiting = kit.waiting()
    full = view.detail(kit.store, waiting.id)
    page = view.detail_page(kit.store, waiting.id, 50, 0)
    assert page.run == full.run
    assert page.steps == full.steps and page.steps_total == 3
    assert page.pending_total == 1 and page.approvals_total == 1
    assert page.waiting is not None and full.waiting is not None
    assert page.waiting.id == full.waiting.id == full.run.pending_approval_id
    assert page.waiting.hash == full.waiting.hash


def test_a_run_cancelled_while_waiting_waits_on_none_of_its_pending_approvals(kit):
    # Cancel leaves the approval pending; the page offered it as the one to decide.
    waiting = kit.waiting()
    view.cancel(kit.store, waiting.id, "op", "")
    page = view.detail_page(kit.store, waiting.id, 10, 0)
    assert page.pending_total == 1 and page.waiting is None
    assert view.detail(kit.store, waiting.id).waiting is None
    assert page.run.pending_approval_id == ""


def test_detail_page_keeps_the_waiting_approval_whatever_the_offset(kit):
    waiting = kit.waiting()
    page = view.detail_page(kit.store, waiting.id, 1, 2)
    assert [s.index for s in page.steps] == [2]
    assert page.pending == [] and page.pending_total == 1  # the offset skipped it
    assert page.waiting is not None
    assert page.run.pending_approval_id == page.waiting.id


def test_detail_page_of_an_unknown_run_is_not_found(kit):
    with pytest.raises(NotFoundError):
        view.detail_page(kit.store, "nope", 10, 0)


def test_detail_page_reads_a_huge_goal_capped(kit):
    waiting = kit.waiting()
    with kit.store.tx() as tx:
        tx.execute("UPDATE runs SET goal = replace(hex(zeroblob(100000)), '0', 'g') "
                   "WHERE id = ?", (waiting.id,))
    goal = view.detail_page(kit.store, waiting.id, 10, 0).run.goal
    assert goal.endswith("…[truncated: 200000 characters]")
    assert len(goal) < 70_000


# -- the pending approval an operator means ----------------------------------------


def test_pending_approval_selection_rule(kit):
    waiting = kit.waiting()
    only = kit.store.list_approvals(waiting.id)[0]
    # Unnamed with exactly one pending: that one, read whole.
    chosen = view.pending_approval(kit.store, waiting.id)
    assert chosen.id == only.id and chosen.request is not None and chosen.hash == only.hash
    # Named: that one.
    assert view.pending_approval(kit.store, waiting.id, only.id).id == only.id
    # Several and unnamed: ambiguous, naming them.
    extra = _add_pending(kit, waiting.id, 2)
    with pytest.raises(view.AmbiguousApprovalError) as exc:
        view.pending_approval(kit.store, waiting.id)
    assert str(exc.value) == (
        f"run {waiting.id} has 3 pending approvals, name one of {only.id}, {extra[0]}, "
        f"{extra[1]}: more than one pending approval")
    assert exc.value.total == 3 and exc.value.ids == [only.id, *extra]
    # More than the twenty listed: the rest are counted.
    _add_pending(kit, waiting.id, 25, prefix="more")
    with pytest.raises(view.AmbiguousApprovalError) as exc:
        view.pending_approval(kit.store, waiting.id)
    assert str(exc.value).endswith(", and 8 more: more than one pending approval")
    assert len(exc.value.ids) == view.MAX_LISTED_PENDING


def test_pending_approval_refuses_a_decided_one_and_a_run_with_none(kit):
    waiting = kit.waiting()
    only = kit.store.list_approvals(waiting.id)[0]
    view.approve(kit.store, waiting.id, only.id, "ops")
    with pytest.raises(view.ApprovalNotPendingError) as exc:
        view.pending_approval(kit.store, waiting.id, only.id)
    assert str(exc.value) == f"approval {only.id} is approved: approval is not pending"
    assert isinstance(exc.value, NotPendingError)
    with pytest.raises(view.NoPendingApprovalError) as none:
        view.pending_approval(kit.store, waiting.id)
    assert str(none.value) == f"run {waiting.id}: no pending approval"
    with pytest.raises(NotFoundError):
        view.pending_approval(kit.store, waiting.id, "no-such-approval")
    with pytest.raises(NotFoundError):
        view.pending_approval(kit.store, "no-such-run")


def test_pending_approval_of_a_run_that_is_not_waiting_is_refused(kit):
    done = kit.completed()
    with pytest.raises(view.RunNotWaitingError) as exc:
        view.pending_approval(kit.store, done.id)
    assert str(exc.value) == (f"run {done.id} is COMPLETED, not waiting for approval: "
                              "run is not waiting for approval")


# -- bounding ----------------------------------------------------------------------


def test_bound_value_truncates_only_oversized_strings():
    small = "x" * view.MAX_FIELD_BYTES
    big = "a" * 200 + "b" * 5000 + "c" * 200
    value = {"small": small, "n": 7, "nested": [big, {"k": big}], "t": True, "none": None}
    bounded = view.bound_value(value)
    shown = "a" * 200 + "…[5000 bytes omitted]…" + "c" * 200
    assert bounded == {"small": small, "n": 7, "nested": [shown, {"k": shown}], "t": True,
                       "none": None}
    assert value["nested"][0] == big  # the input is not changed


def test_bound_value_cuts_on_character_boundaries():
    text = "é" * 3000  # two bytes each: byte 200 is a boundary, 201 is not
    bounded = view.bound_string("x" + text)
    head, rest = bounded.split("…[", 1)
    omitted, tail = rest.split("]…", 1)
    assert head == "x" + "é" * 99  # 199 bytes: the 200th byte would split a character
    assert tail == "é" * 100
    assert omitted == f"{1 + 6000 - 199 - 200} bytes omitted"
    assert (head + tail).encode()  # both halves are whole characters


def test_bound_raw_keeps_numbers_and_unbounded_json_byte_for_byte():
    raw = b'{"a": 1.0, "big": 123456789012345678901234567890}'
    assert view.bound_raw(raw) is raw
    long = b'{"a":1.0,"e":1E+2,"s":"' + b"z" * 3000 + b'"}'
    assert view.bound_raw(long) == (b'{"a":1.0,"e":1E+2,"s":"' + b"z" * 200
                                    + "…[2600 bytes omitted]…".encode() + b"z" * 200 + b'"}')
    assert view.bound_raw(b"not json " * 400) == b"not json " * 400


def test_bound_approval_bounds_the_three_json_fields(kit):
    big = "q" * 10_000
    waiting = kit.waiting(args=dumps({"env": "staging", "note": big}))
    a = kit.store.list_approvals(waiting.id)[0]
    a = replace(a, capability=dumps({"c": big}), presentation=dumps({"p": [big]}))
    bounded = view.bound_approval(a)
    assert bounded.hash == a.hash
    assert bounded.request is not None and a.request is not None
    for raw in (bounded.capability, bounded.presentation, bounded.request.args):
        assert len(raw) < 1000 and b"bytes omitted" in raw
    assert json.loads(bounded.request.args)["env"] == "staging"
    assert bounded.request.spec == a.request.spec
    assert len(a.request.args) > 10_000  # the original is untouched


# -- decisions in the operator's terms -------------------------------------------


def test_approve_shown_refuses_a_changed_approval(kit):
    waiting = kit.waiting()
    shown = view.pending_approval(kit.store, waiting.id)
    # Someone rewrites the request (a consistent hash, so only the shown hash differs).
    assert shown.request is not None
    request = replace(shown.request, args=b'{"env":"production"}')
    new_hash = approval_hash(shown.kind, shown.capability, shown.presentation, request)
    with kit.store.tx() as tx:
        tx.execute("UPDATE approvals SET request_json = ?, hash = ? WHERE id = ?",
                   (dumps(request.to_json()), new_hash, shown.id))
    for decide in (view.approve_shown, view.reject_shown):
        with pytest.raises(ApprovalChangedError):
            decide(kit.store, waiting.id, shown.id, shown.hash, "ops")
    assert kit.store.get_approval(waiting.id, shown.id).status == "pending"
    assert kit.store.get_run(waiting.id).status == "WAITING_FOR_APPROVAL"
    decided = view.approve_shown(kit.store, waiting.id, shown.id, new_hash, "ops", "prod ok")
    assert (decided.status, decided.decided_by, decided.note) == ("approved", "ops", "prod ok")


def test_decision_wrappers_put_core_errors_in_the_operators_terms(kit):
    waiting = kit.waiting()
    a = kit.store.list_approvals(waiting.id)[0]
    view.approve(kit.store, waiting.id, a.id, "ops")
    with pytest.raises(view.ApprovalDecidedError) as decided:
        view.reject(kit.store, waiting.id, a.id, "ops")
    assert isinstance(decided.value, NotPendingError)
    assert isinstance(decided.value.__cause__, NotPendingError)
    assert str(decided.value) == f"approval {a.id} is already approved: approval is already decided"

    view.cancel(kit.store, waiting.id, "ops", "enough")
    with pytest.raises(view.RunNotWaitingError) as not_waiting:
        view.approve_shown(kit.store, waiting.id, a.id, a.hash, "ops")
    assert isinstance(not_waiting.value, RunStateError)
    assert str(not_waiting.value).endswith("not waiting for approval: run is not waiting for "
                                           "approval")
    with pytest.raises(view.RunFinishedError) as finished:
        view.cancel(kit.store, waiting.id, "ops")
    assert isinstance(finished.value, RunStateError)
    assert str(finished.value) == f"run {waiting.id} is already CANCELLED: run is already finished"
    with pytest.raises(NotFoundError):
        view.cancel(kit.store, "nope", "ops")


def test_a_decision_while_another_consumer_holds_the_lock_is_database_locked(kit):
    waiting = kit.waiting()
    a = kit.store.list_approvals(waiting.id)[0]
    kit.store.db().set_busy_timeout(50)
    other = apsw.Connection(kit.path)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(view.DatabaseLockedError) as exc:
            view.approve(kit.store, waiting.id, a.id, "ops")
        assert str(exc.value).endswith(": database is locked by another consumer")
        assert isinstance(exc.value.__cause__, apsw.BusyError)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert kit.store.get_approval(waiting.id, a.id).status == "pending"


def test_reject_cancels_the_run_and_records_who(kit):
    waiting = kit.waiting()
    a = kit.store.list_approvals(waiting.id)[0]
    events = []
    decided: Approval = view.reject(kit.store, waiting.id, a.id, "ops", "not today",
                                    observer=events.append)
    assert (decided.status, decided.decided_by, decided.note) == ("rejected", "ops", "not today")
    run = kit.store.get_run(waiting.id)
    assert (run.status, run.reason, run.reason_detail) == (
        "CANCELLED", "approval_rejected", "not today")
    assert [e.type for e in events] == ["approval.decided", "run.finished"]


# -- the chain check ----------------------------------------------------------------


def test_check_chain_of_an_intact_database(kit):
    kit.waiting()
    head_seq, head_hash = kit.store.chain_head()
    check = view.check_chain(kit.store)
    assert check.problems == []
    assert (check.head_seq, check.last_seq, check.report.checked) == (head_seq, head_seq, head_seq)
    assert check.report.hash == head_hash
    check = view.check_chain(kit.store, 3, 5, kept=(4, kit.store.event_hash(4)))
    assert (check.report.checked, check.last_seq, check.problems) == (3, 5, [])
    assert check.kept is not None and check.kept.matches


def test_check_chain_finds_a_cut_tail_only_with_a_kept_head(kit):
    kit.waiting()
    head_seq, head_hash = kit.store.chain_head()
    with kit.store.tx() as tx:
        tx.execute("DELETE FROM events WHERE seq > ?", (head_seq - 2,))
    assert view.check_chain(kit.store).problems == []  # a cut end still verifies
    check = view.check_chain(kit.store, kept=(head_seq, head_hash))
    assert check.kept is not None and not check.kept.matches and check.kept.found == ""
    assert check.problems == [
        f"the event chain does not match the head kept: seq {head_seq} is not in the "
        f"database; the newest event is seq {head_seq - 2}, so events were removed from the end"]
    short = view.check_chain(kit.store, to_seq=head_seq)
    assert short.problems == [
        f"the event chain is shorter than asked: --to {head_seq} was not reached; the last "
        f"event checked is seq {head_seq - 2}"]


def test_check_chain_says_a_kept_head_missing_from_the_middle_was_removed(kit):
    """Not "removed from the end": the newest event is later than the one kept."""
    kit.completed()
    kit.waiting()
    head_seq, _ = kit.store.chain_head()
    kept_hash = kit.store.event_hash(5)
    with kit.store.tx() as tx:
        tx.execute("DELETE FROM events WHERE seq = 5")
    check = view.check_chain(kit.store, kept=(5, kept_hash))
    assert (f"the event chain does not match the head kept: seq 5 is not in the database, "
            f"though the newest event is seq {head_seq}: it was removed") in check.problems
    with kit.store.tx() as tx:
        tx.execute("DELETE FROM events")
    check = view.check_chain(kit.store, kept=(5, kept_hash))
    assert check.problems == ["the event chain does not match the head kept: seq 5 is not "
                              "in the database, which holds no events"]


def test_check_chain_says_a_kept_head_whose_hash_was_blanked_is_there_without_it(kit):
    """Present with no hash is not "not in the database" (tampering with the hash
    column is what a kept head is for)."""
    kit.waiting()
    head_seq, head_hash = kit.store.chain_head()
    with kit.store.tx() as tx:
        tx.execute("UPDATE events SET hash = '' WHERE seq = ?", (head_seq,))
    check = view.check_chain(kit.store, kept=(head_seq, head_hash))
    assert (f"the event chain does not match the head kept: seq {head_seq} has hash "
            f"(none stored), not the kept {head_hash}") in check.problems


def test_json_nested_too_deep_to_walk_still_has_its_long_strings_bounded():
    """Deeper than Python's recursion allows the bounding walk (but JSON all the
    same, up to 1024 levels): never a RecursionError, and a long string in any
    branch is still cut as the walk would cut it."""
    deep = "[" * 600 + '"' + "y" * 3000 + '"' + "]" * 600
    raw = ('{"a":"' + "x" * 60000 + '","b":' + deep + "}").encode()
    shown = view.bound_raw(raw)
    assert len(shown) < 4 * view.MAX_FIELD_BYTES + 2 * 600 + 100
    assert shown.startswith(b'{"a":"xxx') and shown.endswith(b"]" * 600 + b"}")
    import orjson  # reads 1024 levels, where the stdlib decoder gives up

    value = orjson.loads(shown)
    assert value["a"] == view.bound_string("x" * 60000)


def test_check_chain_reports_an_altered_event(kit):
    kit.waiting()
    with kit.store.tx() as tx:
        tx.execute("UPDATE events SET payload_json = '{\"index\":9}' WHERE seq = 3")
    check = view.check_chain(kit.store)
    assert check.report.broken is not None and check.report.broken.seq == 3
    assert check.problems == [
        "the event chain is broken at seq 3: the stored hash is not the one the event's "
        "fields and the previous event's hash give"]


@pytest.mark.parametrize("kept", [(5,), 5, (4, 4), ("4", "abc"), [4, "abc"]])
def test_check_chain_refuses_a_kept_head_that_is_not_a_seq_and_hash_pair(kit, kept):
    """Before: ValueError 'not enough values to unpack' and the like."""
    kit.completed()
    with pytest.raises(TypeError) as info:
        view.check_chain(kit.store, 0, 0, kept)
    assert str(info.value).startswith("agentrt: kept is ")
    assert "not a (seq, hash) pair" in str(info.value)


@pytest.mark.parametrize("raw", ["x" * 3000, None, 7])
def test_bound_raw_refuses_what_is_not_bytes_in_one_sentence(raw):
    """Before: AttributeError "'str' object has no attribute 'decode'"."""
    with pytest.raises(TypeError) as info:
        view.bound_raw(raw)
    assert str(info.value).startswith("agentrt: raw is ") and "not JSON as bytes" in str(info.value)


@pytest.mark.parametrize("name,args", [
    ("runs", ()), ("summary", ("r1",)), ("steps", ("r1",)), ("detail", ("r1",)),
    ("runs_page", (10, 0)), ("summary_capped", ("r1",)), ("steps_page", ("r1", 10, 0)),
    ("detail_page", ("r1", 10, 0)), ("pending_approval", ("r1",)), ("check_chain", ()),
])
def test_a_read_given_a_path_for_a_store_says_so_in_one_sentence(name, args):
    with pytest.raises(TypeError) as raised:
        getattr(view, name)("runs.db", *args)
    assert str(raised.value) == ("agentrt: store is a str ('runs.db'), not a Store: open one "
                                 "with open_existing(path)")

"""The ``agentrt`` operator command through click's runner (spec core.md section 15).

Exit codes, the environment variable and a real terminal are also checked through
real processes in ``test_cli_processes.py``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace

import apsw
import pytest
from _cli_kit import Kit, invoke, local_times_in_utc, snapshot

from agentrt import cli as cli_module
from agentrt.gojson import dumps
from agentrt.records import Decision, approval_hash
from agentrt.render import local_stamp
from agentrt.store import Store, open_store, opening
from agentrt.trace import aligned_line, jsonl_record

utc = pytest.fixture(autouse=True)(local_times_in_utc)


@dataclass
class Ops:
    path: str
    kit: Kit
    waiting: str
    approval: str
    hash: str
    done: str


@pytest.fixture
def ops(tmp_path):
    kit = Kit(str(tmp_path / "ops.db"))
    done = kit.completed()
    waiting = kit.waiting()
    a = kit.store.list_approvals(waiting.id)[0]
    yield Ops(kit.path, kit, waiting.id, a.id, a.hash, done.id)
    kit.close()


def run(ops: Ops, *args: str, **kw) -> object:
    return invoke("--db", ops.path, *args, **kw)


# -- runs ------------------------------------------------------------------------


def test_runs_lists_and_emits_json(ops):
    text = run(ops, "runs")
    assert text.code == 0, text.stderr
    lines = text.stdout.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == ["RUN", "STATUS", "REASON", "STEPS", "CREATED",
                                              "APPROVAL", "GOAL"]
    assert lines[1].split()[:4] == [ops.waiting, "WAITING_FOR_APPROVAL", "-", "3"]
    assert ops.approval in lines[1] and lines[1].endswith("deploy the service to staging")
    assert lines[2].split()[:4] == [ops.done, "COMPLETED", "goal_completed", "2"]
    assert len(lines) == 3
    # Aligned: a column starts at the same place on every line.
    assert lines[0].index("STATUS") == lines[1].index("WAITING") == lines[2].index("COMPLETED")
    assert lines[0].index("GOAL") == lines[1].index("deploy") == lines[2].index("read the")

    doc = json.loads(run(ops, "runs", "--json").stdout)
    assert list(doc) == ["runs", "total", "limit", "offset"]
    assert (doc["total"], doc["limit"], doc["offset"]) == (2, 100, 0)
    assert [r["id"] for r in doc["runs"]] == [ops.waiting, ops.done]
    assert doc["runs"][0]["pending_approval_id"] == ops.approval
    assert "pending_approval_id" not in doc["runs"][1]


def test_runs_json_is_indented_two_spaces():
    out = cli_module.Out.__new__(cli_module.Out)
    chunks: list[bytes] = []
    out.raw = chunks.append  # type: ignore[method-assign]
    cli_module.write_object(out, [("a", cli_module.Array([{"x": 1}, {}])), ("b", [])])
    assert b"".join(chunks) == (
        b'{\n  "a": [\n    {\n      "x": 1\n    },\n    {}\n  ],\n  "b": []\n}\n')


def test_runs_of_an_empty_database_says_so(tmp_path):
    path = str(tmp_path / "empty.db")
    open_store(path).close()
    assert invoke("--db", path, "runs").stdout == "no runs\n"
    assert json.loads(invoke("--db", path, "runs", "--json").stdout)["runs"] == []


def test_runs_reads_the_database_from_the_environment(ops):
    result = invoke("runs", env={"AGENTRT_DB": ops.path})
    assert result.code == 0 and ops.waiting in result.stdout


def test_db_and_json_are_accepted_before_and_after_the_command(ops, tmp_path):
    before = invoke("--db", ops.path, "--json", "runs")
    after = invoke("runs", "--db", ops.path, "--json")
    assert before.code == after.code == 0
    assert before.stdout == after.stdout and json.loads(before.stdout)["total"] == 2
    # The command's own --db wins over the one before it, which wins over AGENTRT_DB.
    missing = str(tmp_path / "missing.db")
    assert invoke("--db", missing, "runs", "--db", ops.path).code == 0
    assert invoke("--db", ops.path, "runs", env={"AGENTRT_DB": missing}).code == 0


def test_runs_limit_and_offset_page_the_output(tmp_path, monkeypatch):
    kit = Kit(str(tmp_path / "many.db"))
    ids = [kit.completed(f"goal {i}").id for i in range(5)][::-1]  # newest first
    kit.close()
    page = invoke("--db", kit.path, "runs", "--limit", "2", "--offset", "1")
    lines = page.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:3]] == ids[1:3]
    assert lines[3] == ("... 2 more run(s); rerun with --offset 3 to see them "
                        "(showing 2 of 5)")
    doc = json.loads(invoke("--db", kit.path, "runs", "--json", "--limit", "2").stdout)
    assert [r["id"] for r in doc["runs"]] == ids[:2] and doc["truncated"] is True
    last = json.loads(invoke("--db", kit.path, "runs", "--json", "--offset", "3").stdout)
    assert [r["id"] for r in last["runs"]] == ids[3:] and "truncated" not in last
    # --limit 0 reads everything, a page at a time.
    monkeypatch.setattr(cli_module, "PAGE_SIZE", 2)
    every = invoke("--db", kit.path, "runs", "--limit", "0")
    assert [line.split()[0] for line in every.stdout.splitlines()[1:]] == ids
    three = json.loads(invoke("--db", kit.path, "runs", "--json", "--limit", "3").stdout)
    assert [r["id"] for r in three["runs"]] == ids[:3]
    beyond = invoke("--db", kit.path, "runs", "--offset", "9")
    assert beyond.stdout == "no runs at offset 9; there are 5\n"


def test_text_from_the_database_cannot_disguise_a_line(ops):
    with ops.kit.store.tx() as tx:
        tx.execute("UPDATE runs SET goal = ?, reason_detail = ? WHERE id = ?",
                   ("evil\x1b[2J\u202egnp.exe\nsecond line", "x\u200by", ops.done))
    out = run(ops, "runs").stdout
    assert "\x1b" not in out and "\u202e" not in out
    assert "evil\\x1b[2J\\u{202e}gnp.exe second line" in out
    shown = run(ops, "show", ops.done).stdout
    assert "\u200b" not in shown and "x\\u{200b}y" in shown


# -- show --------------------------------------------------------------------------


def test_show_puts_the_waiting_approval_in_front(ops):
    result = run(ops, "show", ops.waiting)
    assert result.code == 0, result.stderr
    out = result.stdout
    lines = out.splitlines()
    assert lines[:5] == [
        f"run     {ops.waiting}",
        "goal    deploy the service to staging",
        "status  WAITING_FOR_APPROVAL",
        "steps   3",
        f"created {local_stamp(ops.kit.store.get_run(ops.waiting).created_at)}  finished -",
    ]
    # The zone is UTC here; a run not finished shows "-", as spec 15 pins the line.
    assert lines[4] == "created 2026-10-01 09:00:02 +0000  finished -"
    assert out.index("APPROVAL WAITING") < out.index("STEP  ")
    block = out[out.index("APPROVAL WAITING"):out.index("----- end of approval")]
    assert f"APPROVAL WAITING  {ops.approval}" in block
    assert "kind    remote_mutation\ntool    deploy\n" in block
    assert "reason  side effect remote_mutation is require_approval by policy" in block
    assert f"hash    {ops.hash}" in block
    assert 'arguments:\n  env (9 bytes)\n    "staging"\n' in block
    assert "presentation:\n  args (17 bytes)\n    {\n      \"env\": \"staging\"\n    }\n" in block
    assert (f"decide with: agentrt --db {ops.path} approve {ops.waiting} "
            f"--approval {ops.approval}") in block
    assert f"----- end of approval {ops.approval} for tool deploy -----" in out
    table = lines[lines.index(next(x for x in lines if x.startswith("STEP  "))):]
    assert [re.split(r"\s{2,}", x)[:6] for x in table[1:]] == [
        ["0", "read_file", "tool_call", "done", "allow", "tool_result"],
        ["1", "drop_table", "tool_call", "failed", "deny", "policy_denied"],
        ["2", "deploy", "tool_call", "awaiting_approval", "require_approval", "-"],
    ]


def test_show_of_a_finished_run_has_a_finish_time_and_no_approval(ops):
    out = run(ops, "show", ops.done).stdout
    assert "status  COMPLETED (goal_completed)\n" in out
    assert "  finished 2026-10-01 " in out
    assert "APPROVAL" not in out


def test_show_json_carries_the_run_steps_and_bounded_approvals(ops):
    with ops.kit.store.tx() as tx:
        tx.execute("UPDATE approvals SET presentation_json = ? WHERE id = ?",
                   (dumps({"diff": "d" * 50_000}), ops.approval))
    doc = json.loads(run(ops, "show", ops.waiting, "--json").stdout)
    assert list(doc) == ["run", "steps", "steps_total", "approvals", "approvals_total",
                         "waiting_approval", "limit", "offset"]
    assert doc["run"]["pending_approval_id"] == ops.approval
    assert [s["index"] for s in doc["steps"]] == [0, 1, 2] and doc["steps_total"] == 3
    waiting = doc["waiting_approval"]
    assert waiting["id"] == ops.approval and waiting["hash"] == ops.hash  # hash intact
    assert "bytes omitted" in waiting["presentation"]["diff"]
    assert len(waiting["presentation"]["diff"]) < 500
    assert doc["approvals"][0]["id"] == ops.approval


def test_show_json_keeps_an_approval_column_that_is_not_json_as_a_flagged_string(ops):
    """As ``events --json`` keeps a payload that is not JSON (``"invalid_payload": true``)."""
    huge = "{" + "x" * 50_000
    with ops.kit.store.tx() as tx:
        tx.execute("UPDATE approvals SET presentation_json = '{', capability_json = ? "
                   "WHERE id = ?", (huge, ops.approval))
    text = run(ops, "show", ops.waiting)
    assert text.code == 0 and "presentation:\n  value (1 bytes)\n    {\n" in text.stdout
    result = run(ops, "show", ops.waiting, "--json")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    for a in (doc["waiting_approval"], doc["approvals"][0]):
        assert list(a)[4:8] == ["capability", "invalid_capability", "presentation",
                                "invalid_presentation"]
        assert (a["presentation"], a["invalid_presentation"]) == ("{", True)
        assert a["invalid_capability"] is True
        assert a["capability"].startswith("{xxx") and "bytes omitted" in a["capability"]
        assert len(a["capability"]) < 500  # bounded as a JSON value is
        assert a["hash"] == ops.hash
    with ops.kit.store.tx() as tx:  # valid columns carry no flag
        tx.execute("UPDATE approvals SET presentation_json = '{}', capability_json = '{}' "
                   "WHERE id = ?", (ops.approval,))
    doc = json.loads(run(ops, "show", ops.waiting, "--json").stdout)
    assert not [k for k in doc["waiting_approval"] if k.startswith("invalid_")]


def test_show_limit_and_offset_page_steps(ops, monkeypatch):
    page = run(ops, "show", ops.waiting, "--limit", "1", "--offset", "1")
    out = page.stdout
    assert "APPROVAL WAITING" in out  # the waiting approval, whatever the offset
    table = out[out.index("STEP  "):].splitlines()
    assert table[1].split()[:2] == ["1", "drop_table"] and len(table) == 3
    assert table[2] == "... 1 more step(s); rerun with --offset 2 to see them (showing 1 of 3)"
    doc = json.loads(run(ops, "show", ops.waiting, "--json", "--limit", "2").stdout)
    assert [s["index"] for s in doc["steps"]] == [0, 1] and doc["steps_truncated"] is True
    monkeypatch.setattr(cli_module, "PAGE_SIZE", 1)
    every = json.loads(run(ops, "show", ops.waiting, "--json", "--limit", "0").stdout)
    assert [s["index"] for s in every["steps"]] == [0, 1, 2] and "steps_truncated" not in every


def _copy_approval(tx, ops, new_id):
    """Another pending approval of the waiting run, a copy of its own under
    ``new_id``, as a database another tool wrote may hold."""
    tx.execute("INSERT INTO approvals (id, run_id, step_id, kind, capability_json, "
               "presentation_json, request_json, hash, status, created_at) "
               "SELECT ?, run_id, step_id, kind, capability_json, presentation_json, "
               "request_json, hash, status, created_at FROM approvals WHERE id = ?",
               (new_id, ops.approval))


def test_show_lists_several_pending_approvals_each_in_its_block(ops, monkeypatch):
    step = ops.kit.store.get_approval(ops.waiting, ops.approval).step_id
    with ops.kit.store.tx() as tx:
        _copy_approval(tx, ops, "second")
        tx.append(ops.waiting, step, ops.kit.store.get_run(ops.waiting).created_at,
                  "approval.requested", {"approval_id": "second", "reason": "asked again"})
    monkeypatch.setattr(cli_module, "PAGE_SIZE", 1)  # one approval a page: reasons per page
    out = run(ops, "show", ops.waiting).stdout
    assert out.count("APPROVAL WAITING") == 2 and "APPROVAL WAITING  second" in out
    assert "--approval second" in out
    first, second = out.split("APPROVAL WAITING")[1:]
    assert "reason  side effect remote_mutation is require_approval by policy" in first
    assert "reason  asked again\n" in second
    doc = json.loads(run(ops, "show", ops.waiting, "--json").stdout)
    assert "waiting_approval" not in doc and "pending_approval_id" not in doc["run"]


def test_show_says_how_many_pending_approvals_an_offset_skips(ops):
    """Spec 14 pages a run's pending approvals with its steps' offset: the run
    waits on them, so a line says what the offset left out."""
    with ops.kit.store.tx() as tx:
        _copy_approval(tx, ops, "second")
    skipped = run(ops, "show", ops.waiting, "--offset", "2").stdout
    assert "APPROVAL WAITING" not in skipped
    assert ("... 2 pending approval(s) before --offset 2; rerun without it to see them"
            in skipped.splitlines())
    one = run(ops, "show", ops.waiting, "--offset", "1").stdout
    assert one.count("APPROVAL WAITING  second") == 1
    assert "... 1 pending approval(s) before --offset 1;" in one
    assert "before --offset" not in run(ops, "show", ops.waiting).stdout


# -- events --------------------------------------------------------------------------


def test_events_both_trace_formats(ops):
    stored = ops.kit.store.list_events(ops.waiting)
    text = run(ops, "events", ops.waiting)
    assert text.code == 0
    assert text.stdout == "".join(aligned_line(e) for e in stored)
    lines = run(ops, "events", ops.waiting, "--json").stdout_bytes
    assert lines == b"".join(jsonl_record(e) for e in stored)


def test_events_text_caps_a_huge_payload(ops):
    with ops.kit.store.tx() as tx:
        tx.execute("UPDATE events SET payload_json = ? WHERE seq = (SELECT MIN(seq) FROM events "
                   "WHERE run_id = ?)", (dumps({"blob": "é" * 30_000}), ops.waiting))
    first = run(ops, "events", ops.waiting, "--limit", "1").stdout.splitlines()[0]
    assert len(first.encode()) < 8200
    assert re.search(r"\.\.\.\[\d+ more bytes\]$", first)
    assert "\ufffd" not in first  # cut on a character boundary


def test_events_limit_and_offset_page_the_output(ops, monkeypatch):
    stored = ops.kit.store.list_events(ops.waiting)
    page = run(ops, "events", ops.waiting, "--limit", "2", "--offset", "3").stdout.splitlines()
    assert page[:2] == [aligned_line(e).rstrip("\n") for e in stored[3:5]]
    assert page[2] == (f"... {len(stored) - 5} more event(s); rerun with --offset 5 to see them "
                       f"(showing 2 of {len(stored)})")
    lines = run(ops, "events", ops.waiting, "--json", "--limit", "2", "--offset", "3"
                ).stdout_bytes.splitlines(keepends=True)
    assert lines[:2] == [jsonl_record(e) for e in stored[3:5]]
    assert json.loads(lines[2]) == {"meta": True, "truncated": True, "total": len(stored),
                                    "returned": 2, "offset": 3}
    monkeypatch.setattr(cli_module, "PAGE_SIZE", 4)
    every = run(ops, "events", ops.waiting, "--json", "--limit", "0").stdout_bytes
    assert every == b"".join(jsonl_record(e) for e in stored)


def test_events_of_an_unknown_run_fails_with_one_sentence(ops):
    result = run(ops, "events", "nope")
    assert (result.code, result.stdout) == (1, "")
    assert result.stderr == "error: agentrt: not found: run nope\n"


# -- approve, reject, cancel ------------------------------------------------------------


def test_approve_records_the_decision_and_traces(ops):
    result = run(ops, "approve", ops.waiting, "--yes", "--note", "staging only")
    assert result.code == 0, result.stderr
    out = result.stdout
    assert out.index("APPROVAL WAITING") < out.index(f"approval {ops.approval}: approved by tester")
    assert out.endswith(f"approval {ops.approval}: approved by tester\n"
                        f"run {ops.waiting}: WAITING_FOR_APPROVAL\n"
                        "the run stays waiting until the consumer resumes it\n")
    assert "decide with:" not in out  # it is being decided
    traced = result.stderr.splitlines()
    assert len(traced) == 1 and "approval.decided" in traced[0]
    assert '"by":"tester"' in traced[0] and '"note":"staging only"' in traced[0]
    a = ops.kit.store.get_approval(ops.waiting, ops.approval)
    assert (a.status, a.decided_by, a.note) == ("approved", "tester", "staging only")


def test_approve_defaults_who_to_the_environment(ops):
    before = snapshot(ops.path)
    nobody = run(ops, "approve", ops.waiting, "--yes", env={"USER": None})
    assert nobody.code == 2
    assert nobody.stderr.splitlines()[0] == (
        "usage: no name to record the decision under: pass --by or set USER")
    assert snapshot(ops.path) == before
    result = run(ops, "approve", ops.waiting, "--yes", env={"USER": "alice"})
    assert result.code == 0
    assert ops.kit.store.get_approval(ops.waiting, ops.approval).decided_by == "alice"


def test_by_overrides_the_environment(ops):
    run(ops, "approve", ops.waiting, "--approval", ops.approval, "--by", "bob",
        env={"USER": "alice"})
    assert ops.kit.store.get_approval(ops.waiting, ops.approval).decided_by == "bob"


def test_reject_cancels_the_run(ops):
    result = run(ops, "reject", ops.waiting, "--approval", ops.approval, "--note", "no")
    assert result.code == 0, result.stderr
    assert result.stdout.endswith(f"approval {ops.approval}: rejected by tester\n"
                                  f"run {ops.waiting}: CANCELLED (approval_rejected)\n")
    assert [line.split()[3] for line in result.stderr.splitlines()] == [
        "approval.decided", "run.finished"]
    r = ops.kit.store.get_run(ops.waiting)
    assert (r.status, r.reason, r.reason_detail) == ("CANCELLED", "approval_rejected", "no")


def test_cancel_ends_the_run_and_refuses_a_terminal_one(ops):
    result = run(ops, "cancel", ops.waiting, "--note", "enough")
    assert result.code == 0, result.stderr
    assert result.stdout == f"run {ops.waiting}: CANCELLED (operator_cancelled)\n"
    assert "run.finished" in result.stderr and '"by":"tester"' in result.stderr
    before = snapshot(ops.path)
    again = run(ops, "cancel", ops.waiting)
    assert (again.code, again.stdout) == (1, "")
    assert again.stderr == (f"error: run {ops.waiting} is already CANCELLED: run is already "
                            "finished\n")
    done = run(ops, "cancel", ops.done, "--json")
    assert done.code == 1 and "already COMPLETED" in done.stderr
    assert snapshot(ops.path) == before
    doc = json.loads(invoke("--db", ops.path, "--json", "show", ops.waiting).stdout)
    assert doc["run"]["reason"] == "operator_cancelled"


def test_cancel_json_reports_the_run(ops):
    doc = json.loads(run(ops, "cancel", ops.waiting, "--json").stdout)
    assert list(doc) == ["run"]
    assert (doc["run"]["status"], doc["run"]["reason"]) == ("CANCELLED", "operator_cancelled")


def test_decide_binds_to_the_hash_actually_shown(ops, monkeypatch):
    """The approval changes between being printed and being confirmed: nothing is decided."""
    original = ops.kit.store.get_approval(ops.waiting, ops.approval)
    assert original.request is not None
    request = replace(original.request, args=b'{"env":"production"}')
    new_hash = approval_hash(original.kind, original.capability, original.presentation, request)

    def rewrite_then_say_yes(verb, a):
        with ops.kit.store.tx() as tx:
            tx.execute("UPDATE approvals SET request_json = ?, hash = ? WHERE id = ?",
                       (dumps(request.to_json()), new_hash, a.id))
        return True

    monkeypatch.setattr(cli_module, "_interactive", lambda: True)
    monkeypatch.setattr(cli_module, "_confirm", rewrite_then_say_yes)
    for verb in ("approve", "reject"):
        result = run(ops, verb, ops.waiting)
        assert result.code == 1
        assert f"hash    {ops.hash}" in result.stdout  # what was shown
        assert result.stderr == (
            f"error: {verb}: approval {ops.approval} changed after it was shown; run the "
            "command again and read it before deciding\n")
        a = ops.kit.store.get_approval(ops.waiting, ops.approval)
        assert (a.status, a.hash) == ("pending", new_hash)
        with ops.kit.store.tx() as tx:  # put it back for the next verb
            tx.execute("UPDATE approvals SET request_json = ?, hash = ? WHERE id = ?",
                       (dumps(original.request.to_json()), original.hash, ops.approval))


def test_decide_json_includes_the_decided_hash(ops):
    result = run(ops, "approve", ops.waiting, "--json", "--yes")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)  # nothing but the report on stdout
    assert list(doc) == ["run", "approval"]
    assert doc["approval"]["hash"] == ops.hash
    assert (doc["approval"]["status"], doc["approval"]["decided_by"]) == ("approved", "tester")
    assert doc["run"]["status"] == "WAITING_FOR_APPROVAL"
    assert "pending_approval_id" not in doc["run"]


def test_a_terminal_asks_before_deciding(ops, monkeypatch):
    monkeypatch.setattr(cli_module, "_interactive", lambda: True)
    before = snapshot(ops.path)
    declined = run(ops, "approve", ops.waiting, input="n\n")
    assert declined.code == 1
    assert declined.stderr.endswith(
        f"approve approval {ops.approval} of run {ops.waiting}? [y/N] "
        "error: approve: declined at the prompt\n")
    ended = run(ops, "approve", ops.waiting, input="")  # Ctrl-D: the refusal a script gets
    assert ended.code == 2
    assert ended.stderr.endswith(
        f"approve approval {ops.approval} of run {ops.waiting}? [y/N] \n"
        "usage: approve: refusing without --approval, --yes, or an interactive terminal to "
        "confirm at; pass --approval <id> or --yes\n"
        "Usage: agentrt approve [OPTIONS] RUN\nTry 'agentrt approve --help' for help.\n")
    assert snapshot(ops.path) == before
    agreed = run(ops, "reject", ops.waiting, input="yes\n")
    assert agreed.code == 0, agreed.stderr
    assert ops.kit.store.get_approval(ops.waiting, ops.approval).status == "rejected"


def test_a_script_must_name_the_approval_or_say_yes(ops):
    before = snapshot(ops.path)
    for args in ([], ["--json"]):
        result = run(ops, "approve", ops.waiting, *args)
        assert result.code == 2 and result.stdout == ""
        assert result.stderr.splitlines()[0] == (
            "usage: approve: refusing without --approval, --yes, or an interactive terminal "
            "to confirm at; pass --approval <id> or --yes")
    assert snapshot(ops.path) == before


def test_several_pending_approvals_need_one_named(ops):
    with ops.kit.store.tx() as tx:
        _copy_approval(tx, ops, "second")
    vague = run(ops, "approve", ops.waiting, "--yes")
    assert vague.code == 1
    assert vague.stderr == (f"error: run {ops.waiting} has 2 pending approvals, name one of "
                            f"{ops.approval}, second: more than one pending approval\n")
    named = run(ops, "approve", ops.waiting, "--approval", "second")
    assert named.code == 0 and "approval second: approved by tester" in named.stdout


# -- verify --------------------------------------------------------------------------


def test_verify_intact_chain_exits_zero(ops):
    head_seq, head_hash = ops.kit.store.chain_head()
    result = run(ops, "verify")
    assert result.code == 0, result.stderr
    assert result.stdout == (f"head: seq {head_seq} {head_hash}\n"
                             f"intact: {head_seq} event(s), seq 1 to {head_seq}\n"
                             f"last checked: seq {head_seq} {head_hash}\n")
    fifth = ops.kit.store.event_hash(5)
    kept = run(ops, "verify", "--from", "2", "--to", "5", "--head", f"5:{fifth}")
    assert kept.stdout.splitlines()[1:] == [
        "intact: 4 event(s), seq 2 to 5",
        f"last checked: seq 5 {ops.kit.store.event_hash(5)}",
        "kept head: seq 5 matches"]
    doc = json.loads(run(ops, "verify", "--json", "--to", "5").stdout)
    assert doc == {"head": {"seq": head_seq, "hash": head_hash}, "from": 1, "to": 5,
                   "hash": ops.kit.store.event_hash(5), "checked": 5, "intact": True,
                   "requested": {"to": 5, "reached": True}}


def test_verify_of_an_empty_database(tmp_path):
    path = str(tmp_path / "empty.db")
    open_store(path).close()
    result = invoke("--db", path, "verify")
    assert (result.code, result.stdout) == (0, "head: no events\nintact: no events in the range\n")


def test_verify_broken_chain_exits_one(ops):
    with ops.kit.store.tx() as tx:
        tx.execute("UPDATE events SET payload_json = '{\"index\":7}' WHERE seq = 4")
    result = run(ops, "verify")
    assert result.code == 1
    lines = result.stdout.splitlines()
    assert lines[1] == ("broken at seq 4: the stored hash is not the one the event's fields and "
                        "the previous event's hash give")
    assert lines[2].startswith("  expected ") and lines[3].startswith("  found    ")
    assert result.stderr == ("error: the event chain is broken at seq 4: the stored hash is not "
                             "the one the event's fields and the previous event's hash give\n")
    doc = json.loads(run(ops, "verify", "--json").stdout)
    assert doc["intact"] is False and doc["break"]["seq"] == 4
    assert list(doc["break"]) == ["seq", "expected", "found", "detail"]


def test_verify_cut_database_fails_a_kept_head(ops):
    head_seq, head_hash = ops.kit.store.chain_head()
    with ops.kit.store.tx() as tx:
        tx.execute("DELETE FROM events WHERE seq > ?", (head_seq - 3,))
    assert run(ops, "verify").code == 0  # a cut end still verifies
    result = run(ops, "verify", "--head", f"{head_seq}:{head_hash}")
    assert result.code == 1
    assert result.stderr == (
        f"error: the event chain does not match the head kept: seq {head_seq} is not in the "
        f"database; the newest event is seq {head_seq - 3}, so events were removed from the end\n")
    doc = json.loads(run(ops, "verify", "--json", "--head", f"{head_seq}:{head_hash}").stdout)
    assert doc["kept_head"] == {"seq": head_seq, "hash": head_hash, "found": "",
                                "matches": False}
    short = run(ops, "verify", "--to", str(head_seq))
    assert short.code == 1 and "the event chain is shorter than asked: --to" in short.stderr
    other = run(ops, "verify", "--head", f"{head_seq - 3}:{'0' * 64}")
    assert other.code == 1 and f"seq {head_seq - 3} has hash" in other.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--from", "-1"], "Invalid value for '--from'"),
    (["--to", "-2"], "Invalid value for '--to'"),
    (["--from", "5", "--to", "3"], "--to 3 is before --from 5"),
    (["--head", "12"], "'12' is not SEQ:HASH"),
    (["--head", f"0:{'a' * 64}"], "is not SEQ:HASH"),
    (["--head", f"3:{'g' * 64}"], "is not SEQ:HASH"),
    (["--head", "3:abc"], "is not SEQ:HASH"),
    (["--to", "4", "--head", f"5:{'a' * 64}"], "--head seq 5 is after --to 4"),
    (["--from", "6", "--head", f"5:{'a' * 64}"], "--head seq 5 is before --from 6"),
])
def test_verify_bad_arguments_are_usage(tmp_path, args, message):
    # The database does not exist: the arguments are refused before it is opened.
    result = invoke("--db", str(tmp_path / "missing.db"), "verify", *args)
    assert result.code == 2 and result.stdout == ""
    assert result.stderr.startswith("usage: ") and message in result.stderr.splitlines()[0]


# -- usage, help, and bad input ----------------------------------------------------------


def test_usage_exit_codes(ops):
    bare = invoke()
    assert (bare.code, bare.stdout) == (2, "") and "Commands:" in bare.stderr
    # The spec's "-h/-help" too (before: -help was "No such option '-e'", exit 2).
    for args in (["help"], ["-h"], ["-help"], ["--help"], ["help", "approve"],
                 ["runs", "--help"], ["runs", "-help"]):
        shown = invoke(*args)
        assert (shown.code, shown.stderr) == (0, ""), args
        assert shown.stdout.startswith("Usage: agentrt")
    unknown = invoke("frobnicate")
    assert unknown.code == 2 and unknown.stderr.startswith("usage: No such command 'frobnicate'")
    assert invoke("runs", "--limit", "-1", "--db", ops.path).code == 2
    assert invoke("show").code == 2
    no_db = invoke("runs").stderr.splitlines()[0]
    assert no_db == "usage: no database: pass --db or set AGENTRT_DB"


@pytest.mark.parametrize("args", [
    ["runs", "--limit", " 5"], ["runs", "--limit", "\u0663"], ["runs", "--offset", "1 "],
    ["show", "r", "--limit", "\uff15"], ["events", "r", "--offset", "\u0663"],
    ["verify", "--from", " 1"], ["verify", "--to", "\u0663"],
    ["runs", "--limit", "+1"], ["runs", "--offset", "1_0"], ["runs", "--limit", "-1"],
])
def test_number_options_take_ascii_digits_only(ops, args):
    """Python's int() alone took ' 5', '+1', '1_0' and an Arabic-Indic three
    (read as 3) and ran the command with them."""
    result = invoke("--db", ops.path, *args)
    assert result.code == 2 and result.stdout == ""
    assert "is not a whole number in ASCII digits" in result.stderr.splitlines()[0]


def test_help_says_resume_belongs_to_the_consumer():
    shown = invoke("--help").stdout
    flat = " ".join(shown.split())
    assert "There is no resume command" in flat
    assert "resuming belongs to the consumer that owns them" in flat
    assert "resume" not in [line.split()[0] for line in shown.splitlines()
                            if line.startswith("  ") and line.split()]
    asked = invoke("resume", "abc")
    assert asked.code == 2
    assert asked.stderr.splitlines()[0] == (
        "usage: there is no resume command: resuming continues the run's loop, which needs the "
        "consumer's agent, tools and policy, so the consumer that owns them resumes it")


def test_every_command_has_help_that_says_what_it_does():
    for name in ("runs", "show", "events", "approve", "reject", "cancel", "verify"):
        shown = invoke(name, "--help")
        assert shown.code == 0 and "--db PATH" in shown.stdout and "--json" in shown.stdout


def _corrupt_setup(kind: str, ops: Ops, tmp_path) -> list[str]:
    """Make the database (or the arguments) bad in one way; return the command to run."""
    path = ops.path
    if kind == "insecure-mode":
        os.chmod(path, 0o666)
        return ["--db", path, "runs"]
    if kind == "symlink":
        link = str(tmp_path / "link.db")
        os.symlink(path, link)
        return ["--db", link, "runs"]
    if kind == "trigger":
        with ops.kit.store.tx() as tx:
            tx.execute("CREATE TRIGGER evil AFTER UPDATE ON runs BEGIN SELECT 1; END")
        return ["--db", path, "approve", ops.waiting, "--yes"]
    if kind == "newer-schema":
        with ops.kit.store.tx() as tx:
            tx.execute("INSERT INTO schema_migrations VALUES (7, '2030-01-01T00:00:00Z')")
        return ["--db", path, "show", ops.waiting]
    if kind == "older-schema":
        with ops.kit.store.tx() as tx:
            tx.execute("DELETE FROM schema_migrations WHERE version = 6")
        return ["--db", path, "cancel", ops.waiting]
    raise AssertionError(kind)


@pytest.mark.parametrize(("kind", "message"), [
    ("insecure-mode", "is -rw-rw-rw-, writable by group or others; the runtime keeps its "
                      "database readable and writable by its owner only: chmod 600"),
    ("symlink", "database path is a symbolic link"),
    ("trigger", 'has trigger "evil"; the runtime creates neither and will not run SQL'),
    ("newer-schema", "is at schema version 7, which is newer than this build of agentrt "
                     "(version 6)"),
    ("older-schema", "this build of agentrt (schema version 6) is newer than"),
])
def test_open_refusals_are_one_sentence(ops, tmp_path, kind, message):
    args = _corrupt_setup(kind, ops, tmp_path)
    ops.kit.close()
    before = snapshot(ops.path)
    result = invoke(*args)
    assert (result.code, result.stdout) == (1, "")
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert snapshot(ops.path) == before


def test_open_insecure_file_mode_refused_with_one_sentence(ops):
    os.chmod(ops.path, 0o620)
    result = run(ops, "cancel", ops.waiting)
    assert result.code == 1
    assert result.stderr == (
        f"error: agentrt: {ops.path} is -rw--w----, writable by group or others; the runtime "
        "keeps its database readable and writable by its owner only: chmod 600 "
        f"{ops.path} and chown it to the user that runs the runtime\n")
    assert os.stat(ops.path).st_mode & 0o777 == 0o620  # not tightened, not changed


def test_open_trigger_carrying_database_refused_with_one_sentence(ops):
    with ops.kit.store.tx() as tx:
        tx.execute("CREATE VIEW sneaky AS SELECT * FROM runs")
    result = run(ops, "runs")
    assert result.code == 1
    assert result.stderr == (
        f'error: agentrt: database holds a trigger or view: {ops.path} has view "sneaky"; the '
        "runtime creates neither and will not run SQL a database's author put there: drop it "
        '(DROP VIEW "sneaky") if you trust the file, or open a copy without it\n')


def test_open_symlink_refused_with_one_sentence(ops, tmp_path):
    link = str(tmp_path / "via-link.db")
    os.symlink(ops.path, link)
    result = invoke("--db", link, "show", ops.waiting)
    assert result.code == 1
    assert result.stderr == (f"error: agentrt: database path is a symbolic link: {link}; name "
                             "the database file itself\n")


def test_schema_of_another_version_says_which_side_is_newer(ops):
    with ops.kit.store.tx() as tx:
        tx.execute("INSERT INTO schema_migrations VALUES (9, '2030-01-01T00:00:00Z')")
    newer = run(ops, "runs").stderr
    assert newer == (
        f"error: {ops.path} is at schema version 9, which is newer than this build of agentrt "
        "(version 6): use the agentrt that ships with the consumer that migrated it; the "
        "consumer that owns the database runs its migrations, agentrt never does\n")


@pytest.mark.parametrize(("name", "args", "code", "message"), [
    ("no-database", ["runs"], 2, "usage: no database: pass --db or set AGENTRT_DB"),
    ("missing-file", ["--db", "{missing}", "runs"], 1, "does not exist; name an existing"),
    ("unknown-run-show", ["--db", "{db}", "show", "nope"], 1, "not found: run nope"),
    ("unknown-run-approve", ["--db", "{db}", "approve", "nope", "--yes"], 1,
     "not found: run nope"),
    ("unknown-run-cancel", ["--db", "{db}", "cancel", "nope"], 1, "not found: run nope"),
    ("unknown-approval", ["--db", "{db}", "approve", "{waiting}", "--approval", "nope"], 1,
     "not found: approval nope"),
    ("no-longer-pending", ["--db", "{db}", "approve", "{waiting}", "--approval", "{approval}"],
     1, "is approved: approval is not pending"),
    ("run-not-waiting", ["--db", "{db}", "reject", "{done}", "--yes"], 1,
     "is COMPLETED, not waiting for approval"),
    ("finished-run-cancel", ["--db", "{db}", "cancel", "{done}"], 1,
     "is already COMPLETED: run is already finished"),
    ("malformed-head", ["--db", "{db}", "verify", "--head", "x:y"], 2, "is not SEQ:HASH"),
    ("negative-offset", ["--db", "{db}", "events", "{waiting}", "--offset", "-1"], 2,
     "Invalid value for '--offset'"),
])
def test_bad_input_gets_one_sentence_an_exit_code_and_changes_nothing(
        ops, tmp_path, name, args, code, message):
    if name == "no-longer-pending":
        assert run(ops, "approve", ops.waiting, "--yes").code == 0
    subs = {"{db}": ops.path, "{missing}": str(tmp_path / "missing.db"),
            "{waiting}": ops.waiting, "{approval}": ops.approval, "{done}": ops.done}
    before = snapshot(ops.path)
    result = invoke(*[subs.get(a, a) for a in args])
    assert result.code == code, result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("error: " if code == 1 else "usage: ") and message in first
    if code == 1:
        assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert snapshot(ops.path) == before


@pytest.mark.parametrize("args", [
    ["show", ""], ["events", ""], ["cancel", ""], ["approve", "", "--yes"],
    ["reject", "", "--yes"], ["approve", "", "--approval", "{approval}"],
], ids=["show", "events", "cancel", "approve", "reject", "approve-named"])
@pytest.mark.parametrize("database", ["{db}", "{missing}"], ids=["present", "missing"])
def test_an_empty_run_argument_is_a_usage_error_said_before_the_database_is_opened(
        ops, tmp_path, args, database):
    """``agentrt show "$RUN"`` with $RUN unset opened the database and said
    ``error: agentrt: not found: run `` (nothing after "run", no fix), exit 1;
    like an empty --db or --approval it is a usage error naming the argument,
    checked before the database is opened (a missing one is not even looked at)."""
    subs = {"{db}": ops.path, "{missing}": str(tmp_path / "missing.db"),
            "{approval}": ops.approval}
    before = snapshot(ops.path)
    result = invoke("--db", subs[database], *[subs.get(a, a) for a in args])
    assert result.code == 2, result.stderr
    assert result.stderr.splitlines()[0] == (
        "usage: RUN is empty: name the run, as agentrt runs prints it")
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert snapshot(ops.path) == before
    assert not os.path.exists(subs["{missing}"])


def test_a_db_path_with_a_trailing_slash_after_a_file_is_not_called_a_directory(ops):
    """``agentrt --db ops.db/ runs`` with ops.db a regular file said the path
    "names a directory" and suggested ``ops.db/agentrt.db``, which cannot exist
    under a file. It names the file followed by '/', and the fix is the path
    without it."""
    before = snapshot(ops.path)
    result = invoke("--db", ops.path + "/", "runs")
    assert result.code == 1, result.stderr
    assert result.stderr == (
        f"error: agentrt: open store: {ops.path}/ names the file {ops.path} followed by "
        f"'/', which is not a directory: name the database file without the '/', "
        f"{ops.path}\n")
    assert snapshot(ops.path) == before


@pytest.mark.parametrize("kind", ["fifo", "device", "link"])
def test_a_db_path_with_a_slash_after_something_not_a_regular_file_suggests_no_such_fix(
        tmp_path, kind):
    """Dropping the '/' from ``--db /dev/null/`` would be refused in turn (not a
    regular file; a link, which the reader refuses): it is not offered."""
    if kind == "fifo":
        target = str(tmp_path / "pipe")
        os.mkfifo(target)
    elif kind == "device":
        target = "/dev/null"
    else:
        (tmp_path / "real.db").write_bytes(b"")
        target = str(tmp_path / "link.db")
        os.symlink(tmp_path / "real.db", target)
    result = invoke("--db", target + "/", "runs")
    assert result.code == 1
    assert result.stderr == (
        f"error: agentrt: open store: {target}/ names {target} followed by '/', and "
        f"{target} is not a directory: name the database file itself\n")


def test_a_blank_run_argument_names_a_run_as_any_id_does(tmp_path):
    """The spec refuses only an empty run id: a run started as " " is shown."""
    kit = Kit(str(tmp_path / "ops.db"))
    kit.driver([Decision.complete("{}")]).start("g", run_id=" ")
    result = invoke("--db", kit.path, "show", " ")
    assert result.code == 0, result.stderr
    assert "status  COMPLETED" in result.stdout


def test_a_missing_db_path_with_a_trailing_slash_says_it_does_not_exist(tmp_path):
    """``--db nothere/`` with nothing there was said to name a directory; the
    reader says what it says of any missing path (docs/operator.md's table)."""
    missing = str(tmp_path / "nothere") + "/"
    result = invoke("--db", missing, "runs")
    assert result.code == 1, result.stderr
    assert result.stderr == (
        f"error: agentrt: open store: {missing} does not exist; name an existing agentrt "
        "database file\n")
    assert os.listdir(tmp_path) == []


def test_an_oversized_request_is_shown_by_its_identifying_fields_and_decided_whole(tmp_path):
    kit = Kit(str(tmp_path / "big.db"))
    waiting = kit.waiting(args=dumps({"env": "staging", "blob": "x" * 100_000}), history=False)
    approval = kit.store.list_approvals(waiting.id)[0]
    kit.close()
    shown = invoke("--db", kit.path, "show", waiting.id).stdout
    assert "unread  request: 100323 characters, over MaxPageText; its arguments were not read" \
        in shown
    assert "arguments:\n  truncated (4 bytes)\n    true\n  length (6 bytes)\n    100323\n" in shown
    assert max(len(line) for line in shown.splitlines()) < 500
    # Deciding reads the approval whole (the hash covers all of it) and shows it bounded.
    decided = invoke("--db", kit.path, "approve", waiting.id, "--yes")
    assert decided.code == 0, decided.stderr
    assert "  blob (100002 bytes)\n" in decided.stdout and "bytes omitted" in decided.stdout
    assert f"hash    {approval.hash}" in decided.stdout
    assert max(len(line) for line in decided.stdout.splitlines()) < 500


def test_pages_read_at_most_the_page_size_and_stop_at_the_first_total(monkeypatch):
    monkeypatch.setattr(cli_module, "PAGE_SIZE", 3)
    rows = list(range(10))
    asked: list[tuple[int, int]] = []

    def fetch(limit: int, offset: int) -> tuple[list[int], int]:
        rows.append(99)  # a live consumer adds a row before every read
        asked.append((limit, offset))
        return rows[offset:offset + limit], len(rows)

    every = cli_module.Pages(fetch, 0, 2)
    assert list(every) == [2, 3, 4, 5, 6, 7, 8, 9, 99]  # up to the first total, 11
    assert asked == [(3, 2), (3, 5), (3, 8)]
    assert (every.total, every.returned, every.more) == (11, 9, 0)
    asked.clear()
    limited = cli_module.Pages(fetch, 4, 1)
    assert list(limited) == [1, 2, 3, 4]
    assert asked == [(3, 1), (1, 4)]
    assert limited.more == limited.total - 1 - 4


def test_a_decision_while_another_connection_holds_the_write_lock_is_refused(ops, monkeypatch):
    """The busy timeout passes, nothing is decided, and the sentence says why. (Its
    default of 5 s, which only makes this test slow, is pinned in test_store_open.)"""
    monkeypatch.setattr(opening, "BUSY_TIMEOUT_MS", 200)
    other = apsw.Connection(ops.path)
    other.execute("BEGIN IMMEDIATE")
    try:
        result = run(ops, "approve", ops.waiting, "--yes")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert result.code == 1
    assert result.stderr == (
        f"error: {ops.path}: another connection held the write lock for the whole busy "
        "timeout; nothing was decided, try again: database is locked by another consumer\n")
    assert ops.kit.store.get_approval(ops.waiting, ops.approval).status == "pending"


def test_show_reports_model_use_from_the_run_row(ops):
    with ops.kit.store.tx() as tx:
        tx.execute("UPDATE runs SET model_calls = 2, input_tokens = 1200, output_tokens = 300, "
                   "estimated_cost_micros = 4500 WHERE id = ?", (ops.done,))
    lines = run(ops, "show", ops.done).stdout.splitlines()
    assert lines[5] == "model   2 call(s), 1200 in, 300 out, estimated $0.0045"
    assert not any(line.startswith("model ") for line in run(ops, "show", ops.waiting)
                   .stdout.splitlines())


def test_an_error_quoting_the_database_is_sanitized(ops):
    with ops.kit.store.tx() as tx:
        _copy_approval(tx, ops, "evil\x1b[31m\u202e")
    result = run(ops, "approve", ops.waiting, "--yes")
    assert result.code == 1
    assert "\x1b" not in result.stderr and "\u202e" not in result.stderr
    assert "evil\\x1b[31m\\u{202e}: more than one pending approval" in result.stderr


def test_an_id_echoed_in_an_error_is_cut_to_80_characters(ops):
    """A 100,000-character id typed (or stored) is quoted by its head and its length."""
    long_run = "r" * 100_000
    cut = "r" * 80 + "…(100000 characters)"
    for args in (["show", long_run], ["events", long_run], ["cancel", long_run],
                 ["approve", long_run, "--yes"], ["reject", long_run, "--yes"]):
        result = run(ops, *args)
        assert result.code == 1
        assert result.stderr == f"error: agentrt: not found: run {cut}\n", args
    evil = "\x1b" * 100_000
    result = run(ops, "approve", ops.waiting, "--approval", evil)
    assert result.code == 1
    assert result.stderr == ("error: agentrt: not found: approval " + "\\x1b" * 80
                             + f"…(100000 characters) of run {ops.waiting}\n")
    # Ids from the database, listed to choose from, are cut too.
    stored = "a" * 100_000
    with ops.kit.store.tx() as tx:
        _copy_approval(tx, ops, stored)
    vague = run(ops, "approve", ops.waiting, "--yes")
    assert vague.code == 1 and len(vague.stderr) < 400
    assert f"name one of {ops.approval}, {'a' * 80}…(" in vague.stderr
    named = run(ops, "approve", ops.waiting, "--approval", stored)
    assert named.code == 0, named.stderr
    again = run(ops, "approve", ops.waiting, "--approval", stored)
    assert again.code == 1
    assert again.stderr == (f"error: approval {'a' * 80}…(100000 characters) is approved: "
                            "approval is not pending\n")


def test_read_commands_open_read_only_and_decisions_read_write(ops, monkeypatch):
    opened: list[bool] = []
    real = cli_module.open_existing

    def recording(path, read_only=True):
        opened.append(read_only)
        return real(path, read_only=read_only)

    monkeypatch.setattr(cli_module, "open_existing", recording)
    for args in (["runs"], ["show", ops.waiting], ["events", ops.waiting], ["verify"]):
        assert run(ops, *args).code == 0
    assert opened == [True, True, True, True]
    assert run(ops, "cancel", ops.waiting, "--note", "stop").code == 0
    assert opened[-1] is False


def test_runs_cuts_a_long_goal_to_sixty_bytes_and_show_a_long_field_to_4000(tmp_path):
    kit = Kit(str(tmp_path / "long.db"))
    goal = "deploy " + "é" * 3000
    run_ = kit.completed(goal=goal)
    listed = invoke("--db", kit.path, "runs").stdout
    cell = listed.splitlines()[1].split("  ")[-1].strip()
    assert cell.endswith("…")
    head = cell[:-1]
    assert goal.startswith(head) and 58 <= len(head.encode()) <= 60
    shown = invoke("--db", kit.path, "show", run_.id).stdout
    goal_line = next(line for line in shown.splitlines() if line.startswith("goal"))
    head, marker = goal_line[len("goal    "):].split("...[")
    assert goal.startswith(head) and 3998 <= len(head.encode()) <= 4000
    assert marker == f"{len(goal.encode()) - len(head.encode())} more bytes]"
    kit.close()


@pytest.mark.parametrize(("column", "value"), [
    ("status", "WEIRD"), ("created_at", "garbage"), ("limits_json", "{")])
@pytest.mark.parametrize("command", ["cancel", "approve"])
def test_a_decision_on_a_damaged_run_row_is_one_sentence_and_changes_nothing(
        ops, column, value, command):
    conn = apsw.Connection(ops.path)
    conn.execute(f"UPDATE runs SET {column} = ? WHERE id = ?", (value, ops.waiting))
    conn.close()
    before = snapshot(ops.path)
    args = ("--approval", ops.approval, "--yes") if command == "approve" else ()
    result = invoke("--db", ops.path, command, ops.waiting, *args, "--by", "op")
    assert result.code == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    if (command, column) == ("approve", "status"):  # read as a run not waiting
        assert "is WEIRD, not waiting for approval" in result.stderr
    else:
        assert "does not decode" in result.stderr and "nothing was changed" in result.stderr
    assert snapshot(ops.path) == before


@pytest.mark.parametrize(("column", "value", "named"), [
    ("expires_at", "garbage", "expires_at: time 'garbage' is not RFC 3339"),
    ("created_at", "garbage", "created_at: time 'garbage' is not RFC 3339"),
    ("request_json", "{", "request: ")])
@pytest.mark.parametrize("command", ["approve", "reject"])
def test_a_decision_on_a_damaged_approval_names_the_column_and_changes_nothing(
        ops, column, value, named, command):
    conn = apsw.Connection(ops.path)
    conn.execute(f"UPDATE approvals SET {column} = ? WHERE id = ?", (value, ops.approval))
    conn.close()
    before = snapshot(ops.path)
    args = ("--yes",) if command == "approve" else ()
    result = invoke("--db", ops.path, command, ops.waiting, "--approval", ops.approval, *args,
                    "--by", "op")
    assert result.code == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert f"approval {ops.approval} does not decode: {named}" in result.stderr
    assert snapshot(ops.path) == before


def test_show_pages_pending_approvals_after_the_last_shown_so_one_decided_meanwhile_skips_none(
        ops, monkeypatch):
    """With more pending approvals than a page, one decided between two reads
    moves every later one up a place: read by offset, the next page would start
    one too far and skip an approval nobody decided."""
    monkeypatch.setattr(cli_module, "PAGE_SIZE", 3)
    copy = ("INSERT INTO approvals (id, run_id, step_id, kind, capability_json, "
            "presentation_json, request_json, hash, status, created_at) "
            "SELECT ?, run_id, step_id, kind, capability_json, presentation_json, "
            "request_json, hash, status, created_at FROM approvals WHERE id = ?")
    names = [f"extra{i}" for i in range(6)]
    with ops.kit.store.tx() as tx:
        for name in names:
            tx.execute(copy, (name, ops.approval))
    shown_ids = [ops.approval, *names]
    real = Store.list_approvals_page
    reads = []

    def decided_between_pages(self, run_id, status, limit, offset, **kw):
        if offset or kw:  # a later page: the first was shown; its first one is decided
            reads.append((offset, kw))
            with ops.kit.store.tx() as tx:
                tx.execute("UPDATE approvals SET status = 'approved' WHERE id = ?",
                           (ops.approval,))
        return real(self, run_id, status, limit, offset, **kw)

    monkeypatch.setattr(Store, "list_approvals_page", decided_between_pages)
    out = run(ops, "show", ops.waiting).stdout
    listed = [line.split()[2] for line in out.splitlines()
              if line.startswith("APPROVAL WAITING ")]
    assert listed == shown_ids
    assert reads == [(3, {"after_id": "extra1"}), (6, {"after_id": "extra4"})]


@pytest.mark.parametrize("odd", ["blob", "null", "long"])
def test_show_pages_pending_approvals_whose_ids_do_not_read_back_as_stored_by_offset(
        ops, monkeypatch, odd):
    """An id a page read turns into text (a BLOB), '' (NULL) or cuts (over the
    cap) names no row to start the next page after: that page is read by its
    offset, as before keyset paging (which had lost every later approval)."""
    monkeypatch.setattr(cli_module, "PAGE_SIZE", 1)
    odd_id = {"blob": "CAST('second' AS BLOB)", "null": "NULL",
              "long": f"'{'L' * 70_000}'"}[odd]
    columns = ("run_id, step_id, kind, capability_json, presentation_json, request_json, "
               "hash, status, created_at")
    with ops.kit.store.tx() as tx:
        tx.execute(f"INSERT INTO approvals (id, {columns}) SELECT {odd_id}, {columns} "
                   "FROM approvals WHERE id = ?", (ops.approval,))
        tx.execute(f"INSERT INTO approvals (id, {columns}) SELECT 'third', {columns} "
                   "FROM approvals WHERE id = ?", (ops.approval,))
    out = run(ops, "show", ops.waiting).stdout
    listed = [line.split("  ", 1)[1][:12] for line in out.splitlines()
              if line.startswith("APPROVAL WAITING ")]
    assert len(listed) == 3 and listed[0] == ops.approval[:12] and listed[2] == "third"


@pytest.mark.parametrize(("odd", "twin"), [("CAST('dup' AS BLOB)", "'dup'"), ("NULL", "''")],
                         ids=["blob-and-text", "null-and-empty"])
def test_show_pages_past_an_id_that_reads_back_as_another_approvals_id_by_offset(
        ops, monkeypatch, odd, twin):
    """A BLOB id reads back as its text and a NULL one as '': with a stored
    text twin, the next page started after the twin, and every approval
    between the two was never shown."""
    monkeypatch.setattr(cli_module, "PAGE_SIZE", 1)
    columns = ("run_id, step_id, kind, capability_json, presentation_json, request_json, "
               "hash, status, created_at")
    with ops.kit.store.tx() as tx:
        for ident in (odd, "'between1'", "'between2'", twin, "'after'"):
            tx.execute(f"INSERT INTO approvals (id, {columns}) SELECT {ident}, {columns} "
                       "FROM approvals WHERE id = ?", (ops.approval,))
    out = run(ops, "show", ops.waiting).stdout
    listed = [line.split("  ", 1)[1].strip()[:12] for line in out.splitlines()
              if line.startswith("APPROVAL WAITING ")]
    assert len(listed) == 6 and listed[2:4] == ["between1", "between2"], listed

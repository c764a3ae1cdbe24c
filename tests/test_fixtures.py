"""The export fixtures: made by real drivers, reproducible, and mapped to their goldens.

`fixtures/runs.db` is what the driver wrote through the reference's fixture
runs (spec export.md section 4); `fixtures/runs.jsonl` and
`fixtures/spans.json` are what the exporters make of it. Every test reads a
private copy of the database. When a golden test fails because the runtime or
an exporter deliberately changed what it writes, run `make fixtures` and
review the diff.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fixtures_kit import (
    DB,
    GOLDEN_FILES,
    JSONL,
    SPANS,
    STALE,
    copy_fixture,
    digest,
    distinct,
    golden_spans,
    to_ns,
)
from eventdb import REPO_ROOT, child_env

from agentrt.events import ALL_EVENT_TYPES, Event
from agentrt.store import Store, open_existing
from agentrt_otel import SpanMapper, span_id_hex, trace_id_hex
from fixtures.golden import jsonl_bytes, record_dict, span_records, spans_json
from fixtures.scenarios import RUN_IDS


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    return copy_fixture(tmp_path_factory.mktemp("fixture"))


@pytest.fixture(scope="module")
def store(db: str) -> Iterator[Store]:
    with open_existing(db, read_only=True) as s:
        yield s


@pytest.fixture(scope="module")
def events(store: Store) -> list[Event]:
    return store.list_events_after("", 0, 10_000)


def types(store: Store, run_id: str) -> list[str]:
    return [e.type for e in store.list_events(run_id)]


def payloads(store: Store, run_id: str, type_: str) -> list[dict]:
    return [json.loads(e.payload) for e in store.list_events(run_id) if e.type == type_]


# -- regeneration -------------------------------------------------------------------


def generate(outdir: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "fixtures.generate", str(outdir)],
                          capture_output=True, env=child_env(), cwd=REPO_ROOT, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr.decode()


def test_regenerating_gives_byte_identical_files(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    generate(first)
    generate(second)
    for golden in GOLDEN_FILES:
        a, b = first / golden.name, second / golden.name
        assert a.read_bytes() == b.read_bytes(), f"{golden.name} differs between two runs"
    assert stat.S_IMODE(os.stat(first / "runs.db").st_mode) == 0o600
    assert sorted(os.listdir(first)) == sorted(g.name for g in GOLDEN_FILES)  # no -wal, -shm
    for golden in GOLDEN_FILES:
        assert (first / golden.name).read_bytes() == golden.read_bytes(), (
            f"fixtures/{golden.name}: {STALE}")


def test_the_database_is_a_rollback_journal_file_with_fixed_migration_times(store: Store) -> None:
    header = DB.read_bytes()[:20]
    assert header[:16] == b"SQLite format 3\x00"
    assert header[18:20] == b"\x01\x01", "not WAL: a read-only open creates no -wal or -shm"
    rows = store.db().execute("SELECT version, applied_at FROM schema_migrations").fetchall()
    assert rows == [(v, "2026-10-01T09:00:00Z") for v in range(1, 7)]
    leased = store.db().execute("SELECT count(*) FROM runs WHERE lease_owner != ''").fetchone()
    assert leased == (0,)


def test_a_copy_with_a_checkouts_mode_opens_read_only_and_stays_unchanged(tmp_path: Path) -> None:
    path = copy_fixture(tmp_path)
    os.chmod(path, 0o644)  # what a git checkout gives it
    with open_existing(path, read_only=True) as s:
        assert s.chain_head()[0] == 111
    assert digest(Path(path)) == digest(DB)
    assert sorted(os.listdir(tmp_path)) == ["runs.db"]


# -- what the runs wrote ------------------------------------------------------------


def test_every_event_type_appears_and_a_tool_finishes_late(events: list[Event]) -> None:
    assert set(ALL_EVENT_TYPES) == {e.type for e in events}
    assert len(ALL_EVENT_TYPES) == 19
    late = [e for e in events if e.type == "step.tool_finished"
            and json.loads(e.payload).get("late") is True]
    assert [e.run_id for e in late] == ["cancelled-run"]


def test_the_chain_verifies_from_the_first_event_to_the_last(store: Store,
                                                            events: list[Event]) -> None:
    report = store.verify_events()
    assert report.broken is None
    assert (report.from_seq, report.to_seq, report.checked) == (1, len(events), len(events))
    assert store.chain_head() == (report.to_seq, report.hash)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


@pytest.mark.parametrize(("run_id", "status", "reason", "steps"), [
    ("paused-run", "COMPLETED", "goal_completed", 3),
    ("completed-run", "COMPLETED", "goal_completed", 5),
    ("interrupted-run", "COMPLETED", "goal_completed", 2),
    ("cancelled-run", "CANCELLED", "operator_cancelled", 1),
    ("model-run", "COMPLETED", "goal_completed", 2),
    ("limit-run", "FAILED", "limit_steps", 1),
    ("loop-run", "FAILED", "loop_detected", 2),
    ("failed-run", "FAILED", "goal_failed", 1),
])
def test_runs_end_in_the_reference_statuses_and_reasons(store: Store, run_id: str, status: str,
                                                        reason: str, steps: int) -> None:
    run = store.get_run(run_id)
    assert (run.status, run.reason, run.step_count) == (status, reason, steps)
    assert types(store, run_id)[:2] == ["run.created", "run.started"]
    assert run_id in RUN_IDS


def test_the_runs_interleave_as_concurrent_runs_do(events: list[Event]) -> None:
    order = list(dict.fromkeys(e.run_id for e in events))
    assert order == list(RUN_IDS)
    # The paused and the interrupted run are still open while later runs start and end.
    last = {e.run_id: e.seq for e in events}
    first = {e.run_id: e.seq for e in reversed(events)}
    assert first["model-run"] < last["paused-run"]
    assert last["model-run"] < last["interrupted-run"]


def test_the_completed_run_has_an_invalid_decision_and_a_denial(store: Store) -> None:
    run = store.get_run("completed-run")
    assert run.goal == "g" * 3000 and run.limits.max_steps == 10
    steps = store.list_steps("completed-run")
    assert [(s.status, s.observation.kind if s.observation else None) for s in steps] == [
        ("done", "tool_result"), ("failed", "invalid_decision"), ("failed", "policy_denied"),
        ("done", "tool_result"), ("done", None)]
    assert steps[0].decision.reason == "because " * 400
    assert [p["args"] for p in payloads(store, "completed-run", "step.tool_started")] == [
        {"n": 1}, {"n": 2}]  # write and wipe never ran
    assert json.loads(store.get_run("completed-run").result) == {"done": True}


def test_the_paused_run_was_approved_by_the_operator_and_ran_publish_once(store: Store) -> None:
    (approval,) = store.list_approvals("paused-run")
    assert (approval.kind, approval.status, approval.decided_by, approval.note) == (
        "remote_mutation", "approved", "operator", "looks right")
    seq = types(store, "paused-run")
    assert seq.count("approval.requested") == seq.count("approval.decided") == 1
    assert seq.count("run.resumed") == 1
    assert [p["tool"] for p in payloads(store, "paused-run", "step.tool_finished")] == [
        "read", "publish"]


def test_the_interrupted_run_has_the_reference_18_events_after_a_real_process_died(
        store: Store) -> None:
    assert types(store, "interrupted-run") == [
        "run.created", "run.started", "step.started", "step.decided", "step.policy",
        "step.tool_started", "lease.taken_over", "step.interrupted", "step.policy",
        "approval.requested", "approval.decided", "run.resumed", "step.policy",
        "step.tool_started", "step.tool_finished", "step.started", "step.decided",
        "run.finished"]
    (taken,) = payloads(store, "interrupted-run", "lease.taken_over")
    assert taken == {"owner": "resumer/000000000000",
                     "previous_expires_at": "2026-10-01T09:02:01Z",
                     "previous_owner": "crasher/000000000000"}
    (interrupted,) = payloads(store, "interrupted-run", "step.interrupted")
    assert interrupted == {"previous_status": {"previous_status": "executing"}}
    (approval,) = store.list_approvals("interrupted-run")
    assert (approval.kind, approval.status, approval.decided_by, approval.note) == (
        "interrupted_side_effect", "approved", "operator", "run it again")
    # Written by the child up to the tool, then by the resumer: one tool outcome.
    events = store.list_events("interrupted-run")
    assert {e.step_id for e in events[2:6]} == {"interrupted-crasher-1"}
    assert [p["summary"] for p in payloads(store, "interrupted-run", "step.tool_finished")] == [
        "write done"]


def test_the_cancelled_runs_tool_result_is_appended_after_run_finished(store: Store) -> None:
    assert types(store, "cancelled-run")[-2:] == ["run.finished", "step.tool_finished"]
    (finished,) = payloads(store, "cancelled-run", "run.finished")
    assert (finished["by"], finished["detail"]) == ("operator", "changed my mind")
    (late,) = payloads(store, "cancelled-run", "step.tool_finished")
    assert (late["late"], late["tool"], late["summary"]) == (True, "block",
                                                             "finished after cancel")


def test_the_model_runs_first_call_got_a_429_and_the_retry_succeeded(store: Store) -> None:
    calls = store.list_model_calls("model-run")
    steps = store.list_steps("model-run")
    assert [(c.step_id, c.attempt, c.status) for c in calls] == [
        (steps[0].id, 1, "error"), (steps[0].id, 2, "ok"), (steps[1].id, 1, "ok")]
    assert "429" in calls[0].error
    assert sum(c.cost_micros for c in calls if c.step_id == steps[0].id) == 200
    run = store.get_run("model-run")
    assert (run.model_calls, run.usage.input_tokens, run.usage.cached_input_tokens) == (3, 220, 50)
    assert steps[0].decision.origin == "" and steps[0].decision.args == b'{"n":7}'


def test_limit_loop_and_fail_record_why_they_stopped(store: Store) -> None:
    assert payloads(store, "limit-run", "limit.exceeded") == [
        {"detail": "step limit 1 reached", "reason": "limit_steps"}]
    (loop,) = payloads(store, "loop-run", "loop.detected")
    assert (loop["repeats"], loop["tool"]) == (2, "read")
    assert store.get_run("failed-run").reason_detail == "no " * 1000
    (decided,) = payloads(store, "failed-run", "step.decided")
    assert (decided["kind"], decided["message"]) == ("fail", "no " * 1000)


# -- the goldens ------------------------------------------------------------------------


def test_the_jsonl_golden_is_what_the_follower_and_sink_write(db: str) -> None:
    assert jsonl_bytes(db) == JSONL.read_bytes(), f"fixtures/runs.jsonl: {STALE}"


def test_the_spans_golden_is_what_agentrt_otel_maps_in_one_pass(db: str) -> None:
    assert spans_json(span_records(db)) == SPANS.read_bytes(), f"fixtures/spans.json: {STALE}"


def test_every_event_type_has_a_specific_otel_mapping(events: list[Event], store: Store) -> None:
    mapper = SpanMapper(store)
    assert mapper.handled_types == frozenset(ALL_EVENT_TYPES)
    for event in events:
        spans = mapper.map(event)
        assert "agentrt.event" not in {s.name for s in spans}, event.type
    assert "agentrt.event" not in {s["name"] for s in golden_spans()}


def test_the_golden_spans_have_the_reference_shape() -> None:
    spans = golden_spans()
    by_run: dict[str, Counter[str]] = {}
    for s in spans:
        run_id = s["attributes"]["agentrt.run.id"]
        assert s["trace_id"] == trace_id_hex(run_id)
        by_run.setdefault(run_id, Counter())[s["name"]] += 1
    assert by_run == {
        "paused-run": Counter({"agentrt.run": 1, "agentrt.step": 3, "agentrt.approval": 1}),
        "completed-run": Counter({"agentrt.run": 1, "agentrt.step": 5}),
        "interrupted-run": Counter({"agentrt.run": 1, "agentrt.step": 2,
                                    "agentrt.approval": 1}),
        "cancelled-run": Counter({"agentrt.run": 1, "agentrt.step": 1, "agentrt.tool.late": 1}),
        "model-run": Counter({"agentrt.run": 1, "agentrt.step": 2, "agentrt.model": 3}),
        "limit-run": Counter({"agentrt.run": 1, "agentrt.step": 1}),
        "loop-run": Counter({"agentrt.run": 1, "agentrt.step": 2}),
        "failed-run": Counter({"agentrt.run": 1, "agentrt.step": 1}),
    }
    # TestExporter_DecisionOrigin: the reference's fixture agents set no origin.
    assert not [s for s in spans if "agentrt.decision.origin" in s["attributes"]]
    runs = {s["attributes"]["agentrt.run.id"]: s for s in spans if s["name"] == "agentrt.run"}
    for run_id, s in runs.items():
        assert s["span_id"] == span_id_hex("run", run_id) and s["parent_span_id"] is None
    assert {r: (s["status"], s["attributes"]["agentrt.run.reason"]) for r, s in runs.items()} == {
        "paused-run": ("OK", "goal_completed"),
        "completed-run": ("OK", "goal_completed"),
        "interrupted-run": ("OK", "goal_completed"),
        "cancelled-run": ("UNSET", "operator_cancelled"),
        "model-run": ("OK", "goal_completed"),
        "limit-run": ("ERROR", "limit_steps"),
        "loop-run": ("ERROR", "loop_detected"),
        "failed-run": ("ERROR", "goal_failed"),
    }
    (late,) = [s for s in spans if s["name"] == "agentrt.tool.late"]
    step = "cancelled-1"
    assert (late["span_id"], late["parent_span_id"]) == (span_id_hex("late", step),
                                                          span_id_hex("step", step))
    assert to_ns(late["end"]) > to_ns(runs["cancelled-run"]["end"])
    interrupted = [s for s in spans if s["attributes"]["agentrt.run.id"] == "interrupted-run"
                   and s["name"] == "agentrt.step"]
    assert "step.interrupted" in [e["name"] for e in interrupted[0]["events"]]
    models = [s for s in spans if s["name"] == "agentrt.model"]
    assert [(s["kind"], s["status"]) for s in models] == [
        ("CLIENT", "ERROR"), ("CLIENT", "UNSET"), ("CLIENT", "UNSET")]


def restarted(store: Store, events: list[Event], cuts: list[int]) -> list[dict]:
    """The spans of a fresh mapper (with the store as source) per segment,
    each starting after a cut, as exporters restarted on a saved cursor."""
    bounds = [0, *cuts, len(events)]
    out = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        out.extend(record_dict(s) for s in SpanMapper(store).map_all(events[lo:hi]))
    return out


def test_any_split_of_the_stream_gives_exactly_the_golden_spans(
        events: list[Event], store: Store) -> None:
    """An exporter restarted after event k (a fresh mapper with the store as
    source) makes every golden span once, equal to it in every field: the
    runs it meets in the middle are rebuilt by replaying their events."""
    golden = golden_spans()
    for k in range(1, len(events)):
        got = restarted(store, events, [k])
        assert len(got) == len(golden), k
        assert distinct(got) == golden, k


def test_a_restart_after_every_event_gives_exactly_the_golden_spans(
        events: list[Event], store: Store) -> None:
    got = restarted(store, events, list(range(1, len(events))))
    assert len(got) == len(golden_spans())
    assert distinct(got) == golden_spans()


def test_generating_into_a_path_that_is_a_file_says_so_in_one_sentence(tmp_path: Path) -> None:
    target = tmp_path / "runs.db"
    target.write_bytes(b"not a directory")
    done = subprocess.run([sys.executable, "-m", "fixtures.generate", str(target)],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                          env=child_env())
    assert done.returncode == 1
    assert done.stderr.startswith(f"fixtures: cannot write into {target}: ")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert target.read_bytes() == b"not a directory"


def test_generating_into_a_directory_sqlite_cannot_write_says_so_in_one_sentence() -> None:
    """/proc/self is a directory nothing can be created in, even by root."""
    done = subprocess.run([sys.executable, "-m", "fixtures.generate", "/proc/self"],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                          env=child_env())
    assert done.returncode == 1
    assert done.stderr.startswith("fixtures: cannot write into /proc/self: ")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_generating_with_a_temporary_directory_sqlite_refuses_says_so_in_one_sentence(
        tmp_path: Path) -> None:
    """A TMPDIR too long for SQLite: open_store refuses the scratch database."""
    scratch = str(tmp_path / "tmp")
    while len(scratch) < 480:
        scratch = os.path.join(scratch, "d" * 100)
    os.makedirs(scratch)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "fixtures.generate", str(out)],
                          capture_output=True, text=True, timeout=180, cwd=REPO_ROOT,
                          env=dict(child_env(), TMPDIR=scratch))
    assert done.returncode == 1
    assert done.stderr.startswith(f"fixtures: cannot write into {out}: ")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not out.exists()  # made by this run, and empty again: removed


def _generate(*args: str, cwd: str = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fixtures.generate", *args],
                          capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=dict(child_env(), PYTHONPATH=REPO_ROOT))


# 64 KiB has no room for runs.db; 160 KiB has room for runs.db (144 KiB), not runs.jsonl.
@pytest.mark.parametrize("size", ["64k", "160k"])
def test_generating_onto_a_full_file_system_leaves_nothing_half_written(tmp_path: Path,
                                                                        size: str) -> None:
    from store_helpers import tmpfs_mount

    mount = tmp_path / "small"
    mount.mkdir()
    with tmpfs_mount(str(mount), size=size):
        out = mount / "out"
        done = _generate(str(out))
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert not out.exists(), sorted(os.listdir(out))


def test_a_generation_that_cannot_put_a_golden_in_place_changes_no_file_and_names_it(
        tmp_path: Path) -> None:
    """The set is replaced only once all three are staged: a spans.json that
    is a directory leaves the previous runs.db and runs.jsonl as they were."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "runs.db").write_bytes(b"the previous database")
    (out / "runs.jsonl").write_bytes(b"the previous golden\n")
    (out / "spans.json").mkdir()
    done = _generate(str(out))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr == (f"fixtures: cannot write {out / 'spans.json'}: Is a directory; "
                           "move it away, or name another directory\n")
    assert (out / "runs.db").read_bytes() == b"the previous database"
    assert (out / "runs.jsonl").read_bytes() == b"the previous golden\n"
    assert sorted(os.listdir(out)) == ["runs.db", "runs.jsonl", "spans.json"]


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_generate_help_prints_its_usage_and_writes_nothing(tmp_path: Path, flag: str) -> None:
    done = _generate(flag, cwd=str(tmp_path))
    assert (done.returncode, done.stdout) == (0, "usage: python -m fixtures.generate OUTDIR\n")
    assert os.listdir(tmp_path) == []


def test_generate_refuses_an_option_as_usage_and_writes_nothing(tmp_path: Path) -> None:
    done = _generate("--out", cwd=str(tmp_path))
    assert done.returncode == 2
    assert done.stderr == ("fixtures: no option --out; name the output directory "
                           "(./--out for a directory of that name)\n"
                           "usage: python -m fixtures.generate OUTDIR\n")
    assert os.listdir(tmp_path) == []


def _generate_with_a_refused_temporary_directory(tmp_path: Path, out: Path) -> (
        subprocess.CompletedProcess[str]):
    scratch = str(tmp_path / "tmp")
    while len(scratch) < 480:  # too long for SQLite: open_store refuses the scratch db
        scratch = os.path.join(scratch, "d" * 100)
    os.makedirs(scratch, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "fixtures.generate", str(out)],
                          capture_output=True, text=True, timeout=180, cwd=REPO_ROOT,
                          env=dict(child_env(), TMPDIR=scratch))


def test_a_failed_generation_leaves_no_staged_file(tmp_path: Path) -> None:
    """The staged names are the generator's own, which it overwrites: one a
    killed generation left is gone after a failed one too."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "spans.json.tmp").write_text("a killed generation's file\n")
    assert _generate_with_a_refused_temporary_directory(tmp_path, out).returncode == 1
    assert sorted(os.listdir(out)) == []


def test_a_failed_generation_removes_every_directory_it_created(tmp_path: Path) -> None:
    out = tmp_path / "new" / "deeper" / "out"
    assert _generate_with_a_refused_temporary_directory(tmp_path, out).returncode == 1
    assert not (tmp_path / "new").exists()


def test_no_test_opens_the_committed_database_but_through_a_private_copy() -> None:
    """A checkout made under umask 002 gives fixtures/runs.db mode 0664, which the
    read-only opener refuses: a test opening it in place failed there. Every
    test module but this one (which only hashes and reads its bytes) takes it
    through ``copy_fixture``, never ``DB`` itself."""
    import ast

    tests = Path(REPO_ROOT) / "tests"
    importing_db = []
    for path in sorted(tests.glob("*.py")):
        if path.name in ("_fixtures_kit.py", Path(__file__).name):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ImportFrom) and node.module == "_fixtures_kit"
                    and any(alias.name in ("DB", "FIXTURES", "GOLDEN_FILES")
                            for alias in node.names)):
                importing_db.append(path.name)
    assert importing_db == []


def test_a_generation_that_cannot_stage_a_file_names_the_staged_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "runs.jsonl.tmp").mkdir(parents=True)  # left by someone: the staged name
    done = _generate(str(out))
    assert done.returncode == 1
    assert done.stderr.startswith(f"fixtures: cannot write {out / 'runs.jsonl.tmp'}: ")
    assert sorted(os.listdir(out)) == ["runs.jsonl.tmp"]


def test_a_staged_name_left_as_a_symlink_is_replaced_not_written_through(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"someone's notes\n")
    os.symlink(notes, out / "runs.jsonl.tmp")
    done = _generate(str(out))
    assert done.returncode == 0, done.stderr
    assert notes.read_bytes() == b"someone's notes\n"
    assert not os.path.islink(out / "runs.jsonl")
    assert (out / "runs.jsonl").read_bytes() == JSONL.read_bytes()


@pytest.mark.parametrize("args", [["--help", "out"], ["-h", "out"], ["out", "more"]])
def test_generate_with_help_or_two_paths_prints_only_the_usage(tmp_path: Path,
                                                               args: list[str]) -> None:
    done = _generate(*args, cwd=str(tmp_path))
    assert (done.returncode, done.stderr) == (2, "usage: python -m fixtures.generate OUTDIR\n")
    assert os.listdir(tmp_path) == []


def test_generate_takes_a_directory_named_like_an_option_after_a_double_dash(
        tmp_path: Path) -> None:
    done = _generate("--", "-out", cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(tmp_path / "-out")) == ["runs.db", "runs.jsonl", "spans.json"]

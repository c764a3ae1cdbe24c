"""The ``agentrt`` command as a real process: exit codes, AGENTRT_DB, a real terminal,
a closed pipe, and bounded memory on a huge database."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import apsw
import pytest
from _cli_kit import HUGE_GOAL_CHARS, Kit, child_env, make_runs_db, run_child, snapshot

from agentrt.gojson import dumps
from agentrt.records import approval_hash
from agentrt.store import open_store

MB = 1024 * 1024


@pytest.fixture
def ops(tmp_path):
    kit = Kit(str(tmp_path / "ops.db"))
    done = kit.completed()
    waiting = kit.waiting()
    approval = kit.store.list_approvals(waiting.id)[0]
    kit.close()
    return {"db": kit.path, "waiting": waiting.id, "approval": approval.id, "done": done.id,
            "missing": str(tmp_path / "missing.db")}


def test_runs_reads_the_database_from_the_environment(ops):
    result = run_child("runs", "--json", env=child_env(AGENTRT_DB=ops["db"]))
    assert result.code == 0, result.stderr
    assert [r["id"] for r in json.loads(result.stdout)["runs"]] == [ops["waiting"], ops["done"]]
    missing = run_child("runs", env=child_env(AGENTRT_DB=ops["missing"]))
    assert missing.code == 1 and b"does not exist" in missing.stderr


def _prepare(kind: str, ops: dict, tmp_path) -> None:
    if kind == "insecure":
        os.chmod(ops["db"], 0o664)
    elif kind == "symlink":
        os.symlink(ops["db"], str(tmp_path / "link.db"))
    elif kind in ("trigger", "schema"):
        conn = apsw.Connection(ops["db"])
        if kind == "trigger":
            conn.execute("CREATE TRIGGER t AFTER INSERT ON runs BEGIN SELECT 1; END")
        else:
            conn.execute("INSERT INTO schema_migrations VALUES (7, '2030-01-01T00:00:00Z')")
        conn.close()


@pytest.mark.parametrize(("kind", "args", "code", "message"), [
    ("none", [], 2, b"Commands:"),
    ("none", ["help"], 0, b""),
    ("none", ["runs"], 2, b"usage: no database: pass --db or set AGENTRT_DB"),
    ("none", ["--db", "{missing}", "runs"], 1, b"does not exist"),
    ("insecure", ["--db", "{db}", "runs"], 1, b"writable by group or others"),
    ("symlink", ["--db", "{link}", "runs"], 1, b"is a symbolic link"),
    ("trigger", ["--db", "{db}", "show", "{waiting}"], 1, b'has trigger "t"'),
    ("schema", ["--db", "{db}", "events", "{waiting}"], 1, b"newer than this build of agentrt"),
    ("none", ["--db", "{db}", "show", "nope"], 1, b"not found: run nope"),
    ("none", ["--db", "{db}", "cancel", "{done}"], 1, b"run is already finished"),
    ("none", ["--db", "{db}", "approve", "{done}", "--yes"], 1, b"not waiting for approval"),
    ("none", ["--db", "{db}", "verify", "--head", "nonsense"], 2, b"is not SEQ:HASH"),
    ("none", ["--db", "{db}", "runs", "--limit", "x"], 2, b"Invalid value for '--limit'"),
    ("none", ["resume", "{waiting}"], 2, b"there is no resume command"),
])
def test_exit_codes_through_a_real_process(ops, tmp_path, kind, args, code, message):
    _prepare(kind, ops, tmp_path)
    subs = {"{db}": ops["db"], "{missing}": ops["missing"], "{waiting}": ops["waiting"],
            "{done}": ops["done"], "{link}": str(tmp_path / "link.db")}
    before = snapshot(ops["db"])
    result = run_child(*[subs.get(a, a) for a in args])
    assert result.code == code, result.stderr
    assert message in (result.stderr if code else result.stdout)
    assert b"Traceback" not in result.stderr
    if code == 1:
        assert result.stderr.startswith(b"error: ") and result.stderr.count(b"\n") == 1
    if code:
        assert result.stdout == b""
    assert snapshot(ops["db"]) == before


def test_a_decision_without_consent_in_a_script_is_usage_and_changes_nothing(ops):
    before = snapshot(ops["db"])
    result = run_child("--db", ops["db"], "approve", ops["waiting"])  # stdin is /dev/null
    assert result.code == 2
    assert result.stderr.startswith(b"usage: approve: refusing without --approval, --yes")
    assert snapshot(ops["db"]) == before


# -- a real terminal -------------------------------------------------------------------


def _at_a_terminal(args: list[str]) -> tuple[subprocess.Popen, int]:
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "agentrt.cli", *args], stdin=slave,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
    os.close(slave)
    return proc, master


def _wait_for(stream, marker: bytes, timeout: float = 30.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    fd = stream.fileno()
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} in {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            assert chunk, f"stream ended before {marker!r}: {seen!r}"
            seen += chunk
    return seen


def test_a_terminal_is_asked_and_yes_decides(ops):
    proc, master = _at_a_terminal(["--db", ops["db"], "approve", ops["waiting"], "--by", "ops"])
    try:
        prompt = _wait_for(proc.stderr, b"[y/N] ")
        question = f"approve approval {ops['approval']} of run {ops['waiting']}? [y/N] "
        assert prompt == question.encode()
        os.write(master, b"y\n")
        out, err = proc.communicate(timeout=30)
    finally:
        os.close(master)
    assert proc.returncode == 0, err
    assert out.startswith(f"APPROVAL WAITING  {ops['approval']}".encode())
    assert f"approval {ops['approval']}: approved by ops".encode() in out
    assert b"approval.decided" in err


def test_an_approval_changed_while_the_terminal_asks_is_not_decided(ops):
    """The block is printed, the request is rewritten, the operator says yes: refused."""
    proc, master = _at_a_terminal(["--db", ops["db"], "approve", ops["waiting"], "--by", "ops"])
    try:
        _wait_for(proc.stderr, b"[y/N] ")
        store = open_store(ops["db"])
        a = store.get_approval(ops["waiting"], ops["approval"])
        assert a.request is not None
        a.request.args = b'{"env":"production"}'
        new_hash = approval_hash(a.kind, a.capability, a.presentation, a.request)
        with store.tx() as tx:
            tx.execute("UPDATE approvals SET request_json = ?, hash = ? WHERE id = ?",
                       (dumps(a.request.to_json()), new_hash, a.id))
        os.write(master, b"y\n")
        out, err = proc.communicate(timeout=30)
    finally:
        os.close(master)
    assert proc.returncode == 1
    assert err.endswith(f"error: approve: approval {ops['approval']} changed after it was "
                        "shown; run the command again and read it before deciding\n".encode())
    assert b'"staging"' in out and b"production" not in out  # what was shown
    assert store.get_approval(ops["waiting"], ops["approval"]).status == "pending"
    store.close()


def test_a_typed_no_declines_and_changes_nothing(ops):
    before = snapshot(ops["db"])
    proc, master = _at_a_terminal(["--db", ops["db"], "reject", ops["waiting"]])
    try:
        _wait_for(proc.stderr, b"[y/N] ")
        os.write(master, b"no\n")
        _, err = proc.communicate(timeout=30)
    finally:
        os.close(master)
    assert proc.returncode == 1 and err.endswith(b"error: reject: declined at the prompt\n")
    assert snapshot(ops["db"]) == before


# -- a huge database ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def huge(tmp_path_factory):
    """100,000 runs and, newest, one whose goal is 20 MB."""
    d = tmp_path_factory.mktemp("huge")
    path = str(d / "huge.db")
    make_runs_db(path, 100_000, HUGE_GOAL_CHARS)
    small = str(d / "small.db")
    make_runs_db(small, 10)
    return path, small


def test_read_only_the_page_is_read_from_a_huge_database(huge):
    path, small = huge
    baseline = run_child("--db", small, "runs")
    assert baseline.code == 0
    # SQLite holds the oversized goal once while it counts its characters for the
    # marker; nothing grows with the 100,000 rows.
    bound = baseline.max_rss + HUGE_GOAL_CHARS + 32 * MB

    listed = run_child("--db", path, "runs")
    assert listed.code == 0, listed.stderr
    lines = listed.stdout.decode().splitlines()
    assert len(lines) == 1 + 100 + 1
    assert lines[1].startswith("huge") and lines[1].endswith("g" * 59 + "…")
    assert lines[-1] == ("... 99901 more run(s); rerun with --offset 100 to see them "
                         "(showing 100 of 100001)")
    assert listed.max_rss < bound, (listed.max_rss, baseline.max_rss)

    as_json = run_child("--db", path, "runs", "--json", "--limit", "3")
    doc = json.loads(as_json.stdout)
    assert doc["total"] == 100_001 and doc["truncated"] is True
    goal = doc["runs"][0]["goal"]
    assert goal.endswith(f"…[truncated: {HUGE_GOAL_CHARS} characters]")
    assert len(goal) < 66_000
    assert as_json.max_rss < bound

    shown = run_child("--db", path, "show", "huge")
    assert shown.code == 0, shown.stderr
    goal_line = shown.stdout.decode().splitlines()[1]
    assert goal_line.endswith(f"…[truncated: {HUGE_GOAL_CHARS} characters]")
    assert len(goal_line.encode()) < 4100
    assert shown.max_rss < bound

    events = run_child("--db", path, "events", "run-000001")
    assert (events.code, events.stdout) == (0, b"")
    assert events.max_rss < bound


def test_a_closed_pipe_ends_the_listing_quietly(huge):
    path, _ = huge
    reader = subprocess.Popen(["head", "-c", "200"], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL)
    proc = subprocess.run([sys.executable, "-m", "agentrt.cli", "--db", path, "runs",
                           "--limit", "0"], stdout=reader.stdin, stderr=subprocess.PIPE,
                          env=child_env(), timeout=120)
    assert reader.stdin is not None
    reader.stdin.close()
    reader.wait(timeout=30)
    assert proc.returncode == 0
    assert proc.stderr == b""

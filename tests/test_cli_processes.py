"""The ``agentrt`` command as a real process: exit codes, AGENTRT_DB, a real terminal,
a closed pipe, and bounded memory on a huge database."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import apsw
import pytest
from _cli_kit import (
    HUGE_GOAL_CHARS,
    REPO_ROOT,
    Kit,
    child_env,
    make_runs_db,
    operator_db,
    run_child,
    snapshot,
)
from store_helpers import fill_up, tmpfs_mount, without_file_privileges

from agentrt.gojson import dumps
from agentrt.records import approval_hash
from agentrt.store import open_existing, open_store

MB = 1024 * 1024
#: One past the largest integer SQLite stores.
BIG = str(2**63)


@pytest.fixture
def ops(tmp_path):
    return {**operator_db(str(tmp_path / "ops.db")), "missing": str(tmp_path / "missing.db")}


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


def test_ctrl_c_at_the_prompt_says_nothing_was_decided_and_changes_nothing(ops):
    before = snapshot(ops["db"])
    proc, master = _at_a_terminal(["--db", ops["db"], "approve", ops["waiting"]])
    try:
        _wait_for(proc.stderr, b"[y/N] ")
        proc.send_signal(signal.SIGINT)  # what Ctrl-C at the terminal sends
        _, err = proc.communicate(timeout=30)
    finally:
        os.close(master)
    assert proc.returncode == 1, err
    assert err.endswith(b"\nerror: approve: interrupted at the prompt; nothing was decided\n")
    assert b"Traceback" not in err
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


def test_verify_streams_a_huge_payload_through_the_hash_in_bounded_memory(tmp_path):
    from datetime import UTC, datetime

    def db_with_payload(path: str, size: int) -> None:
        at = datetime(2026, 10, 1, tzinfo=UTC)
        with open_store(path) as store, store.tx() as tx:
            tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) "
                       "VALUES ('r', 'g', 'RUNNING', '{}', '2026-10-01T09:00:00Z')")
            tx.append("r", "s", at, "step.tool_finished", b'{"c":"' + b"x" * size + b'"}')
            tx.append("r", "", at, "run.finished", {})

    small, big = str(tmp_path / "small.db"), str(tmp_path / "big.db")
    db_with_payload(small, 10)
    db_with_payload(big, 64 * MB)
    baseline = run_child("--db", small, "verify")
    checked = run_child("--db", big, "verify")
    assert (baseline.code, checked.code) == (0, 0), checked.stderr
    assert b"intact: 2 event(s), seq 1 to 2" in checked.stdout
    # Read in 64 KiB chunks: the 64 MB payload is never held whole.
    assert checked.max_rss < baseline.max_rss + 16 * MB, (checked.max_rss, baseline.max_rss)


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


# -- what the decisions, the pages and the openers say -----------------------------------


def _agentrt(*args: str, prefix: Sequence[str] = (), stdout: object = subprocess.PIPE,
             close_stdout: bool = False, env: dict[str, str] | None = None,
             ) -> subprocess.CompletedProcess[bytes]:
    """``agentrt ARGS`` as a real process, its stdout piped, /dev/full, or closed."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", "agentrt.cli", *args], stdin=subprocess.DEVNULL,
        stdout=None if close_stdout else stdout, stderr=subprocess.PIPE,
        env=env or child_env(), timeout=120,
        preexec_fn=(lambda: os.close(1)) if close_stdout else None)


@pytest.mark.parametrize(("verb", "args", "stdout", "done"), [
    ("cancel", [], "full", "run {waiting} was cancelled"),
    ("cancel", ["--json"], "closed", "run {waiting} was cancelled"),
    ("approve", ["--json", "--yes"], "full", "approval {approval} was approved"),
    ("reject", ["--json", "--approval", "{approval}"], "closed",
     "approval {approval} was rejected and run {waiting} cancelled"),
])
def test_a_decision_whose_result_cannot_be_written_says_it_was_recorded(
        ops, verb, args, stdout, done):
    subs = {"{waiting}": ops["waiting"], "{approval}": ops["approval"]}
    argv = ["--db", ops["db"], verb, ops["waiting"], *[subs.get(a, a) for a in args]]
    with open(os.devnull if stdout == "closed" else "/dev/full", "wb") as sink:
        result = _agentrt(*argv, stdout=sink, close_stdout=stdout == "closed")
    cause = "No space left on device" if stdout == "full" else "standard output is closed"
    for key, value in subs.items():
        done = done.replace(key, value)
    assert result.returncode == 1
    lines = result.stderr.decode().splitlines()
    assert lines[-1] == f"error: {done}, but writing the result failed: {cause}"
    assert all(line[:4].isdigit() for line in lines[:-1])  # the rest is the decision's trace
    assert b"Traceback" not in result.stderr
    with open_existing(ops["db"]) as store:  # the decision stands, as the sentence says
        run = store.get_run(ops["waiting"])
        approval = store.get_approval(ops["waiting"], ops["approval"])
    expected = {"cancel": ("CANCELLED", "operator_cancelled", "pending"),
                "approve": ("WAITING_FOR_APPROVAL", "", "approved"),
                "reject": ("CANCELLED", "approval_rejected", "rejected")}[verb]
    assert (run.status, run.reason, approval.status) == expected


@pytest.mark.parametrize(("verb", "stdout", "cause"), [
    ("approve", "full", "No space left on device"),
    ("approve", "reader gone", "Broken pipe"),
    ("reject", "reader gone", "Broken pipe"),
    ("reject", "closed", "standard output is closed"),
])
def test_an_approval_block_that_cannot_be_shown_decides_nothing(ops, verb, stdout, cause):
    """The block is printed before deciding: if it cannot be, even to a reader
    that went away (where a listing ends quietly), nothing is decided."""
    before = snapshot(ops["db"])
    read_end, write_end = os.pipe()
    os.close(read_end)  # a pipe whose reader has gone, as in `agentrt approve ... | true`
    try:
        with open("/dev/full", "wb") as full:
            sink = {"full": full, "reader gone": write_end, "closed": None}[stdout]
            result = _agentrt("--db", ops["db"], verb, ops["waiting"], "--yes", stdout=sink,
                              close_stdout=stdout == "closed")
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr.decode()) == (1, (
        f"error: {verb}: the approval could not be shown ({cause}), so nothing was decided; "
        "run it again with its output going where it can be read\n"))
    assert snapshot(ops["db"]) == before


@pytest.mark.parametrize("verb", ["approve", "reject"])
def test_deciding_an_expired_approval_says_it_expired_and_the_run_was_cancelled(ops, verb):
    conn = apsw.Connection(ops["db"])
    conn.execute("UPDATE approvals SET expires_at = '2000-01-01T00:00:00Z' WHERE id = ?",
                 (ops["approval"],))
    conn.close()
    result = run_child("--db", ops["db"], verb, ops["waiting"], "--yes")
    assert result.code == 1
    lines = result.stderr.decode().splitlines()
    decided = {"approve": "approved", "reject": "rejected"}[verb]
    assert lines[-1] == (
        f"error: approval {ops['approval']} expired at 2000-01-01T00:00:00Z, so it was not "
        f"{decided} and run {ops['waiting']} was cancelled (approval_expired): approval has "
        "expired")
    # What the command itself recorded, as the reference records it.
    assert [line.split()[3] for line in lines[:-1]] == ["approval.decided", "run.finished"]
    assert '"status":"expired"' in lines[0] and '"reason":"approval_expired"' in lines[1]
    with open_existing(ops["db"]) as store:
        run = store.get_run(ops["waiting"])
        approval = store.get_approval(ops["waiting"], ops["approval"])
    assert (run.status, run.reason, approval.status) == ("CANCELLED", "approval_expired",
                                                         "expired")


@pytest.mark.parametrize(("extra", "user", "message"), [
    (["--by", ""], "tester", "usage: --by is blank: name who decides, e.g. --by alice"),
    (["--by", "  \t "], "tester", "usage: --by is blank: name who decides, e.g. --by alice"),
    ([], " ", "usage: no name to record the decision under: pass --by or set USER"),
    ([], "", "usage: no name to record the decision under: pass --by or set USER"),
])
def test_a_blank_name_to_decide_under_is_a_usage_error(ops, extra, user, message):
    before = snapshot(ops["db"])
    for command in (["approve", ops["waiting"], "--yes"], ["cancel", ops["waiting"]]):
        result = run_child("--db", ops["db"], *command, *extra, env=child_env(USER=user))
        assert result.code == 2, result.stderr
        assert result.stderr.decode().splitlines()[0] == message
        assert result.stdout == b""
    assert snapshot(ops["db"]) == before


@pytest.mark.parametrize("args", [
    ["runs", "--offset", BIG],
    ["show", "{waiting}", "--offset", BIG],
    ["events", "{waiting}", "--offset", BIG],
    ["events", "{waiting}", "--limit", BIG],
    ["verify", "--from", BIG],
    ["verify", "--to", BIG],
    ["verify", "--head", f"{BIG}:{'a' * 64}"],
    ["verify", "--head", f"{'1' * 5000}:{'a' * 64}"],
])
def test_a_number_past_sqlites_range_is_a_usage_error(ops, args):
    result = run_child("--db", ops["db"], *[ops["waiting"] if a == "{waiting}" else a
                                            for a in args])
    assert result.code == 2, result.stderr
    first = result.stderr.decode().splitlines()[0]
    assert first.startswith("usage: ") and str(2**63 - 1) in first
    assert b"Traceback" not in result.stderr and result.stdout == b""
    assert len(first) < 300


def test_an_offset_past_the_end_is_said_on_stderr_and_stdout_stays_clean(ops):
    with open_existing(ops["db"]) as store:
        events = len(store.list_events(ops["waiting"]))
    note = f"no events at offset 1000; there are {events}\n".encode()
    for extra in ([], ["--json"]):
        result = run_child("--db", ops["db"], "events", ops["waiting"], "--offset", "1000",
                           *extra)
        assert (result.code, result.stdout, result.stderr) == (0, b"", note)
    note = b"no steps at offset 1000; there are 3\n"
    shown = run_child("--db", ops["db"], "show", ops["waiting"], "--offset", "1000")
    assert (shown.code, shown.stderr) == (0, note)
    assert shown.stdout.startswith(f"run     {ops['waiting']}".encode())
    assert b"STEP" not in shown.stdout
    as_json = run_child("--db", ops["db"], "show", ops["waiting"], "--offset", "1000", "--json")
    assert (as_json.code, as_json.stderr) == (0, note)
    doc = json.loads(as_json.stdout)
    assert (doc["steps"], doc["steps_total"], doc["offset"]) == ([], 3, 1000)
    within = run_child("--db", ops["db"], "events", ops["waiting"], "--offset", "1")
    assert within.code == 0 and within.stderr == b""  # a page with rows needs no note


@pytest.mark.parametrize(("case", "command", "says"), [
    ("mode-000", "runs", "{db} cannot be opened: permission denied, this user may not read it "
                         "(----------, owner uid {uid}); as its owner, chmod 600 {db}"),
    ("mode-000", "cancel", "{db} cannot be opened: permission denied, this user may not read "
                           "and write it (----------, owner uid {uid}); as its owner, chmod "
                           "600 {db}"),
    ("read-only-file", "cancel", "{db} is read-only to this user (-r--------, owner uid {uid}) "
                                 "and this needs to write it: as its owner, chmod 600 {db}"),
    ("read-only-directory", "cancel",
     "{db} is in a directory this user cannot write ({dir}): to write the database SQLite "
     "creates ops.db-wal and ops.db-shm (or ops.db-journal) beside it; as the directory's "
     "owner, chmod u+w {dir}, or move the database to a directory this user can write"),
])
def test_an_open_refused_by_permissions_says_why_and_the_fix(ops, tmp_path, case, command,
                                                              says):
    prefix = without_file_privileges()
    before = snapshot(ops["db"])
    # A reader leaves the -wal and -shm; a writer's last close removes them, and without
    # them SQLite must create them to write: that is what a read-only directory refuses.
    conn = apsw.Connection(ops["db"])
    conn.execute("SELECT count(*) FROM runs").fetchall()
    conn.close()
    assert sorted(os.listdir(tmp_path)) == ["ops.db"]
    args = ["--db", ops["db"], command] + ([] if command == "runs" else [ops["waiting"]])
    os.chmod(ops["db"], {"mode-000": 0o000, "read-only-file": 0o400}.get(case, 0o600))
    if case == "read-only-directory":
        os.chmod(tmp_path, 0o500)
    try:
        result = _agentrt(*args, prefix=prefix)
    finally:
        os.chmod(tmp_path, 0o700)
        os.chmod(ops["db"], 0o600)
    for key, value in {"{db}": ops["db"], "{dir}": str(tmp_path),
                       "{uid}": str(os.getuid())}.items():
        says = says.replace(key, value)
    assert result.returncode == 1
    assert result.stderr.decode() == f"error: agentrt: open store: {says}\n"
    assert result.stdout == b""
    assert snapshot(ops["db"]) == before


def test_a_database_another_process_holds_locked_says_so(ops):
    """A rollback-journal database whose writer holds its lock past the busy timeout."""
    other = apsw.Connection(ops["db"])
    other.execute("PRAGMA journal_mode=DELETE")
    before = snapshot(ops["db"])
    other.execute("BEGIN EXCLUSIVE")
    try:
        result = run_child("--db", ops["db"], "runs")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert result.code == 1
    assert result.stderr.decode() == (
        f"error: agentrt: open store: {ops['db']} is locked: another process holds its write "
        "lock and kept it past the 5 s busy timeout; nothing was changed, try again when it "
        "has finished\n")
    assert snapshot(ops["db"]) == before


@pytest.mark.parametrize("verb", ["cancel", "approve", "reject"])
def test_a_decision_on_a_full_disk_is_one_sentence_and_changes_nothing(tmp_path, verb):
    mount = str(tmp_path / "mnt")
    with tmpfs_mount(mount, size="1m"):
        kit = Kit(os.path.join(mount, "ops.db"))
        waiting = kit.waiting()
        approval = kit.store.list_approvals(waiting.id)[0]
        kit.close()
        # A reader keeps the -wal and -shm in place, so the write is what meets the full disk.
        keeper = apsw.Connection(kit.path, flags=apsw.SQLITE_OPEN_READONLY)
        keeper.execute("SELECT COUNT(*) FROM events").fetchall()
        try:
            fill_up(mount)
            before = snapshot(kit.path)
            args = ["--approval", approval.id, "--yes"] if verb != "cancel" else []
            result = _agentrt("--db", kit.path, verb, waiting.id, *args, "--by", "op")
            assert result.returncode == 1, result.stderr
            assert result.stderr.decode() == (
                f"error: {kit.path}: the file system holding it is full, so the transaction "
                "was rolled back (the database is as it was before it); free space there and "
                "try again\n")
            assert snapshot(kit.path) == before
        finally:
            keeper.close()
        os.remove(os.path.join(mount, "filler"))
        with open_existing(kit.path) as store:
            assert store.get_run(waiting.id).status == "WAITING_FOR_APPROVAL"
            assert store.verify_events().intact


def test_operators_racing_on_one_approval_from_separate_processes_decide_it_once(ops):
    # Each process has its own connection, so only SQLite's write lock and the
    # decision's compare-and-set stand between them (threads share a lock).
    verbs = ["approve", "reject"] * 3
    procs = [subprocess.Popen(
        [sys.executable, "-m", "agentrt.cli", "--db", ops["db"], verb, ops["waiting"],
         "--approval", ops["approval"], "--yes", "--by", f"op{k}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), cwd=REPO_ROOT)
        for k, verb in enumerate(verbs)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        results.append((proc.returncode, out, err))
    assert b"Traceback" not in b"".join(err for _, _, err in results)
    winners = [k for k, (code, _, _) in enumerate(results) if code == 0]
    assert len(winners) == 1, results
    for k, (code, _, err) in enumerate(results):
        if k not in winners:
            assert code == 1 and err.startswith(b"error: ") and err.count(b"\n") == 1, err
    with open_existing(ops["db"]) as store:
        events = store.list_events(ops["waiting"])
        decided = [json.loads(e.payload) for e in events if e.type == "approval.decided"]
        assert len(decided) == 1 and decided[0]["by"] == f"op{winners[0]}"
        run = store.get_run(ops["waiting"])
        if verbs[winners[0]] == "reject":
            assert (run.status, run.reason) == ("CANCELLED", "approval_rejected")
        else:
            assert run.status == "WAITING_FOR_APPROVAL"
        assert [e.type for e in events].count("run.finished") <= 1
        assert store.verify_events().broken is None

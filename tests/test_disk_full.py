"""The runtime on a full disk: every kind of write, refused in a real process.

A child process ignores SIGXFSZ and, right after the commit before the write a
test chooses, sets its file size limit (RLIMIT_FSIZE) to the size its WAL has
reached: the next transaction's first page write fails with EFBIG, as a write
on a full disk fails with ENOSPC, and SQLite rolls the transaction back. The
test then reads the file as the failure left it and resumes the run in this
process, which has no limit (space is back).

Run as a script, this file is that child: ``python test_disk_full.py SPEC_JSON``.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from store_helpers import insert_run

from agentrt.driver import (
    AgentFunc,
    DefaultPolicy,
    Driver,
    FuncTool,
    Message,
    ModelConfig,
    ModelRequest,
    ModelResponse,
    StepInput,
    ToolCall,
    ToolResult,
)
from agentrt.errors import RunLeasedError
from agentrt.records import Decision, Limits, Usage
from agentrt.store import Store, open_existing, open_store
from agentrt.timefmt import format_time

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RUN = "r"
LEASE_TTL = 0.5
LIMITS = Limits(max_steps=20, max_consecutive_tool_failures=5, loop_threshold=5)
TABLES = ("runs", "steps", "approvals", "model_calls", "tool_specs", "events")


# -- the run every test drives (the child's and this process's drivers alike) ----


def _agent(tool: str, model: bool, lift: bool = False) -> AgentFunc:
    """Asks the model (when ``model``), then calls ``tool`` until it has a result,
    then completes: a resumed run picks up from what is recorded, whatever the step.
    With ``lift``, a failed model call gives the process room again (the disk was
    full for a moment) and the agent raises an error of its own in its place."""

    def decide(step: StepInput) -> Decision:
        if model:
            assert step.model is not None
            try:
                step.model.generate(ModelRequest(messages=[Message("user", "go")],
                                                 max_output_tokens=16))
            except Exception as exc:
                if not lift:
                    raise
                resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
                raise RuntimeError("the model call failed") from exc
        if tool and not any(s.observation is not None and s.observation.kind == "tool_result"
                            for s in step.steps):
            return Decision.tool_call(tool, b'{"n":1}')
        return Decision.complete(b'{"done":true}')

    return AgentFunc(decide)


class _Model:
    def name(self) -> str:
        return "disk-model"

    def generate(self, request: ModelRequest, cancel: object) -> ModelResponse:
        return ModelResponse(text="ok", usage=Usage(input_tokens=5, output_tokens=2))


def _tools(ledger: str) -> list[FuncTool]:
    """``write`` (a local mutation) and ``publish`` (remote: the default policy asks
    an operator), each appending a line to ``ledger`` when it runs: every execution
    is counted, recorded or not."""

    def tool(name: str, effect: str) -> FuncTool:
        def run(call: ToolCall) -> ToolResult:
            with open(ledger, "a") as f:
                f.write(f"{name} {call.step_id}\n")
            return ToolResult(b'{"ok":true}', f"{name} done")
        return FuncTool(name, run, side_effect=effect, timeout=5)

    return [tool("write", "local_mutation"), tool("publish", "remote_mutation")]


def _driver(store: Store, spec: dict[str, Any], observer: Any = None) -> Driver:
    model = ModelConfig(_Model()) if spec.get("model") else None
    agent = _agent(spec.get("tool", ""), bool(model), bool(spec.get("lift")))
    return Driver(store, agent, DefaultPolicy(),
                  _tools(spec["ledger"]), observer=observer, model=model,
                  lease_owner=spec.get("owner", "parent"), lease_ttl=LEASE_TTL)


def _dump(db: str) -> dict[str, list[list[Any]]]:
    """Every row of the runtime's tables, through a connection of its own."""
    with open_existing(db) as store, store.locked() as conn:
        return {t: [list(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY rowid")]
                for t in TABLES}


# -- the child -------------------------------------------------------------------


def _limit_at_wal(db: str) -> int:
    """Let this process write no byte past the WAL's present end."""
    size = os.path.getsize(db + "-wal")
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
    return size


def child(spec: dict[str, Any]) -> dict[str, Any]:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails, EFBIG
    db = spec["db"]
    if spec["action"] == "open":
        resource.setrlimit(resource.RLIMIT_FSIZE, (spec["limit"], resource.RLIM_INFINITY))
        try:
            open_store(db).close()
        except Exception as exc:  # noqa: BLE001 - what the caller is handed is the finding
            return {"error": type(exc).__name__, "text": str(exc)}
        return {}
    if spec["action"] == "checkpoint":
        return _checkpoint(db)
    after = spec.get("after", "")
    seen: Counter[str] = Counter()
    out: dict[str, Any] = {}

    def observer(event: Any) -> None:
        seen[event.type] += 1
        if f"{event.type}#{seen[event.type]}" == after:
            out["limit"] = _limit_at_wal(db)
            out["before"] = _dump(db)

    store = open_store(db)
    driver = _driver(store, {**spec, "owner": "child"}, observer)
    if not after:
        out["limit"] = _limit_at_wal(db)
        out["before"] = _dump(db)
    action = spec["action"]
    try:
        if action == "start":
            out["status"] = driver.start("fill the disk", LIMITS, run_id=RUN).status
        elif action == "resume":
            out["status"] = driver.resume(RUN).status
        elif action == "cancel":
            out["status"] = driver.cancel(RUN, "op", "stop").status
        else:
            pending = [a for a in store.list_approvals(RUN) if a.status == "pending"]
            decide = driver.approve if action == "approve" else driver.reject
            out["status"] = decide(RUN, pending[0].id, "op").status
    except Exception as exc:  # noqa: BLE001 - what the caller is handed is the finding
        out["error"], out["text"] = type(exc).__name__, str(exc)
        if spec.get("then_lift"):  # space is back, in this same process
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
            out["again"] = driver.resume(RUN).status
    store.close()
    return out


def _checkpoint(db: str) -> dict[str, Any]:
    """Commits that fit the limit, with a checkpoint after each that cannot."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, resource.RLIM_INFINITY))
    store = open_store(db)
    store.db().execute("PRAGMA wal_autocheckpoint=2")
    committed = 0
    for i in range(20):
        with store.tx() as tx:
            insert_run(tx, f"r{i}", goal="x" * 3000)  # new pages, past the filler
            tx.append(f"r{i}", "", datetime.now(UTC), "run.created", {"i": i})
        committed += 1
    out: dict[str, Any] = {"committed": committed}
    try:  # the checkpoints after the commits failed as this one does
        store.db().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    except Exception as exc:  # noqa: BLE001 - what the caller is handed is the finding
        out["checkpoint"] = type(exc).__name__
    store.close()
    out["wal_left"] = os.path.exists(db + "-wal")
    return out


def _run_child(**spec: Any) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    done = subprocess.run([sys.executable, __file__, json.dumps(spec)], capture_output=True,
                          env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 0 and not done.stderr, done.stderr.decode()
    return dict(json.loads(done.stdout))


# -- the parent's side -------------------------------------------------------------


class Case:
    """A database and a ledger in ``tmp_path``; the run driven from this process."""

    def __init__(self, tmp_path: Path, tool: str = "write", model: bool = False) -> None:
        self.db = str(tmp_path / "disk.db")
        self.spec = {"db": self.db, "ledger": str(tmp_path / "ledger"), "tool": tool,
                     "model": model}
        Path(self.spec["ledger"]).touch()
        open_store(self.db).close()

    def child(self, action: str, after: str = "", **extra: Any) -> dict[str, Any]:
        return _run_child(**self.spec, action=action, after=after, **extra)

    def driver(self) -> tuple[Driver, Store]:
        store = open_store(self.db)
        return _driver(store, self.spec), store

    def ran(self) -> list[str]:
        return [line.split()[0] for line in Path(self.spec["ledger"]).read_text().splitlines()]

    def resume(self) -> Any:
        """Resume as a new driver once there is room: after the failed one's lease
        expires, as after any driver that stopped without releasing it."""
        driver, store = self.driver()
        deadline = time.monotonic() + 5
        try:
            while True:
                try:
                    return driver.resume(RUN)
                except RunLeasedError:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
        finally:
            store.close()

    def grant_and_resume(self, kind: str) -> Any:
        driver, store = self.driver()
        try:
            [pending] = [a for a in store.list_approvals(RUN) if a.status == "pending"]
            assert pending.kind == kind
            driver.approve(RUN, pending.id, "op")
            return driver.resume(RUN)
        finally:
            store.close()

    def events(self) -> list[str]:
        with open_existing(self.db) as store:
            return [e.type for e in store.list_events(RUN)]

    def intact(self) -> bool:
        with open_existing(self.db) as store:
            return store.verify_events().intact


def _too_large(db: str, limit: int, action: str) -> str:
    return (f"{db}: it reached this process's file size limit ({limit} bytes, ulimit -f), so "
            "the transaction was rolled back (the database is as it was before it); raise "
            f"the limit (ulimit -f unlimited) and {action}")


def _resume_action(db: str) -> str:
    """What the failed child's error says to do, with the lease it could not release."""
    with open_existing(db) as store:
        owner, expires = store.lease(RUN)
    assert owner.startswith("child/"), owner
    return (f"resume run {RUN} (this driver at once; another once the lease it holds, which "
            f"could not be released either, expires at {format_time(expires)})")


# -- the driver ------------------------------------------------------------------

#: (the write refused, the agent's tool, whether it asks a model, the commit after
#: which the disk is full, what had run by then)
MID_RUN = [
    ("step start", "write", False, "run.started#1", []),
    ("decision", "write", False, "step.started#1", []),
    ("policy and tool start", "write", False, "step.decided#1", []),
    ("tool end", "write", False, "step.tool_started#1", ["write"]),
    ("model dispatch", "", True, "step.started#1", []),
    ("model finish", "", True, "model.dispatched#1", []),
    ("pause for approval", "publish", False, "step.decided#1", []),
    ("finish", "write", False, "step.decided#2", ["write"]),
]


@pytest.mark.parametrize("where,tool,model,after,ran", MID_RUN, ids=[c[0] for c in MID_RUN])
def test_a_run_whose_write_meets_a_full_disk_rolls_it_back_whole_says_so_and_resumes(
        tmp_path, where, tool, model, after, ran):
    case = Case(tmp_path, tool, model)
    out = case.child("start", after)
    assert out["error"] == "StoreFullError"
    assert out["text"] == _too_large(case.db, out["limit"], _resume_action(case.db))
    assert _dump(case.db) == out["before"]  # nothing of the refused transaction
    assert case.intact()
    assert case.ran() == ran
    run = case.resume()
    events = case.events()
    assert "lease.taken_over" in events  # the lease it could not release, expired
    if where == "tool end":
        # The tool ran and its outcome is unknown: the spec's interrupted step, which
        # waits for an operator instead of running again on its own.
        assert run.status == "WAITING_FOR_APPROVAL" and case.ran() == ["write"]
        run = case.grant_and_resume("interrupted_side_effect")
        assert case.ran() == ["write", "write"]  # once more, because the operator said so
    elif tool == "publish":
        assert run.status == "WAITING_FOR_APPROVAL"
        run = case.grant_and_resume("remote_mutation")
    assert run.status == "COMPLETED"
    if where != "tool end":
        assert case.ran() == ([tool] if tool else [])  # once: a rolled-back start ran nothing
    assert case.intact()


def test_a_model_call_whose_record_met_a_full_disk_is_not_the_agents_error(tmp_path):
    """The disk had room again when the agent's error came back: had it been taken
    for the agent's own, the run would have ended FAILED (agent_error) over a
    moment without space. The caller gets the write's error; the run resumes."""
    case = Case(tmp_path, "", model=True)
    out = case.child("start", "model.dispatched#1", lift=True)
    assert out["error"] == "StoreFullError"
    # With room again, the lease was released at once, as after any erroring call.
    assert out["text"] == _too_large(case.db, out["limit"], f"resume run {RUN}")
    after = _dump(case.db)
    assert {t: after[t] for t in TABLES if t != "runs"} == {
        t: out["before"][t] for t in TABLES if t != "runs"}
    with open_existing(case.db) as store:
        assert store.get_run(RUN).status == "RUNNING"
    assert case.resume().status == "COMPLETED" and case.intact()


def test_a_start_refused_by_a_full_disk_writes_no_run_and_says_to_start_again(tmp_path):
    case = Case(tmp_path)
    out = case.child("start")
    assert out["error"] == "StoreFullError"
    assert out["text"] == _too_large(case.db, out["limit"], "start the run again")
    assert _dump(case.db) == out["before"] and out["before"]["runs"] == []
    driver, store = case.driver()
    with store:
        assert driver.start("fill the disk", LIMITS, run_id=RUN).status == "COMPLETED"
    assert case.ran() == ["write"] and case.intact()


def test_the_same_driver_resumes_at_once_when_space_is_back_in_its_process(tmp_path):
    """Its own lease, which the full disk kept it from releasing, does not stop it;
    and its connection, which met the failure, writes again."""
    case = Case(tmp_path)
    out = case.child("start", "step.started#1", then_lift=True)
    assert out["error"] == "StoreFullError" and out["again"] == "COMPLETED"
    assert "lease.taken_over" not in case.events()
    assert case.ran() == ["write"] and case.intact()


def _waiting(case: Case, *, approved: bool = False) -> None:
    """The run paused for an approval of ``publish`` (approved when asked), as this
    process leaves it: closed, so the child starts a fresh WAL."""
    driver, store = case.driver()
    with store:
        assert driver.start("fill the disk", LIMITS, run_id=RUN).status == (
            "WAITING_FOR_APPROVAL")
        if approved:
            [pending] = store.list_approvals(RUN)
            driver.approve(RUN, pending.id, "op")


@pytest.mark.parametrize("action", ["approve", "reject", "cancel"])
def test_an_operator_decision_on_a_full_disk_changes_nothing_and_says_try_again(
        tmp_path, action):
    case = Case(tmp_path, "publish")
    _waiting(case)
    out = case.child(action)
    assert out["error"] == "StoreFullError"
    assert out["text"] == _too_large(case.db, out["limit"], "try again")
    assert _dump(case.db) == out["before"] and case.intact()
    driver, store = case.driver()
    with store:
        [pending] = store.list_approvals(RUN)
        if action == "cancel":
            assert driver.cancel(RUN, "op").status == "CANCELLED"
        else:
            getattr(driver, action)(RUN, pending.id, "op")
            assert store.get_run(RUN).status == (
                "WAITING_FOR_APPROVAL" if action == "approve" else "CANCELLED")


def test_a_resume_of_a_grant_on_a_full_disk_runs_nothing_and_resumes_later(tmp_path):
    case = Case(tmp_path, "publish")
    _waiting(case, approved=True)
    out = case.child("resume")
    assert out["error"] == "StoreFullError"
    assert out["text"] == _too_large(case.db, out["limit"], f"resume run {RUN}")
    assert _dump(case.db) == out["before"] and case.intact()
    assert case.ran() == []  # the tool starts only once its start is recorded
    assert case.resume().status == "COMPLETED"
    assert case.ran() == ["publish"] and case.intact()


def test_a_checkpoint_the_full_disk_refuses_fails_no_commit_and_the_wal_keeps_them(tmp_path):
    """A pin (SQLite's own behaviour, already right): the WAL's checkpoint after a
    commit cannot grow the database file past the limit, and fails silently; the
    commits stay in the -wal, and the next open reads every one of them."""
    db = str(tmp_path / "grown.db")
    with open_store(db) as store, store.tx() as tx:  # pages far past the limit
        tx.execute("CREATE TABLE filler (b BLOB)")
        tx.execute("INSERT INTO filler VALUES (zeroblob(2000000))")
    out = _run_child(db=db, action="checkpoint", ledger=str(tmp_path / "ledger"))
    assert out == {"committed": 20, "checkpoint": "IOError", "wal_left": True}
    with open_existing(db) as store:
        assert len(store.list_runs()) == 20 and store.verify_events().intact


# -- the operator command -----------------------------------------------------------


def _limited(limit: int) -> Any:
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def _agentrt(db: str, *args: str, limit: int) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "agentrt.cli", "--db", db, *args],
                          capture_output=True, env=env, cwd=ROOT, timeout=60,
                          preexec_fn=_limited(limit))


@pytest.mark.parametrize("verb", ["approve", "reject", "cancel"])
def test_agentrt_deciding_on_a_full_disk_says_so_in_one_sentence_and_changes_nothing(
        tmp_path, verb):
    case = Case(tmp_path, "publish")
    driver, store = case.driver()
    with store:  # open, so the -wal keeps its frames and the decision must append
        driver.start("fill the disk", LIMITS, run_id=RUN)
        [pending] = store.list_approvals(RUN)
        before = _dump(case.db)
        limit = os.path.getsize(case.db + "-wal")
        args = ["--approval", pending.id, "--yes"] if verb != "cancel" else []
        done = _agentrt(case.db, verb, RUN, *args, "--by", "op", limit=limit)
        assert done.returncode == 1  # (approve and reject show the approval first)
        assert done.stderr.decode() == f"error: {_too_large(case.db, limit, 'try again')}\n"
        assert _dump(case.db) == before


@pytest.mark.parametrize("command", [["runs"], ["show", RUN], ["events", RUN], ["verify"]])
def test_agentrt_reads_a_database_on_a_full_disk(tmp_path, command):
    """Closed cleanly, the database has no -shm, which a reader makes (32 KiB): with
    no room for it, it is read as it stands, as on a read-only file system."""
    case = Case(tmp_path, "publish")
    _waiting(case)
    assert sorted(os.listdir(tmp_path)) == ["disk.db", "ledger"]
    done = _agentrt(case.db, *command, limit=0)
    assert (done.returncode, done.stderr) == (0, b"")
    assert RUN.encode() in done.stdout or b"intact: 6 event(s)" in done.stdout
    driver, store = case.driver()  # what the reader left (an empty -shm) hinders no writer
    with store:
        assert driver.cancel(RUN, "op").status == "CANCELLED"
        assert store.verify_events().intact


def test_agentrt_says_which_commits_a_full_disk_keeps_it_from_reading(tmp_path):
    """A -wal with commits and no -shm: read without the -shm, the last commits
    would be silently missing; so the reader says what to free instead."""
    case = Case(tmp_path, "publish")
    copy = tmp_path / "copy"
    copy.mkdir()
    driver, store = case.driver()
    with store:
        driver.start("fill the disk", LIMITS, run_id=RUN)
        for suffix in ("", "-wal"):  # the writer is idle: the pair is consistent
            (copy / f"disk.db{suffix}").write_bytes(Path(case.db + suffix).read_bytes())
    db = str(copy / "disk.db")
    os.chmod(db, 0o600)
    os.chmod(db + "-wal", 0o600)
    done = _agentrt(db, "runs", limit=0)
    assert done.returncode == 1
    assert done.stderr.decode() == (
        f"error: agentrt: open store: {db}-wal may hold commits not yet in disk.db, and SQLite "
        "reads them only through disk.db-shm, which the full file system holding it has no "
        "room for: free 32 KiB there and try again\n")


# -- opening ---------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, 4096, 40_000])
def test_a_new_database_the_full_disk_cut_short_is_completed_by_the_next_open(
        tmp_path, limit):
    db = str(tmp_path / "new.db")
    out = _run_child(db=db, action="open", ledger="", limit=limit)
    assert out["error"] == "StoreOpenError"
    if limit == 4096:  # room for the file's first page, not for its -shm
        assert out["text"] == (
            f"agentrt: open store: {db}: SQLite cannot make new.db-shm, the 32 KiB file beside "
            "it that connections share (disk I/O error), so it cannot be opened: the file "
            "system holding it is full or this process's file size limit (ulimit -f) is "
            "lower; free space there or raise the limit, and try again")
    else:
        assert out["text"] == "agentrt: open store: " + _too_large(
            db, limit, "open it again with open_store, which completes a database it began")
    # What is left is no broken database: the operator is told what it is ...
    done = _agentrt(db, "runs", limit=resource.RLIM_INFINITY)
    assert done.returncode == 1
    assert done.stderr.decode() == (
        f"error: agentrt: open store: {db} is an empty database: its tables were never "
        "created (an open_store that stopped part-way, on a full disk, leaves one); open it "
        "with the consumer's open_store, which creates them\n")
    # ... and the consumer's next open, with room, makes it whole.
    case = Case(tmp_path)
    case.db = case.spec["db"] = db
    driver, store = case.driver()
    with store:
        assert driver.start("fill the disk", LIMITS, run_id=RUN).status == "COMPLETED"
    assert case.intact()


if __name__ == "__main__":
    print(json.dumps(child(json.loads(sys.argv[1]))))


def test_a_read_that_meets_a_disk_io_error_says_no_untrue_rollback(tmp_path):
    # A read-only command has no transaction to roll back: its disk I/O error
    # is said without one.
    import apsw
    from click.testing import CliRunner

    from agentrt.cli import cli

    failing = {"on": False}

    class File(apsw.VFSFile):
        def __init__(self, vfs: apsw.VFS, name: Any, flags: list[int]) -> None:
            super().__init__("unix", name, flags)

        def xRead(self, amount: int, offset: int) -> bytes:
            if failing["on"]:
                raise apsw.IOError("injected EIO")
            return super().xRead(amount, offset)

    class FailingReads(apsw.VFS):
        def __init__(self) -> None:
            super().__init__("failing-reads", "unix", makedefault=True)

        def xOpen(self, name: Any, flags: list[int]) -> apsw.VFSFile:
            return File(self, name, flags)

    db = str(tmp_path / "x.db")
    open_store(db).close()
    vfs = FailingReads()
    failing["on"] = True
    try:
        out = CliRunner().invoke(cli, ["runs", "--db", db])
    finally:
        failing["on"] = False
        vfs.unregister()
    assert out.exit_code == 1
    assert "disk I/O error (injected EIO); check the file system holding it" in out.output
    assert "rolled back" not in out.output


_LATE_OUTCOME_ON_A_FULL_DISK = """
import os, resource, signal, sys
sys.path.insert(0, {tests!r})
from _driver_kit import call, limits, make
from agentrt.driver import FuncTool, ToolResult, cancel
from agentrt.records import Decision
from agentrt.store import open_store
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
db = {db!r}
store = open_store(db)
def tool(c):  # an operator cancels while it runs, and then the disk fills
    cancel(store, c.run_id, "alice", "stop")
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(db + "-wal"),
                                               resource.RLIM_INFINITY))
    return ToolResult(b'{{"x":1}}', "did x")
d, store, _, _ = make(store=store, script=[call("t"), Decision.complete()],
                      tools=[FuncTool("t", tool, timeout=5)])
try:
    d.start("g", limits(), run_id="r")
except Exception as exc:
    print(exc)
"""


def test_a_late_tool_outcome_refused_by_a_full_disk_is_not_said_to_need_a_resume(tmp_path):
    """The run was cancelled: 'resume run r' (said before) fails, as there is
    nothing to resume; the sentence says the outcome stays unrecorded."""
    db = str(tmp_path / "late.db")
    script = _LATE_OUTCOME_ON_A_FULL_DISK.format(tests=str(Path(__file__).parent), db=db)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)
    said = done.stdout.strip()
    assert said.endswith("note that nothing can record what was refused (an outcome that "
                         "came after the run ended) now: run r is already CANCELLED"), (
        said, done.stderr[-500:])
    assert "resume run" not in said

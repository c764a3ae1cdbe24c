"""Databases for the view and operator-command tests, recorded by the real driver,
and the two ways the command is run: click's runner in process, a real child.

Ids come from a counter hashed to 32 hex digits and times from a fake clock, so
two databases built the same way are the same database.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import apsw
from click.testing import CliRunner

from agentrt.cli import cli
from agentrt.clitools import run_click
from agentrt.driver import DefaultPolicy, Driver
from agentrt.records import Decision, Limits, Run
from agentrt.store import Store, open_store
from agentrt.testing import FakeClock, ScriptedAgent, static_tool

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENV_SCHEMA = b'{"type":"object","properties":{"env":{"enum":["staging","production"]}}}'
PATH_SCHEMA = b'{"type":"object","properties":{"path":{"type":"string"}}}'
LIMITS = Limits(max_steps=20, max_consecutive_tool_failures=3, loop_threshold=3)


def local_times_in_utc(monkeypatch: Any) -> Iterator[None]:
    """Local times print in UTC, so expected lines can be written out; used as an
    autouse fixture by the operator command's tests."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def tools() -> list:
    return [
        static_tool("read_file", "read_only", input_schema=PATH_SCHEMA,
                    content=b'{"lines":42}', summary="read 42 lines"),
        static_tool("deploy", "remote_mutation", input_schema=ENV_SCHEMA,
                    content=b'{"deployed":"staging"}', summary="deployed"),
        static_tool("drop_table", "destructive"),
    ]


def hex_ids(seed: str = "kit") -> Callable[[], str]:
    counter = iter(range(1, 1 << 30))
    return lambda: hashlib.sha256(f"{seed}-{next(counter)}".encode()).hexdigest()[:32]


class Kit:
    """A database and a driver's clock and ids, to record runs into."""

    def __init__(self, path: str, seed: str = "kit") -> None:
        self.path = path
        self.store: Store = open_store(path)
        self.clock = FakeClock(step=timedelta(milliseconds=250))
        self.new_id = hex_ids(seed)

    def driver(self, script: Sequence[Decision]) -> Driver:
        # Tool calls are timed as 0 ms: a real duration would change the chain's
        # hashes from one build to the next, and the operator docs print them.
        return Driver(self.store, ScriptedAgent(list(script)), DefaultPolicy(), tools(),
                      now=self.clock, new_id=self.new_id, lease_owner="kit",
                      monotonic=lambda: 0.0)

    def waiting(self, goal: str = "deploy the service to staging",
                args: bytes = b'{"env":"staging"}', *, history: bool = True) -> Run:
        """A run paused on a deploy, after an allowed read and a denied drop."""
        script = [
            Decision.tool_call("read_file", b'{"path":"README.md"}', reason="look first"),
            Decision.tool_call("drop_table", b'{"table":"users"}', reason="clean up"),
        ] if history else []
        script.append(Decision.tool_call("deploy", args, reason="ship it"))
        run = self.driver(script).start(goal, LIMITS)
        assert run.status == "WAITING_FOR_APPROVAL", run
        return run

    def completed(self, goal: str = "read the readme") -> Run:
        run = self.driver([
            Decision.tool_call("read_file", b'{"path":"README.md"}'),
            Decision.complete(b'{"summary":"42 lines"}'),
        ]).start(goal, LIMITS)
        assert run.status == "COMPLETED", run
        return run

    def close(self) -> None:
        self.store.close()


# -- running the command -----------------------------------------------------------


def operator_db(path: str) -> dict[str, str]:
    """A database holding a completed run and one waiting for approval, as an
    operator meets it: its path and the two runs' and the approval's ids."""
    kit = Kit(path)
    done = kit.completed()
    waiting = kit.waiting()
    approval = kit.store.list_approvals(waiting.id)[0]
    kit.close()
    return {"db": kit.path, "waiting": waiting.id, "approval": approval.id, "done": done.id}


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str
    stdout_bytes: bytes


def invoke(*args: str, env: Mapping[str, str | None] | None = None,
           input: str | bytes | None = None) -> Result:
    """``agentrt ARGS`` through click's runner, with the command's own exit codes."""
    runner = CliRunner()
    environment: dict[str, str | None] = {"AGENTRT_DB": None, "USER": "tester"}
    environment.update(env or {})
    with runner.isolation(input=input, env=environment) as streams:
        code = run_click(cli, "agentrt", list(args))
        out, err = streams[0].getvalue(), streams[1].getvalue()
    return Result(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), out)


def child_env(**extra: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("AGENTRT_DB", None)
    env["USER"] = "tester"
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


@dataclass
class ChildResult:
    code: int
    stdout: bytes
    stderr: bytes
    #: The child's peak resident set, in bytes.
    max_rss: int


# A small parent that runs the command and reports that child's peak RSS. Linux
# hands a child that execs the high-water mark of the memory it came from, so a
# command started straight from the test process would report the test's own
# size; started from this wrapper it inherits a few megabytes at most.
_MEASURE = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.executable, [sys.executable, '-m', 'agentrt.cli', *sys.argv[2:]])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "with open(sys.argv[1], 'w') as f:\n"
    "    f.write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def run_child(*args: str, env: Mapping[str, str] | None = None, cwd: str | None = None,
              stdin: int | None = subprocess.DEVNULL) -> ChildResult:
    """``python -m agentrt.cli ARGS`` as a real process, with its peak RSS."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "maxrss")
        done = subprocess.run([sys.executable, "-S", "-c", _MEASURE, report, *args],
                              capture_output=True, stdin=stdin, env=dict(env or child_env()),
                              cwd=cwd, timeout=300)
        with open(report) as f:
            max_rss = int(f.read()) * 1024
    return ChildResult(done.returncode, done.stdout, done.stderr, max_rss)


# -- what "nothing changed" means ----------------------------------------------------


def snapshot(path: str) -> tuple:
    """Every row of the runtime's tables and the file's mode, read without writing."""
    conn = apsw.Connection(f"file:{path}?mode=ro", flags=apsw.SQLITE_OPEN_READONLY
                           | apsw.SQLITE_OPEN_URI)
    try:
        rows = tuple(
            tuple(conn.execute(f"SELECT * FROM {table} ORDER BY rowid"))
            for table in ("runs", "steps", "approvals", "events", "model_calls")
        )
    finally:
        conn.close()
    return rows, os.stat(path).st_mode


# -- a huge database, fast -----------------------------------------------------------


HUGE_GOAL_CHARS = 20 * 1024 * 1024


def make_runs_db(path: str, runs: int, huge_goal: int = 0) -> None:
    """``runs`` finished runs written by SQL in one transaction, then (when
    ``huge_goal``) a newest run whose goal is that many characters."""
    store = open_store(path)
    try:
        with store.tx() as tx:
            tx.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
                "INSERT INTO runs (id, goal, status, reason, limits_json, step_count, "
                "created_at, started_at, finished_at) "
                "SELECT printf('run-%06d', i), 'synthetic goal number ' || i, 'COMPLETED', "
                "'goal_completed', '{\"max_steps\":50,\"max_consecutive_tool_failures\":3,"
                "\"loop_threshold\":3}', 3, '2026-10-01T09:00:00Z', '2026-10-01T09:00:00Z', "
                "'2026-10-01T09:01:00Z' FROM n",
                (runs,),
            )
            if huge_goal:
                tx.execute(
                    "INSERT INTO runs (id, goal, status, limits_json, created_at) VALUES "
                    "('huge', replace(hex(zeroblob(?)), '0', 'g'), 'RUNNING', '{}', "
                    "'2026-10-01T09:00:00Z')",
                    (huge_goal // 2,),
                )
    finally:
        store.close()

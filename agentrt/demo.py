"""``python -m agentrt.demo demo.db``: a real scripted run, recorded, then shown.

The scenario goes through what the runtime is for: two allowed tool calls, a
malformed request (recorded verbatim, refused by the schema), a destructive
call the policy denies, a deploy that pauses for a person, the operator's
approval (the decision ``agentrt approve`` makes, unbound to a shown hash), the resume
that executes exactly the approved request, and the finish. Then it shows the
file through the shipped commands: ``agentrt runs``, ``show``, ``events`` and
``verify``, and the first records of ``agentrt-export jsonl``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import stat
import subprocess
import sys
from datetime import timedelta
from typing import cast

import apsw

from agentrt.clitools import silence_stdout
from agentrt.driver import DefaultPolicy, Driver, FuncTool, ToolCall, ToolResult, approve
from agentrt.errors import AgentrtError
from agentrt.records import Decision, Limits, Run
from agentrt.store import Store, open_store
from agentrt.store.opening import (
    RUNTIME_TABLES,
    connect,
    refuse_unsafe_schema,
    sqlite_failure,
    sqlite_uri,
)
from agentrt.testing import ScriptedAgent

__all__ = ["DEMO_SCRIPT", "demo_tools", "main", "run_demo"]

_PATH_SCHEMA = b'{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}'
_NOTE_SCHEMA = b'{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}'
_ENV_SCHEMA = b'{"type":"object","properties":{"env":{"enum":["staging","production"]}}}'


def demo_tools() -> list[FuncTool]:
    """The scenario's tools: one of each side effect (benchmarks record with them too)."""
    def read_file(call: ToolCall) -> ToolResult:
        return ToolResult(b'{"lines":42,"title":"agentrt for Python"}', "read 42 lines")

    def write_note(call: ToolCall) -> ToolResult:
        return ToolResult(b'{"saved":true}', "note saved")

    def deploy(call: ToolCall) -> ToolResult:
        return ToolResult(b'{"deployed":"staging","version":"1.4.2"}', "deployed 1.4.2")

    def drop_table(call: ToolCall) -> ToolResult:  # pragma: no cover - always denied
        return ToolResult(b'{"dropped":true}', "dropped")

    timeout = timedelta(seconds=10)
    return [
        FuncTool("read_file", read_file, description="Read a file from the workspace.",
                 input_schema=_PATH_SCHEMA, side_effect="read_only", timeout=timeout),
        FuncTool("write_note", write_note, description="Save a note.",
                 input_schema=_NOTE_SCHEMA, side_effect="local_mutation", timeout=timeout),
        FuncTool("deploy", deploy, description="Deploy the service.",
                 input_schema=_ENV_SCHEMA, side_effect="remote_mutation", timeout=timeout),
        FuncTool("drop_table", drop_table, description="Drop a database table.",
                 side_effect="destructive", timeout=timeout),
    ]


#: What the scripted agent decides, step by step.
DEMO_SCRIPT = [
    Decision.tool_call("read_file", '{"path": "README.md"}', reason="learn what to ship"),
    Decision.tool_call("write_note", '{"text": 42}', reason="a malformed request"),
    Decision.tool_call("drop_table", '{"table": "users"}', reason="clean up (denied)"),
    Decision.tool_call("deploy", '{"env": "staging"}', reason="ship it (needs approval)"),
    Decision.tool_call("write_note", '{"text": "deployed 1.4.2 to staging"}'),
    Decision.complete('{"summary": "deployed 1.4.2 to staging after approval"}'),
]


_GOAL = "deploy the service to staging"


#: The demo's file's ``PRAGMA application_id`` ("demo"), set once open_store has
#: made its schema and before its run: what tells a demo stopped before its run
#: from a program's new database.
_MARK = 0x64656D6F


def _is_demos(path: str) -> bool:
    """Whether ``path`` holds nothing but what a demo writes: no table at all
    (a demo that stopped before its schema), or the runtime's tables only (as
    any schema version made them) and either no run and the demo's mark (a
    demo stopped before its run) or runs that all have the demo's goal and
    exactly the demo's tool specs (by hash). A goal alone is not enough: the
    docs use the demo's goal in their own examples. Read raw, so that a demo
    database an older agentrt made (without the mark) is still recognised.
    Only a regular file is read: a FIFO would hang the read, and a device or a
    link is nobody's demo."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        conn = connect(sqlite_uri(path, {"mode": "ro"}), write=False)
    except (OSError, apsw.Error):
        return False
    with contextlib.closing(conn):
        try:
            refuse_unsafe_schema(conn, path)
            tables = {str(r[0]) for r in conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'")}
            marks = conn.execute("PRAGMA application_id").fetchall()[0][0], conn.execute(
                "PRAGMA user_version").fetchall()[0][0]
            if not tables:  # another program's new file says so in its header
                return marks in ((0, 0), (_MARK, 0))
            if not tables <= {*RUNTIME_TABLES, "schema_migrations"}:
                return False
            counted = conn.execute("SELECT count(*), count(*) FILTER (WHERE goal IS NOT ?) "
                                   "FROM runs", (_GOAL,)).fetchall()[0]
            runs, others = cast(int, counted[0]), cast(int, counted[1])
            if runs == 0:
                return marks[0] == _MARK
            tools = {r[0] for r in conn.execute("SELECT hash FROM tool_specs")}
        except (AgentrtError, apsw.Error, TypeError, ValueError):
            return False
    # The specs themselves, not their names: a consumer's own "deploy" tool, or a
    # run with no tool at all, is not the demo's.
    return others == 0 and tools == {t.spec().spec_hash()[0] for t in demo_tools()}


def _remove(path: str) -> None:
    """Remove an earlier demo's database at ``path``; refuse any other file there
    (the path is the caller's choice: it may name their own database or notes)."""
    if (os.path.lexists(path) and not (os.path.isfile(path) and os.path.getsize(path) == 0)
            and not _is_demos(path)):
        raise _NotTheDemos(f"{path} exists and is not an earlier demo's database; "
                           "name a new file (the demo replaces only its own)")
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)


class _NotTheDemos(AgentrtError):
    """The file at the demo's path is someone else's: said as it is."""


def _new_marked_store(path: str) -> Store:
    """A new database at ``path`` (nothing is there: see :func:`_remove`), marked
    as the demo's before its run, so that a demo stopped later leaves a file the
    next demo knows as its own. Stopped before the mark (Ctrl-C, a full disk),
    it removes the file it made, which holds nothing of anyone's yet."""
    made = not os.path.lexists(path)  # _remove emptied it: what appears is this call's
    store: Store | None = None
    try:
        store = open_store(path)
        store.db().execute(f"PRAGMA application_id = {_MARK}")
        return store
    except BaseException:
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
        if made:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.remove(path + suffix)
        raise


def run_demo(path: str) -> tuple[Store, Run]:
    """Record the scenario into a fresh database at ``path``; return it and the run."""
    _remove(path)
    store = _new_marked_store(path)
    driver = Driver(store, ScriptedAgent(DEMO_SCRIPT), DefaultPolicy(), demo_tools(),
                    lease_owner="demo")
    limits = Limits(max_steps=20, max_consecutive_tool_failures=3, loop_threshold=3)
    run = driver.start(_GOAL, limits)
    if run.status == "WAITING_FOR_APPROVAL":
        pending = [a for a in store.list_approvals(run.id) if a.status == "pending"]
        for a in pending:
            approve(store, run.id, a.id, "demo-operator", "staging only, go ahead")
        run = driver.resume(run.id)
    return store, run


def _command(prog: str, args: list[str], head: int = 0) -> None:
    """Run one of the shipped commands in this process, as a person would type it."""
    from agentrt.cli import cli as agentrt_cli
    from agentrt.clitools import run_click
    from agentrt_export.cli import cli as export_cli

    shown = " ".join(map(shlex.quote, args)) + (f" | head -n {head}" if head else "")
    print(f"$ {prog} {shown}", flush=True)
    group = agentrt_cli if prog == "agentrt" else export_cli
    if not head:
        run_click(group, prog, args)
        print(flush=True)
        return
    module = "agentrt.cli" if prog == "agentrt" else "agentrt_export.cli"
    done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          check=False)
    lines = done.stdout.splitlines(keepends=True)
    sys.stdout.buffer.write(b"".join(lines[:head]))
    print(f"... {len(lines) - head} more record(s)\n", flush=True)


def _print(path: str, run: Run) -> None:
    """What an operator sees: the operator command and the JSON Lines exporter."""
    _command("agentrt", ["--db", path, "runs"])
    _command("agentrt", ["--db", path, "show", run.id])
    _command("agentrt", ["--db", path, "events", run.id])
    _command("agentrt", ["--db", path, "verify"])
    _command("agentrt-export", ["jsonl", "--db", path], head=4)


_USAGE = ("usage: python -m agentrt.demo [PATH]\n"
          "  records a scripted run into PATH (default demo.db), then shows it through\n"
          "  agentrt and agentrt-export; it replaces only a database an earlier demo made\n")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(_USAGE)
        return 0
    if len(args) > 1 or (args and args[0].startswith("-")):
        print(f"demo: {' '.join(map(shlex.quote, args))}: the demo takes one argument, the "
              "database path (./-name for a file whose name starts with -)", file=sys.stderr)
        return 2
    path = args[0] if args else "demo.db"
    try:
        store, run = run_demo(path)
    except _NotTheDemos as exc:
        print(f"demo: {exc.detail}", file=sys.stderr)
        return 1
    except (AgentrtError, OSError) as exc:
        print(f"demo: cannot record into {path}: {exc}", file=sys.stderr)
        return 1
    except apsw.Error as exc:  # a full disk, an I/O error: said as the operator command says it
        said = sqlite_failure(path, exc, write=True) or f"cannot record into {path}: {exc}"
        print(f"demo: {said}", file=sys.stderr)
        return 1
    store.close()
    try:
        _print(path, run)
        bin_dir = os.path.relpath(os.path.dirname(sys.executable))
        print(f"recorded in {path}; look again with: "
              f"{shlex.quote(os.path.join(bin_dir, 'agentrt'))} --db {shlex.quote(path)} runs  "
              f"(or: source {shlex.quote(os.path.join(bin_dir, 'activate'))})", flush=True)
    except BrokenPipeError:  # `make demo | head`: the reader has what it wanted
        silence_stdout()
    except OSError as exc:  # a full disk, a closed stdout
        silence_stdout()
        print(f"demo: recorded in {path}, but writing what it shows failed: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0 if run.status == "COMPLETED" else 1


if __name__ == "__main__":
    sys.exit(main())

"""What ``agentrt runs``, ``show`` and ``events`` look like on a terminal: columns
that stay straight whatever characters the cells hold, and who holds a running
run's lease."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _cli_kit import LIMITS, REPO_ROOT, invoke, local_times_in_utc

from agentrt.driver import DefaultPolicy, Driver, FuncTool
from agentrt.events import Event
from agentrt.records import Decision
from agentrt.render import local_stamp
from agentrt.store import open_existing, open_store
from agentrt.testing import FakeClock, ScriptedAgent, static_tool
from agentrt.trace import aligned_line, display_width

utc = pytest.fixture(autouse=True)(local_times_in_utc)

#: Cells a terminal draws wider or narrower than their character count: CJK
#: (two columns each), a letter with a combining accent (one column for two
#: characters), an emoji (two columns).
WIDE = "漢字の実行"
COMBINING = "cafe\u0301-cre\u0300me"
EMOJI = "\U0001f680-launch"


def driver(path: str, script: list[Any], tools: list[FuncTool]) -> Driver:
    return Driver(open_store(path), ScriptedAgent(script), DefaultPolicy(), tools,
                  now=FakeClock(), monotonic=lambda: 0.0)


def column_of(line: str, text: str) -> int:
    """The terminal column at which ``text`` starts in ``line``."""
    return display_width(line[:line.index(text)])


def test_runs_pads_by_display_width_so_wide_combining_and_emoji_ids_line_up(tmp_path):
    db = str(tmp_path / "runs.db")
    for run_id in ("plain-run", WIDE, COMBINING, EMOJI):
        d = driver(db, [Decision.complete()], [])
        assert d.start(f"goal of {run_id}", LIMITS, run_id=run_id).status == "COMPLETED"
    result = invoke("--db", db, "runs")
    assert result.code == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert len(rows) == 4
    assert {column_of(row, "COMPLETED") for row in rows} == {column_of(header, "STATUS")}
    assert {column_of(row, "goal of") for row in rows} == {column_of(header, "GOAL")}


def test_show_pads_the_steps_table_by_display_width_for_tools_named_in_any_script(tmp_path):
    db = str(tmp_path / "runs.db")
    names = ["read", "読み込み", "e\u0301crire", "\U0001f680launch"]
    script = [Decision.tool_call(name, b"{}") for name in names] + [Decision.complete()]
    run = driver(db, script, [static_tool(name) for name in names]).start("use them", LIMITS)
    result = invoke("--db", db, "show", run.id)
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("STEP"))
    header, rows = lines[at], lines[at + 1:at + 5]
    assert [row.split()[1] for row in rows] == names
    for column, word in [("DECISION", "tool_call"), ("POLICY", "allow"),
                         ("OBSERVATION", "tool_result")]:
        assert {column_of(row, word) for row in rows} == {column_of(header, column)}, column
    assert {column_of(row, f"{name} done") for row, name in zip(rows, names, strict=True)} \
        == {column_of(header, "SUMMARY")}


def test_a_cell_cut_at_its_cap_keeps_a_letter_with_its_combining_accent_or_drops_both(tmp_path):
    db = str(tmp_path / "runs.db")
    run_id = "a" * 79 + "e\u0301tude"  # the 80-byte cap falls between the e and its accent
    driver(db, [Decision.complete()], []).start("g", LIMITS, run_id=run_id)
    result = invoke("--db", db, "runs")
    assert result.code == 0, result.stderr
    row = result.stdout.splitlines()[1]
    assert row.startswith("a" * 79 + "…  ")


def test_event_lines_pad_the_type_by_display_width():
    at = datetime(2026, 10, 1, tzinfo=UTC)
    lines = [aligned_line(Event(1, "r", "", at, type_, b'{"x":1}'))
             for type_ in ("step.decided", "手順.決定", "e\u0301tape.x", "\U0001f680.started")]
    assert {column_of(line, '{"x":1}') for line in lines} == {len(lines[0]) - len('{"x":1}\n')}


# -- the lease of a running run ------------------------------------------------------

CRASHER = """
import os, sys
from agentrt.driver import DefaultPolicy, Driver, FuncTool
from agentrt.records import Decision, default_limits
from agentrt.store import open_store
from agentrt.testing import ScriptedAgent
db, ttl = sys.argv[1], float(sys.argv[2])
def write(call):
    os._exit(0)  # the process dies mid-tool: the run stays RUNNING, its lease held
tool = FuncTool("write", write, side_effect="local_mutation", timeout=5)
Driver(open_store(db), ScriptedAgent([Decision.tool_call("write", b"{}")]), DefaultPolicy(),
       [tool], lease_owner="crasher", lease_ttl=ttl).start("crash", default_limits(), run_id="r")
"""


def crashed_runs(tmp_path, *ttls: float) -> list[str]:
    """Databases each holding run ``r`` left RUNNING by a driver process that
    died in a tool, with a lease of the given TTL (the children run at once)."""
    paths = [str(tmp_path / f"crash-{i}.db") for i in range(len(ttls))]
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    children = [subprocess.Popen([sys.executable, "-c", CRASHER, path, str(ttl)], env=env)
                for path, ttl in zip(paths, ttls, strict=True)]
    assert [child.wait(60) for child in children] == [0] * len(ttls)
    return paths


def lease_of(path: str) -> tuple[str, datetime | None]:
    store = open_existing(path, read_only=True)
    try:
        return store.lease("r")
    finally:
        store.close()


def test_show_of_a_running_run_names_who_holds_its_lease_until_when_and_when_it_expired(
        tmp_path):
    held, lapsed = crashed_runs(tmp_path, 600, 0.25)
    owner, expires = lease_of(held)
    assert owner.startswith("crasher/") and expires is not None  # the owner names its process
    result = invoke("--db", held, "show", "r")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[2:4] == ["status  RUNNING", f"lease   {owner} until {local_stamp(expires)}"]

    owner, expires = lease_of(lapsed)
    assert expires is not None
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.01)
    result = invoke("--db", lapsed, "show", "r")
    assert result.code == 0, result.stderr
    assert result.stdout.splitlines()[3] == (
        f"lease   {owner} until {local_stamp(expires)} (expired)")


def test_show_of_a_running_run_nobody_holds_says_so_and_other_runs_have_no_lease_line(
        tmp_path):
    db = str(tmp_path / "runs.db")

    # An agent's KeyboardInterrupt propagates; the driver releases the lease on its way out.
    stopped = driver(db, [KeyboardInterrupt()], [])
    with pytest.raises(KeyboardInterrupt):
        stopped.start("stopped", LIMITS, run_id="stopped")
    store = open_existing(db, read_only=True)
    assert store.get_run("stopped").status == "RUNNING" and store.lease("stopped") == ("", None)
    store.close()
    result = invoke("--db", db, "show", "stopped")
    assert result.code == 0, result.stderr
    assert result.stdout.splitlines()[3] == "lease   none: no process holds this run"

    done = driver(db, [Decision.complete()], []).start("done", LIMITS, run_id="done")
    result = invoke("--db", db, "show", done.id)
    assert result.code == 0, result.stderr
    assert "lease" not in result.stdout


def test_a_lease_another_program_wrote_is_shown_sanitized_and_an_unreadable_expiry_said(tmp_path):
    db = str(tmp_path / "runs.db")
    store = open_store(db)
    with store.tx() as tx:
        tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at, lease_owner, "
                   "lease_expires_at) VALUES ('r', 'g', 'RUNNING', '{}', "
                   "'2026-10-01T09:00:00Z', ?, 'soon')", ("\x1b[2Jme\u202e",))
    store.close()
    result = invoke("--db", db, "show", "r")
    assert result.code == 0, result.stderr
    assert result.stdout.splitlines()[3] == "lease   \\x1b[2Jme\\u{202e} (no readable expiry)"


def test_show_of_a_run_that_ends_between_its_reads_does_not_say_nobody_holds_it(
        tmp_path, monkeypatch):
    # The page is one snapshot, the lease a read after it: a run its driver
    # finished in between was shown RUNNING with "no process holds this run".
    from click.testing import CliRunner
    from store_helpers import insert_run

    from agentrt.cli import cli
    from agentrt.store import Store, open_store
    from agentrt.timefmt import format_time

    db = str(tmp_path / "x.db")
    store = open_store(db)
    with store.tx() as tx:
        insert_run(tx, "r")
        tx.execute("UPDATE runs SET lease_owner='host-1:42', lease_expires_at=? WHERE id='r'",
                   (format_time(datetime.now(UTC) + timedelta(minutes=5)),))
    real = Store.lease

    def lease_after_the_run_ends(self, run_id):
        with store.tx() as tx:
            tx.execute("UPDATE runs SET status='COMPLETED', lease_owner='', "
                       "lease_expires_at='' WHERE id='r'")
        return real(self, run_id)

    monkeypatch.setattr(Store, "lease", lease_after_the_run_ends)
    out = CliRunner().invoke(cli, ["show", "r", "--db", db])
    assert out.exit_code == 0, out.output
    assert "status  RUNNING" in out.output and "lease" not in out.output

"""The ``agentrt`` command where it meets its environment: what stdin is, where
stdout goes and how Python buffers it, options given empty, and the state
another operator or process left a run in. Real processes throughout."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import apsw
import pytest
from _cli_kit import child_env, operator_db, run_child, snapshot

from agentrt.store import open_existing

GIB = 1024 * 1024 * 1024


@pytest.fixture
def ops(tmp_path):
    return operator_db(str(tmp_path / "ops.db"))


def _agentrt(*args: str, stdin: object = subprocess.DEVNULL, stdout: object = subprocess.PIPE,
             env: dict[str, str] | None = None, memory: int | None = None,
             ) -> subprocess.CompletedProcess[bytes]:
    """``agentrt ARGS`` as a real process; ``memory``: its address-space limit."""
    def preexec() -> None:
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run([sys.executable, "-m", "agentrt.cli", *args], stdin=stdin,
                          stdout=stdout, stderr=subprocess.PIPE, env=env or child_env(),
                          preexec_fn=preexec, timeout=120)


# -- stdin: a character device is not a terminal -----------------------------------------


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_stdin_that_is_a_device_but_no_terminal_is_refused_as_a_script_is(ops, device):
    """/dev/zero is a character device nobody types at: taken for a terminal, the
    prompt read it without end (a MemoryError and a traceback); /dev/urandom
    answered at random. Both are a script without consent."""
    before = snapshot(ops["db"])
    with open(device, "rb") as stdin:
        result = _agentrt("--db", ops["db"], "approve", ops["waiting"], stdin=stdin,
                          memory=GIB)
    assert result.returncode == 2, result.stderr[-500:]
    assert result.stderr.decode().splitlines()[0] == (
        "usage: approve: refusing without --approval, --yes, or an interactive terminal to "
        "confirm at; pass --approval <id> or --yes")
    assert result.stdout == b""
    assert snapshot(ops["db"]) == before


# -- verify: its exit code is the verdict, wherever its output goes ----------------------


def _break_the_chain(path: str) -> None:
    conn = apsw.Connection(path)
    conn.execute("UPDATE events SET payload_json = '{}' WHERE seq = 3")
    conn.close()


def _verify_into(sink: str, db: str, *args: str, unbuffered: bool
                 ) -> subprocess.CompletedProcess[bytes]:
    env = child_env(PYTHONUNBUFFERED="1" if unbuffered else None)
    if sink == "/dev/full":
        with open("/dev/full", "wb") as full:
            return _agentrt("--db", db, "verify", *args, stdout=full, env=env)
    read_end, write_end = os.pipe()
    os.close(read_end)  # a reader that went away: `agentrt verify | head -n 1`, `| true`
    try:
        return _agentrt("--db", db, "verify", *args, stdout=write_end, env=env)
    finally:
        os.close(write_end)


BROKEN = ("error: the event chain is broken at seq 3: the stored hash is not the one the "
          "event's fields and the previous event's hash give\n")


@pytest.mark.parametrize("unbuffered", [True, False], ids=["PYTHONUNBUFFERED", "buffered"])
@pytest.mark.parametrize("sink", ["closed pipe", "/dev/full"])
@pytest.mark.parametrize("args", [(), ("--json",)], ids=["text", "json"])
def test_verify_of_a_broken_chain_exits_1_and_says_so_when_its_output_cannot_be_written(
        ops, sink, args, unbuffered):
    """A closed pipe ended verify quietly with 0 (PYTHONUNBUFFERED set) or with
    Python's 'Exception ignored' and 120 (unset), and a full disk said only that
    the output failed: a script checking the exit code took a broken chain for
    an intact one."""
    _break_the_chain(ops["db"])
    result = _verify_into(sink, ops["db"], *args, unbuffered=unbuffered)
    assert (result.returncode, result.stderr.decode()) == (1, BROKEN)


@pytest.mark.parametrize("unbuffered", [True, False], ids=["PYTHONUNBUFFERED", "buffered"])
@pytest.mark.parametrize(("sink", "code", "said"), [
    ("closed pipe", 0, ""),
    ("/dev/full", 1, "error: writing output: No space left on device\n"),
])
def test_verify_of_an_intact_chain_still_treats_its_output_as_a_listing_does(
        ops, sink, code, said, unbuffered):
    result = _verify_into(sink, ops["db"], unbuffered=unbuffered)
    assert (result.returncode, result.stderr.decode()) == (code, said)


# -- options given empty ----------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["--db", "", "cancel", "{waiting}"],
    ["cancel", "{waiting}", "--db", ""],
    ["--db", "{other}", "cancel", "{waiting}", "--db", ""],
])
def test_an_empty_db_is_a_usage_error_not_the_database_named_elsewhere(ops, tmp_path, args):
    """``--db "$DB"`` with $DB unset cancelled the run in $AGENTRT_DB (or in the
    --db given before the command) instead of saying the option was empty."""
    before = snapshot(ops["db"])
    subs = {"{waiting}": ops["waiting"], "{other}": ops["db"]}
    result = run_child(*[subs.get(a, a) for a in args], env=child_env(AGENTRT_DB=ops["db"]))
    assert result.code == 2, result.stderr
    assert result.stderr.decode().splitlines()[0] == (
        "usage: --db is empty: name the database file, e.g. --db ops.db")
    assert result.stdout == b""
    assert snapshot(ops["db"]) == before


@pytest.mark.parametrize("extra", [[], ["--yes"]])
def test_an_empty_approval_is_a_usage_error_not_the_runs_only_approval(ops, extra):
    """``--approval "$ID"`` with $ID unset was taken as no --approval: with --yes
    it decided whatever approval was pending, without it the refusal asked for
    the --approval that had been given."""
    before = snapshot(ops["db"])
    result = run_child("--db", ops["db"], "approve", ops["waiting"], "--approval", "",
                       *extra)
    assert result.code == 2, result.stderr
    assert result.stderr.decode().splitlines()[0] == (
        "usage: --approval is empty: name the approval to decide, as agentrt show prints it")
    assert snapshot(ops["db"]) == before


# -- a run another operator cancelled while it waited --------------------------------------


def test_show_of_a_run_cancelled_while_waiting_does_not_offer_its_approval_for_deciding(ops):
    """Cancel leaves the run's approval pending (spec 7.5). ``show`` printed it as
    ``APPROVAL WAITING`` with a ``decide with:`` command that can only fail, and
    ``--json`` carried it as ``waiting_approval``, which the docs give only to a
    run that waits on one."""
    cancelled = run_child("--db", ops["db"], "cancel", ops["waiting"], "--by", "bob")
    assert cancelled.code == 0, cancelled.stderr
    with open_existing(ops["db"]) as store:
        assert store.get_approval(ops["waiting"], ops["approval"]).status == "pending"

    shown = run_child("--db", ops["db"], "show", ops["waiting"])
    assert shown.code == 0, shown.stderr
    text = shown.stdout.decode()
    assert "status  CANCELLED (operator_cancelled)" in text
    assert "APPROVAL WAITING" not in text and "decide with:" not in text
    as_json = run_child("--db", ops["db"], "show", ops["waiting"], "--json")
    doc = json.loads(as_json.stdout)
    assert "waiting_approval" not in doc
    assert [a["status"] for a in doc["approvals"]] == ["pending"]  # still listed as it is

    offered = run_child("--db", ops["db"], "approve", ops["waiting"], "--approval",
                        ops["approval"])
    assert offered.code == 1
    assert offered.stderr.decode() == (
        f"error: run {ops['waiting']} is CANCELLED, not waiting for approval: run is not "
        "waiting for approval\n")


# -- usage ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "said"), [
    ("resume", "usage: there is no resume command: resuming continues the run's loop"),
    ("recheck", "usage: there is no recheck command: rechecking a run asks its policy again"),
])
def test_help_on_resume_or_recheck_says_why_there_is_none(command, said):
    result = run_child("help", command)
    assert result.code == 2
    assert result.stderr.decode().startswith(said)


@pytest.mark.parametrize(("args", "said", "usage"), [
    (["--db"], "usage: Option '--db' requires an argument.", "Usage: agentrt [OPTIONS]"),
    (["runs", "--limit"], "usage: Option '--limit' requires an argument.",
     "Usage: agentrt runs [OPTIONS]"),
    (["runs", "--json=1"], "usage: Option '--json' does not take a value.",
     "Usage: agentrt runs [OPTIONS]"),
    (["approve", "x", "--yes", "--approval"], "usage: Option '--approval' requires an argument.",
     "Usage: agentrt approve [OPTIONS] RUN"),
])
def test_a_usage_error_of_the_option_parser_is_followed_by_the_usage_line(args, said, usage):
    """The docs: a usage error is ``usage: <what is wrong>`` followed by the usage
    line; click's parser raised these without a context, so the line was missing."""
    result = run_child(*args)
    assert result.code == 2
    lines = result.stderr.decode().splitlines()
    assert lines[0] == said
    assert lines[1].startswith(usage), lines

"""The operator command's defects a review found, each pinned where it showed:
paging runs beside a live consumer, ``verify --to`` past the head while one
commits, long object keys that bound alike, a closed or full stderr, end of
input at the consent prompt (spec core.md section 15), and an approval shown
after its expiry."""

from __future__ import annotations

import fcntl
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Iterator

import apsw
import pytest
from _cli_kit import Kit, child_env, invoke, local_times_in_utc, make_runs_db, operator_db, snapshot
from store_helpers import worker

from agentrt import cli as cli_module
from agentrt import view
from agentrt.errors import NotFoundError
from agentrt.store import Store, open_existing, open_store
from agentrt.view import bound_raw

utc = pytest.fixture(autouse=True)(local_times_in_utc)


@pytest.fixture
def ops(tmp_path) -> dict[str, str]:
    return operator_db(str(tmp_path / "ops.db"))


class Consumer:
    """A live consumer in its own process: it has committed five runs, each with
    an event, and commits five more each time it is told to."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.proc = worker("writer", path)
        assert self.readline().split() == ["ready", "5"]

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def commit_five_more(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("more\n")
        self.proc.stdin.flush()
        assert self.readline().startswith("wrote")


@pytest.fixture
def consumer(tmp_path) -> Iterator[Consumer]:
    path = str(tmp_path / "live.db")
    make_runs_db(path, 1100)
    live = Consumer(path)
    yield live
    live.proc.communicate(timeout=30)


# -- 1. runs read in pages beside a live consumer ---------------------------------------


@pytest.mark.parametrize("args", [("--json", "--limit", "0"), ("--limit", "1105")],
                         ids=["json-limit-0", "text-limit-all"])
def test_runs_read_in_pages_lists_every_run_once_while_a_consumer_starts_runs(
        consumer, monkeypatch, args):
    """Runs are listed newest first, so runs started between two page reads land on
    top and push the rest down; the next page must move down as far, or it repeats
    the last runs of the page before and the oldest fall out of reach."""
    with open_existing(consumer.path) as store:
        expected = [r.id for r in store.list_runs_page(2000, 0)[0]]
    assert len(expected) == 1105 and expected[-1] == "run-000001"
    real, reads = view.runs_page, []

    def runs_page(store: Store, limit: int, offset: int):
        page = real(store, limit, offset)
        reads.append(offset)
        if len(reads) < 3:  # ten runs on top before the last of (at least) three pages
            consumer.commit_five_more()
        return page

    monkeypatch.setattr(view, "runs_page", runs_page)
    result = invoke("--db", consumer.path, "runs", *args)
    assert result.code == 0, result.stderr
    if args[0] == "--json":
        doc = json.loads(result.stdout)
        listed = [r["id"] for r in doc["runs"]]
        assert (doc["total"], "truncated" in doc) == (1105, False)
    else:
        listed = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert listed == expected


# -- 2. verify --to past the head while a consumer commits --------------------------------


def test_verify_to_past_the_head_reports_the_last_seq_it_checked_not_one_committed_after(
        consumer, monkeypatch):
    """The walk stops at the head; events a consumer commits after it, up to --to,
    were never checked: --to is not reached (exit 1), and the 'last checked' pair
    is a seq and its own hash, so keeping it as --head holds next time."""
    path = consumer.path
    with open_existing(path) as store:
        head, head_hash = store.chain_head()
    real = Store.verify_events

    def verify_events(self: Store, from_seq: int = 0, to_seq: int = 0):
        report = real(self, from_seq, to_seq)
        consumer.commit_five_more()
        return report

    monkeypatch.setattr(Store, "verify_events", verify_events)
    result = invoke("--db", path, "verify", "--to", str(head + 5))
    assert result.code == 1, result.stdout
    assert result.stdout.splitlines()[-1] == f"last checked: seq {head} {head_hash}"
    assert result.stderr == (
        f"error: the event chain is shorter than asked: --to {head + 5} was not reached; "
        f"the last event checked is seq {head}\n")
    as_json = invoke("--db", path, "--json", "verify", "--to", str(head + 10))
    assert json.loads(as_json.stdout)["requested"] == {"to": head + 10, "reached": False}
    monkeypatch.setattr(Store, "verify_events", real)
    again = invoke("--db", path, "verify", "--head", f"{head}:{head_hash}")
    assert again.code == 0, again.stderr
    assert again.stdout.splitlines()[-1] == f"kept head: seq {head} matches"


# -- 3. long object keys that bound alike -------------------------------------------------

_HIDDEN = "a" * 300 + "X" + "b" * 1800  # same length, head and tail: they bound alike
_SHOWN = "a" * 300 + "Y" + "b" * 1800


def test_two_long_keys_that_bound_alike_both_stay_in_order_and_tell_apart():
    raw = json.dumps({"cmd": {_HIDDEN: "rm -rf /srv", _SHOWN: "echo safe"}}).encode()
    members = list(json.loads(bound_raw(raw))["cmd"].items())
    assert [value for _, value in members] == ["rm -rf /srv", "echo safe"]
    first, second = (key for key, _ in members)
    assert second == f"{first} (#2)" and "bytes omitted" in first


def test_show_prints_every_member_of_a_request_whose_long_keys_bound_alike(tmp_path):
    """Nested keys (bounded with the value) and top-level ones (one line each in the
    block) alike: an operator deciding must see the destructive member too."""
    kit = Kit(str(tmp_path / "k.db"))
    nested = kit.waiting(args=json.dumps(
        {"env": "staging", "cmd": {_HIDDEN: "rm -rf /srv", _SHOWN: "echo safe"}}).encode(),
        history=False)
    top = kit.waiting(args=json.dumps(
        {"env": "staging", _HIDDEN: "rm -rf /srv", _SHOWN: "echo safe"}).encode(),
        history=False)
    kit.close()
    text = invoke("--db", kit.path, "show", nested.id)
    assert text.code == 0, text.stderr
    assert text.stdout.index("rm -rf /srv") < text.stdout.index("echo safe")
    doc = json.loads(invoke("--db", kit.path, "--json", "show", nested.id).stdout)
    assert list(doc["waiting_approval"]["request"]["args"]["cmd"].values()) == [
        "rm -rf /srv", "echo safe"]
    block = invoke("--db", kit.path, "show", top.id).stdout.splitlines()
    keys = [line for line in block if line.startswith("  aaaa")]
    assert len(keys) == 2 and keys[0] != keys[1], keys
    assert "(#2)" in keys[1]


# -- 4. a closed or full stderr ---------------------------------------------------------


@pytest.mark.parametrize("command", ["show", "events"])
@pytest.mark.parametrize("stderr", ["2>&-", "2>/dev/full"], ids=["closed", "full"])
def test_a_listing_past_the_end_exits_0_when_its_note_cannot_reach_stderr(
        ops, command, stderr):
    """The offset note is only a note: stdout was written whole, so a stderr that
    is closed or cannot take it must not turn the listing into a failure."""
    argv = [sys.executable, "-m", "agentrt.cli", "--db", ops["db"], command, ops["waiting"],
            "--offset", "999"]
    seen = subprocess.run(argv, capture_output=True, env=child_env(), timeout=60)
    assert b"no steps at offset 999" in seen.stderr or b"no events at offset 999" in seen.stderr
    done = subprocess.run(["sh", "-c", f'exec "$@" {stderr}', "sh", *argv],
                          stdout=subprocess.PIPE, env=child_env(), timeout=60)
    assert done.returncode == 0
    assert done.stdout == seen.stdout


# -- 5. end of input at the consent prompt -------------------------------------------------


def _at_a_terminal(args: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "agentrt.cli", *args], stdin=slave,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
    os.close(slave)
    return proc, master


def _read_until(fd: int, marker: bytes, timeout: float = 30.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} in {seen!r}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 4096)
            assert chunk, f"ended before {marker!r}: {seen!r}"
            seen += chunk
    return seen


@pytest.mark.parametrize("ending", ["end-of-file", "hang-up"])
@pytest.mark.parametrize("verb", ["approve", "reject"])
def test_end_of_input_at_the_prompt_is_the_usage_refusal_and_decides_nothing(ops, verb, ending):
    """Spec section 15: "EOF before an answer = same refusal", the one a script
    gets without --approval or --yes (exit 2), not a typed no (exit 1). A
    terminal that hangs up (its reads fail with EIO) gave no answer either
    (before: 'error: writing output: Input/output error', exit 1)."""
    before = snapshot(ops["db"])
    proc, master = _at_a_terminal(["--db", ops["db"], verb, ops["waiting"]])
    try:
        assert proc.stderr is not None
        _read_until(proc.stderr.fileno(), b"[y/N] ")
        if ending == "end-of-file":
            os.write(master, b"\x04")  # the terminal's end-of-file character
        else:
            os.close(master)
            master = -1
        _, err = proc.communicate(timeout=30)
    finally:
        if master >= 0:
            os.close(master)
    assert proc.returncode == 2, err
    assert err.decode() == (  # after the prompt's line: the sentence, the usage, the help
        f"\nusage: {verb}: refusing without --approval, --yes, or an interactive terminal "
        f"to confirm at; pass --approval <id> or --yes\n"
        f"Usage: agentrt {verb} [OPTIONS] RUN\n"
        f"Try 'agentrt {verb} --help' for help.\n")
    assert snapshot(ops["db"]) == before


@pytest.mark.parametrize("controlling", [False, True], ids=["a-terminal", "the-controlling-one"])
def test_a_terminal_that_hangs_up_at_the_prompt_with_stderr_on_it_is_still_the_refusal(
        ops, controlling):
    """In a person's shell stderr is that terminal too: the refusal could not be
    printed there (EIO), and that failure escaped as a traceback, exit 1."""
    before = snapshot(ops["db"])
    master, slave = os.openpty()

    def session() -> None:  # as `trap '' HUP` in a login shell: its controlling terminal
        if controlling:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = subprocess.Popen([sys.executable, "-m", "agentrt.cli", "--db", ops["db"], "approve",
                             ops["waiting"]], stdin=slave, stdout=slave, stderr=slave,
                            env=child_env(), preexec_fn=session)
    os.close(slave)
    try:
        _read_until(master, b"[y/N] ")
    finally:
        os.close(master)  # the terminal hangs up
    assert proc.wait(timeout=30) == 2
    assert snapshot(ops["db"]) == before


# -- 6. an approval past its expiry ----------------------------------------------------------


def _expire_at(path: str, when: str) -> None:
    """Set the approval's expiry by hand (it is not part of the approval's hash)."""
    conn = apsw.Connection(path)
    try:
        conn.execute("UPDATE approvals SET expires_at = ?", (when,))
    finally:
        conn.close()


def test_show_marks_an_approval_past_its_expiry_and_offers_no_command_to_decide_it(ops):
    """Deciding it now would expire it and cancel the run, so `decide with:` is left
    out, and --json says so of its waiting approval; one not yet expired is offered."""
    decide = f"approve {ops['waiting']} --approval {ops['approval']}"
    _expire_at(ops["db"], "2100-01-01T00:00:00Z")
    text = invoke("--db", ops["db"], "show", ops["waiting"])
    assert "expires 2100-01-01 00:00:00 +0000" in text.stdout.splitlines()
    assert decide in text.stdout
    doc = json.loads(invoke("--db", ops["db"], "--json", "show", ops["waiting"]).stdout)
    assert "waiting_approval_expired" not in doc

    _expire_at(ops["db"], "2020-01-01T00:00:00Z")
    before = snapshot(ops["db"])
    text = invoke("--db", ops["db"], "show", ops["waiting"])
    assert text.code == 0, text.stderr
    assert ("expires 2020-01-01 00:00:00 +0000 (expired: deciding it now cancels the run "
            "as approval_expired)") in text.stdout.splitlines()
    assert "decide with:" not in text.stdout
    doc = json.loads(invoke("--db", ops["db"], "--json", "show", ops["waiting"]).stdout)
    assert doc["waiting_approval"]["id"] == ops["approval"]
    assert doc["waiting_approval_expired"] is True
    assert snapshot(ops["db"]) == before


def test_approve_warns_at_the_prompt_that_the_approval_shown_is_past_its_expiry(
        ops, monkeypatch):
    _expire_at(ops["db"], "2020-01-01T00:00:00Z")
    monkeypatch.setattr(cli_module, "_interactive", lambda: True)
    declined = invoke("--db", ops["db"], "approve", ops["waiting"], input="n\n")
    assert declined.code == 1
    assert "(expired: deciding it now cancels the run as approval_expired)" in declined.stdout


# -- pins for docs/compatibility.md (review finding 7: differences from the spec) -------------


def test_show_json_says_which_columns_of_a_step_could_not_be_read(ops):
    """A key the spec's StepSummary does not have: a damaged step is listed with
    what could not be read rather than failing the listing or passing silently."""
    conn = apsw.Connection(ops["db"])
    try:
        conn.execute("UPDATE steps SET decision_json = '{not json' WHERE run_id = ? "
                     "AND idx = 0", (ops["waiting"],))
    finally:
        conn.close()
    doc = json.loads(invoke("--db", ops["db"], "--json", "show", ops["waiting"]).stdout)
    first, *rest = doc["steps"]
    assert first["decode_error"].startswith("decision: ")
    assert all("decode_error" not in step for step in rest)


def _with_waiting_run_renamed(tmp_path, new_run: str) -> dict[str, str]:
    """operator_db with the waiting run's id changed to ``new_run`` in every table."""
    ids = operator_db(str(tmp_path / "ops.db"))
    conn = apsw.Connection(ids["db"])
    conn.execute("UPDATE runs SET id = ? WHERE id = ?", (new_run, ids["waiting"]))
    for table in ("steps", "approvals", "events"):
        conn.execute(f"UPDATE {table} SET run_id = ? WHERE run_id = ?", (new_run, ids["waiting"]))
    conn.close()
    return dict(ids, waiting=new_run)


@pytest.mark.parametrize("run_id", ["team-\U0001F468\u200d\U0001F469\u200d\U0001F467-deploy",
                                    "deploy\tstaging"], ids=["zero-width-joiner", "tab"])
def test_show_offers_no_decide_with_command_for_a_run_id_it_shows_escaped(tmp_path, run_id):
    """The escaped id (\\u{200d}, \\x09) names no run: the printed command could only
    fail, so it is left out, as for an id too long to show whole."""
    ids = _with_waiting_run_renamed(tmp_path, run_id)
    shown = invoke("--db", ids["db"], "show", run_id)
    assert shown.code == 0, shown.stderr
    assert "APPROVAL WAITING" in shown.stdout and "decide with:" not in shown.stdout


def test_the_decide_with_command_for_a_run_id_starting_with_a_dash_decides_it(tmp_path):
    ids = _with_waiting_run_renamed(tmp_path, "-deploy-7")
    shown = invoke("--db", ids["db"], "show", "--", "-deploy-7")
    assert shown.code == 0, shown.stderr
    [line] = [ln for ln in shown.stdout.splitlines() if ln.startswith("decide with: ")]
    assert line == (f"decide with: agentrt --db {ids['db']} approve "
                    f"--approval {ids['approval']} -- -deploy-7")
    argv = shlex.split(line.removeprefix("decide with: "))[1:]
    done = invoke(*argv, input="y\n")  # run as printed: it asks, and USER is the name
    assert done.code == 0, done.stderr
    assert "APPROVAL WAITING" not in invoke("--db", ids["db"], "show", "--", "-deploy-7").stdout


def test_a_run_whose_id_another_tool_stored_as_a_blob_is_said_so_not_just_not_found(tmp_path):
    """`runs` lists it by the blob's text; `show` by that text cannot find it and
    says why in one sentence, rather than "not found" for the id just listed."""
    ids = operator_db(str(tmp_path / "ops.db"))
    conn = apsw.Connection(ids["db"])
    conn.execute("UPDATE runs SET id = CAST(id AS BLOB) WHERE id = ?", (ids["done"],))
    conn.close()
    assert ids["done"] in invoke("--db", ids["db"], "runs").stdout
    shown = invoke("--db", ids["db"], "show", ids["done"])
    assert shown.code == 1
    assert shown.stderr == (f"error: agentrt: not found: run {ids['done']}: its id is stored "
                            "as a blob, not text (another tool wrote it), so it is listed by "
                            "that text but cannot be read or decided by it; store the id as "
                            "text\n")


def test_an_approval_whose_id_another_tool_stored_as_a_blob_is_said_so_and_not_decided(
        tmp_path):
    ids = operator_db(str(tmp_path / "ops.db"))
    conn = apsw.Connection(ids["db"])
    conn.execute("UPDATE approvals SET id = CAST(id AS BLOB) WHERE id = ?", (ids["approval"],))
    conn.close()
    before = snapshot(ids["db"])
    done = invoke("--db", ids["db"], "approve", ids["waiting"], "--yes", "--by", "op")
    assert done.code == 1
    assert "its id is stored as a blob, not text" in done.stderr
    assert done.stderr.count("\n") == 1
    assert snapshot(ids["db"]) == before


def test_an_approval_whose_run_id_column_alone_is_a_blob_is_not_said_to_have_a_blob_id(
        tmp_path):
    ids = operator_db(str(tmp_path / "ops.db"))
    conn = apsw.Connection(ids["db"])
    conn.execute("UPDATE approvals SET run_id = CAST(run_id AS BLOB) WHERE id = ?",
                 (ids["approval"],))
    conn.close()
    with open_existing(ids["db"]) as store, pytest.raises(NotFoundError) as caught:
        store.get_approval(ids["waiting"], ids["approval"])
    assert str(caught.value) == (f"agentrt: not found: approval {ids['approval']} "
                                 f"of run {ids['waiting']}")


def test_the_blob_id_checks_of_a_miss_are_index_lookups_not_scans() -> None:
    """A miss costs what a hit does however many runs there are (docs/operator.md:
    a huge database costs a page)."""
    from agentrt.store import rows

    with open_store(":memory:") as store:
        for sql, params in ((rows._BLOB_RUN, ("r",)), (rows._BLOB_APPROVAL, ("a", "r"))):
            plan = store.db().execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
            assert [step[3].split()[0] for step in plan] == ["SEARCH"], plan

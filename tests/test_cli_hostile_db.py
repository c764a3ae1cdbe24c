"""The ``agentrt`` operator command over a damaged or hostile database.

A database is the operator's file, but another program may have written it:
its rows can hold whatever a column can hold and the runtime never writes
(NULLs, BLOBs that are not UTF-8, numbers in text columns, 10 MB of text,
escape sequences, infinite REALs in count columns, times and JSON that do
not parse, statuses nobody knows). Every command must still answer with
output, or with one sentence and exit 1, never a traceback; text output must
not let stored text drive the terminal; what is printed stays bounded; and a
decision that refuses changes nothing.

Databases are recorded by the real driver (``_cli_kit.Kit``) once, copied per
test, and damaged with plain SQL.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import apsw
import pytest
from _cli_kit import Kit, Result, invoke, local_times_in_utc, make_runs_db, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrt.render import CELL_BYTES
from agentrt.store import open_store

MB = 1024 * 1024

#: Characters that would drive a terminal if printed raw: C0 controls other than
#: the newline, DEL, C1 controls, bidi controls, zero-width and line separators.
_RAW_CONTROL = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064"
    "\u2066-\u2069\ufeff]")
#: What JSON may not hold raw inside or outside a string.
_RAW_JSON_CONTROL = re.compile("[\x00-\x09\x0b-\x1f]")

COLUMNS = {
    "runs": ("goal", "status", "reason", "reason_detail", "limits_json", "step_count",
             "created_at", "started_at", "finished_at", "result_json", "model_calls",
             "input_tokens", "output_tokens", "cached_input_tokens", "estimated_cost_micros",
             "active_ms", "lease_owner", "lease_expires_at"),
    "steps": ("id", "idx", "status", "decision_json", "policy_json", "observation_json",
              "observation_hash", "started_at", "finished_at", "spec_hash", "policy_id"),
    "approvals": ("kind", "capability_json", "presentation_json", "request_json", "hash",
                  "status", "created_at", "expires_at", "decided_at", "decided_by", "note"),
    "events": ("step_id", "at", "type", "payload_json", "hash"),
}

ESCAPES = "\x1b[2J\x1b]0;owned\x07\u202egnp.exe\u2066\x00\x08\r\x9b31m\u200b"

#: What a column can hold but the runtime never writes (None: NULL, which needs
#: the table rebuilt without its NOT NULL constraints, as another program may).
HOSTILE: tuple[object, ...] = (
    None,
    b"\xff\xfe\x80 not utf-8 \x1b[31m",
    b"",
    7,
    -1,
    1.5,
    2**63 - 1,
    -(2**63),
    float("inf"),
    float("-inf"),
    "",
    "garbage",
    "{",
    "[1, 2]",
    '{"kind": 7, "tool": ["x"], "summary": {"a": 1}, "outcome": null}',
    "null",
    "9999-12-31T23:59:59-23:59",
    "0001-01-01T00:00:00+23:59",
    ESCAPES,
    ESCAPES * 5000,
    "\U0001f600" * 70_000,
)

#: 10 MB values, one per table (each costs a database write per command). Events
#: get plain text: verify re-reads a long field a chunk at a time, each chunk a
#: query that walks the value from its start, so 10 MB of escapes takes it ~20 s.
HUGE = {
    "runs": ESCAPES * (MB // 2),
    "steps": b"\xff" * (10 * MB),
    "approvals": ESCAPES * (MB // 2),
    "events": "x" * (10 * MB),
}


utc = pytest.fixture(autouse=True)(local_times_in_utc)


@dataclass(frozen=True)
class Recorded:
    """A database the driver recorded: a completed run and one waiting on an approval."""

    path: str
    waiting: str
    approval: str
    done: str
    #: The waiting run's step the approval is on, and its first event.
    step: str
    event_seq: int


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Recorded:
    path = str(tmp_path_factory.mktemp("hostile") / "recorded.db")
    kit = Kit(path, seed="hostile")
    done = kit.completed()
    waiting = kit.waiting()
    approval = kit.store.list_approvals(waiting.id)[0]
    seq = kit.store.list_events(waiting.id)[0].seq
    kit.close()
    return Recorded(path, waiting.id, approval.id, done.id, approval.step_id, seq)


_COPIES = iter(range(1 << 30))


def copy_of(recorded: Recorded, directory: str) -> str:
    path = os.path.join(directory, f"copy-{next(_COPIES)}.db")
    shutil.copyfile(recorded.path, path)
    os.chmod(path, 0o600)
    return path


def relax(conn: apsw.Connection, table: str) -> None:
    """Rebuild ``table`` without its constraints (events keep seq as the rowid),
    as a program that made its own copy of the schema might."""
    conn.execute(f"ALTER TABLE {table} RENAME TO old_{table}")
    if table == "events":
        conn.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id, "
                     "step_id, at, type, payload_json, hash)")
        conn.execute("INSERT INTO events SELECT seq, run_id, step_id, at, type, payload_json, "
                     "hash FROM old_events")
    else:
        conn.execute(f"CREATE TABLE {table} AS SELECT * FROM old_{table}")
    conn.execute(f"DROP TABLE old_{table}")


def damage(path: str, recorded: Recorded, table: str, column: str, value: object) -> None:
    """Store ``value`` in ``column`` of the one row of ``table`` the commands read."""
    conn = apsw.Connection(path)
    try:
        if value is None or value != value:  # SQLite stores a NaN as NULL
            relax(conn, table)
        where, key = {
            "runs": ("id = ?", recorded.waiting),
            "steps": ("id = ?", recorded.step),
            "approvals": ("id = ?", recorded.approval),
            "events": ("seq = ?", recorded.event_seq),
        }[table]
        # OR REPLACE: a value another row holds in a unique column takes it over.
        conn.execute(f"UPDATE OR REPLACE {table} SET {column} = ? WHERE {where}",
                     (value, key))
    finally:
        conn.close()


def commands(recorded: Recorded) -> list[tuple[str, ...]]:
    run, approval = recorded.waiting, recorded.approval
    return [
        ("runs",), ("runs", "--json"), ("runs", "--limit", "0"),
        ("show", run), ("show", run, "--json"), ("show", run, "--limit", "1", "--offset", "1"),
        ("events", run), ("events", run, "--json"), ("events", run, "--limit", "2",
                                                     "--offset", "3"),
        ("verify",), ("verify", "--json"),
        ("approve", run, "--approval", approval, "--by", "op"),
        ("approve", run, "--yes", "--by", "op", "--json"),
        ("reject", run, "--approval", approval, "--by", "op"),
        ("cancel", run, "--by", "op"),
    ]


DECISIONS = ("approve", "reject", "cancel")


def same_file(path: str, original: str) -> bool:
    """Whether ``path`` is still byte for byte (and mode) the database it was
    copied from, with no write-ahead log beside it: then it holds the rows that
    one does, found in a tenth of the time of reading 100 MB of them back."""
    if os.path.exists(path + "-wal"):
        return False
    a, b = os.stat(path), os.stat(original)
    if (a.st_size, a.st_mode) != (b.st_size, b.st_mode):
        return False
    with open(path, "rb") as f, open(original, "rb") as g:
        while chunk := f.read(MB):
            if chunk != g.read(MB):
                return False
    return True


def check_answer(path: str, command: Sequence[str], result: Result, before: tuple | None,
                 max_bytes: int = 2 * MB, copied_from: str | None = None) -> None:
    """What every command owes the operator, whatever the database holds
    (``before`` None: the caller compares the database itself; ``copied_from``:
    the database ``path`` was copied from just before the command, which holds
    ``before``)."""
    shown = " ".join(a[:40] for a in command)
    assert "Traceback" not in result.stderr, (shown, result.stderr[-2000:])
    assert result.code in (0, 1), (shown, result.code, result.stderr[-500:])
    if result.code == 1:
        last = result.stderr.rstrip("\n").rsplit("\n", 1)[-1]
        assert last.startswith("error: "), (shown, result.stderr[-500:])
        if command[0] not in DECISIONS or "--json" in command:
            # Only a decision traces events to stderr, and only once it committed.
            assert result.stderr.count("\n") == 1, (shown, result.stderr[-500:])
    assert len(result.stdout_bytes) <= max_bytes, (shown, len(result.stdout_bytes))
    assert len(result.stderr) <= max_bytes, (shown, len(result.stderr))
    assert _RAW_CONTROL.search(result.stderr) is None, (shown, result.stderr[-500:])
    if "--json" in command:
        assert _RAW_JSON_CONTROL.search(result.stdout) is None, shown
        if result.stdout:
            if command[0] == "events":
                for line in result.stdout.splitlines():
                    json.loads(line)
            else:
                json.loads(result.stdout)
    else:
        leak = _RAW_CONTROL.search(result.stdout)
        assert leak is None, (shown, leak, result.stdout[max(0, leak.start() - 80):][:200])
    if before is None:
        return
    if command[0] not in DECISIONS:
        assert snapshot(path) == before, shown
    elif (result.code != 0 and "expired" not in result.stderr
          and (copied_from is None or not same_file(path, copied_from))):
        # A refused decision changes nothing (deciding an approval found past its
        # expiry records the expiry and cancels the run, as the reference does).
        assert snapshot(path) == before, (shown, result.stderr)


def run_all(path: str, recorded: Recorded, max_bytes: int = 2 * MB) -> dict[str, Result]:
    """Every command: the reads against ``path``, each decision against a copy
    of it (a decision that does not refuse changes it)."""
    out = {}
    before = snapshot(path)
    for command in commands(recorded):
        work = path
        if command[0] in DECISIONS:
            work = path + ".work"
            shutil.copyfile(path, work)
            os.chmod(work, 0o600)
        result = invoke("--db", work, *command)
        check_answer(work, command, result, before if work != path else None, max_bytes,
                     copied_from=path if work != path else None)
        out[" ".join(command)] = result
        if work != path:
            os.remove(work)
    assert snapshot(path) == before  # no read changed anything
    return out


# -- any hostile value, any column, any command ---------------------------------------


_CELLS = st.sampled_from([(t, c) for t, cols in COLUMNS.items() for c in cols])
_VALUES = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=40),
    st.binary(max_size=40),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(),
)


@settings(max_examples=600, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cell=_CELLS, value=_VALUES, which=st.integers(min_value=0, max_value=14))
def test_every_command_answers_any_stored_value_with_output_or_one_sentence(
        recorded, tmp_path, cell, value, which):
    table, column = cell
    path = copy_of(recorded, str(tmp_path))
    damage(path, recorded, table, column, value)
    command = commands(recorded)[which]
    before = snapshot(path)
    check_answer(path, command, invoke("--db", path, *command), before)
    os.remove(path)


@pytest.mark.parametrize("table", list(COLUMNS))
def test_ten_megabytes_in_every_text_column_cost_a_bounded_answer(recorded, tmp_path, table):
    value = HUGE[table]
    path = copy_of(recorded, str(tmp_path))
    columns = [c for c in COLUMNS[table] if c not in ("idx", "step_count") and
               not c.endswith(("tokens", "calls", "micros", "_ms"))]
    conn = apsw.Connection(path)
    conn.execute(f"UPDATE {table} SET " + ", ".join(f"{c} = ?1" for c in columns)
                 + " WHERE rowid = (SELECT rowid FROM " + table
                 + (" WHERE run_id = ?2" if table != "runs" else " WHERE id = ?2")
                 + " ORDER BY rowid LIMIT 1)", (value, recorded.waiting))
    conn.close()
    run_all(path, recorded)


# -- findings, each pinned --------------------------------------------------------------


@pytest.mark.parametrize(("table", "column"), [
    ("runs", "model_calls"), ("runs", "step_count"), ("runs", "input_tokens"),
    ("runs", "estimated_cost_micros"), ("runs", "active_ms"), ("steps", "idx")])
@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_a_count_column_holding_an_infinite_real_reads_as_zero_not_a_traceback(
        recorded, tmp_path, table, column, value):
    # SQLite stores an integer literal too large for 64 bits (9e999, or text of
    # many digits in an INTEGER column) as an infinite REAL; int() of it raised
    # OverflowError out of every read of the run.
    path = copy_of(recorded, str(tmp_path))
    damage(path, recorded, table, column, value)
    results = run_all(path, recorded)
    assert all(results[c].code == 0 for c in ("runs", "runs --json", "verify")), results
    shown = results[f"show {recorded.waiting} --json"]
    assert shown.code == 0, shown.stderr
    doc = json.loads(shown.stdout)
    if column == "step_count":
        assert doc["run"]["steps"] == 0
    if column == "idx":
        assert doc["steps"][0]["index"] == 0
    assert results[f"cancel {recorded.waiting} --by op"].code == 0


@pytest.mark.parametrize("column", ["status", "goal", "reason_detail", "limits_json",
                                    "result_json"])
def test_a_nul_does_not_let_a_huge_text_past_the_page_cap(tmp_path, column):
    # SQLite's length() stops at the first NUL, so a 10 MB text behind one
    # counted as short and the page read took it whole (and runs printed it).
    path = str(tmp_path / "nul.db")
    make_runs_db(path, 3)
    huge = "\x00" + "s" * (10 * MB)
    conn = apsw.Connection(path)
    conn.execute(f"UPDATE runs SET {column} = ? WHERE id = 'run-000002'", (huge,))
    conn.close()
    store = open_store(path)
    try:
        page, _ = store.list_runs_page(10, 0)
        run = store.get_run_capped("run-000002")
    finally:
        store.close()
    for r in (*page, run):
        assert len(r.goal) + len(r.status) + len(r.reason_detail) <= 3 * 70_000
        assert len(r.result) <= 70_000
    listed = invoke("--db", path, "runs")
    assert listed.code == 0 and len(listed.stdout_bytes) < 10_000, len(listed.stdout_bytes)
    for args in (("runs", "--json"), ("show", "run-000002"), ("show", "run-000002", "--json")):
        result = invoke("--db", path, *args)
        assert result.code == 0, result.stderr
        assert len(result.stdout_bytes) < 2 * MB, (args, len(result.stdout_bytes))


def _line_lengths(text: str) -> list[int]:
    return [len(line) for line in text.splitlines()]


@pytest.mark.parametrize("column", ["id", "status", "reason", "step_count"])
def test_one_oversized_cell_does_not_widen_every_row_of_the_runs_table(tmp_path, column):
    # The table pads every cell to its column's widest, so one 50 000-character
    # status made each of the 200 rows 50 000 characters wide (10 MB for 200 runs,
    # gigabytes for runs --limit 0 over a large database).
    path = str(tmp_path / "wide.db")
    make_runs_db(path, 200)
    conn = apsw.Connection(path)
    value: object = "S" * 50_000 if column != "step_count" else 1e300
    conn.execute(f"UPDATE runs SET {column} = ? WHERE id = 'run-000100'", (value,))
    conn.close()
    for args, lines in ((("runs",), 102), (("runs", "--limit", "0"), 201)):
        result = invoke("--db", path, *args)
        assert result.code == 0, result.stderr
        lengths = _line_lengths(result.stdout)
        assert len(lengths) == lines and max(lengths) <= 400, max(lengths)
        if column != "step_count" and lines == 201:
            assert "S" * CELL_BYTES + "…" in result.stdout  # cut at the cell cap, marked
            assert "S" * (CELL_BYTES + 1) not in result.stdout


def test_one_oversized_cell_does_not_widen_every_row_of_the_steps_table(recorded, tmp_path):
    path = copy_of(recorded, str(tmp_path))
    decision = json.dumps({"kind": "tool_call", "tool": "t" * 50_000, "args": {}})
    conn = apsw.Connection(path)
    conn.execute("UPDATE steps SET decision_json = ?, status = ? WHERE id = ?",
                 (decision, "\x1b" * 30_000, recorded.step))
    conn.close()
    result = invoke("--db", path, "show", recorded.waiting)
    assert result.code == 0, result.stderr
    table = result.stdout[result.stdout.index("STEP  "):]
    assert max(_line_lengths(table)) <= 800, _line_lengths(table)
    assert "t" * CELL_BYTES + "…" in table and "t" * (CELL_BYTES + 1) not in table


@pytest.mark.parametrize("column", ["kind", "hash", "id"])
@pytest.mark.parametrize("verb", ["approve", "reject", "show"])
def test_an_approval_block_clips_a_huge_field_and_a_refused_decision_changes_nothing(
        recorded, tmp_path, column, verb):
    # A decision reads the approval whole (it binds the hash), and the block it
    # prints before deciding printed kind, hash and id whole: 10 MB of kind
    # became 10 MB of output (30 MB when not UTF-8) before the refusal.
    path = copy_of(recorded, str(tmp_path))
    value = ("k\x1b" * MB) if column != "id" else "i" * 60_000
    conn = apsw.Connection(path)
    conn.execute(f"UPDATE approvals SET {column} = ? WHERE id = ?", (value, recorded.approval))
    conn.close()
    approval = recorded.approval if column != "id" else value
    before = snapshot(path)
    if verb == "show":
        result = invoke("--db", path, "show", recorded.waiting)
        assert result.code == 0, result.stderr
    else:
        result = invoke("--db", path, verb, recorded.waiting, "--approval", approval,
                        "--by", "op")
        if column != "id":
            assert result.code == 1, result.stderr  # the hash no longer matches the request
    assert len(result.stdout_bytes) < 100_000, len(result.stdout_bytes)
    assert max(_line_lengths(result.stdout)) <= 4100 * 4
    check_answer(path, (verb,), result, before)
    if result.code != 0:
        assert snapshot(path) == before


def test_an_approval_id_cut_for_showing_is_not_offered_as_a_command(recorded, tmp_path):
    path = copy_of(recorded, str(tmp_path))
    conn = apsw.Connection(path)
    conn.execute("UPDATE approvals SET id = ? WHERE id = ?", ("i" * 60_000, recorded.approval))
    conn.close()
    shown = invoke("--db", path, "show", recorded.waiting)
    assert shown.code == 0, shown.stderr
    assert "decide with:" not in shown.stdout
    normal = invoke("--db", recorded.path, "show", recorded.waiting)
    assert f"--approval {recorded.approval}" in normal.stdout


def test_a_run_with_100k_events_and_steps_is_read_a_page_at_a_time_with_a_note(tmp_path):
    path = str(tmp_path / "big.db")
    store = open_store(path)
    at = datetime(2026, 10, 1, 9, tzinfo=UTC)
    with store.tx() as tx:
        tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) VALUES "
                   "('big', 'g', 'RUNNING', '{}', '2026-10-01T09:00:00Z')")
        for i in range(100_000):
            tx.append("big", "", at, "step.started", b'{"index":%d}' % i)
        tx.execute("WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n "
                   "WHERE i < 99999) INSERT INTO steps (id, run_id, idx, status, started_at) "
                   "SELECT 'st' || i, 'big', i, 'running', '2026-10-01T09:00:00Z' FROM n")
    store.close()
    notes = {
        ("show", "big"): "... 99500 more step(s); rerun with --offset 500",
        ("events", "big"): "... 99500 more event(s); rerun with --offset 500",
        ("events", "big", "--json"): '{"meta":true,"truncated":true,"total":100000,'
                                     '"returned":500,"offset":0}',
        ("show", "big", "--limit", "3", "--offset", "99998"): "STEP",
    }
    for args, note in notes.items():
        result = invoke("--db", path, *args)
        assert result.code == 0, result.stderr
        assert len(result.stdout.splitlines()) <= 520, args
        assert note in result.stdout, (args, result.stdout[-300:])
    doc = json.loads(invoke("--db", path, "show", "big", "--json").stdout)
    assert (len(doc["steps"]), doc["steps_total"], doc["steps_truncated"]) == (500, 100_000, True)
    checked = invoke("--db", path, "verify")
    assert checked.code == 0 and "intact: 100000 event(s)" in checked.stdout


@pytest.mark.parametrize("args", [["show"], ["show", "--json"],
                                  ["approve", "--yes", "--by", "bob"]],
                         ids=["show", "show-json", "approve"])
def test_an_approval_nested_too_deep_to_bound_is_shown_or_decided_without_a_traceback(
        tmp_path, args):
    kit = Kit(str(tmp_path / "deep.db"))
    try:
        run = kit.waiting()
    finally:
        kit.close()
    conn = apsw.Connection(kit.path)
    conn.execute("UPDATE approvals SET presentation_json = ?",
                 ('{"x":' + "[" * 600 + '"' + "y" * 3000 + '"' + "]" * 600 + "}",))
    conn.close()
    result = invoke("--db", kit.path, args[0], run.id, *args[1:])
    # Shown; approving it is refused in one sentence, its hash no longer matching.
    assert result.code == (1 if args[0] == "approve" else 0), result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") <= 1

"""Files crafted to get past the opening rules, and stored values no runtime
writes: each is refused in one sentence and changes nothing."""
import os
import subprocess
import sys
from datetime import UTC, datetime

import apsw
import pytest

from agentrt.errors import AgentrtError, InsecureModeError, UnsafeSchemaError
from agentrt.store import open_existing, open_store
from agentrt.store.tx import StoreWriteError
from agentrt.timefmt import parse_time


def _db(tmp_path, name="a.db"):
    p = str(tmp_path / name)
    s = open_store(p)
    with s.tx() as tx:
        tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) VALUES "
                   "('r', 'g', 'RUNNING', '{}', '2026-10-01T09:00:00Z')")
    s.close()
    return p


@pytest.mark.parametrize("disguise", ["TRIGGER", "Trigger", "VIEW"])
@pytest.mark.parametrize("opener", ["ro", "rw", "store"])
def test_a_trigger_or_view_typed_in_another_case_is_refused(tmp_path, disguise, opener):
    p = _db(tmp_path)
    c = apsw.Connection(p)
    c.execute("CREATE VIEW x AS SELECT 1" if disguise == "VIEW" else
              "CREATE TRIGGER x AFTER INSERT ON events BEGIN "
              "UPDATE runs SET goal = 'author' WHERE id = NEW.run_id; END")
    c.execute("PRAGMA writable_schema=ON")
    c.execute("UPDATE sqlite_schema SET type = ? WHERE name = 'x'", (disguise,))
    c.close()
    with pytest.raises(UnsafeSchemaError):
        {"ro": lambda: open_existing(p), "rw": lambda: open_existing(p, read_only=False),
         "store": lambda: open_store(p)}[opener]()


def test_open_store_through_a_symlink_applies_the_mode_rules_to_the_files_sqlite_uses(tmp_path):
    real = _db(tmp_path, "real.db")
    link = str(tmp_path / "link.db")
    os.symlink(real, link)
    os.chmod(real, 0o644)
    s = open_store(link)
    try:
        modes = {n: oct(os.stat(real + n).st_mode & 0o777) for n in ("", "-wal", "-shm")}
    finally:
        s.close()
    assert modes == {"": "0o600", "-wal": "0o600", "-shm": "0o600"}


def test_open_store_refuses_a_wal_others_can_write_behind_a_symlink(tmp_path):
    real = _db(tmp_path, "real.db")
    link = str(tmp_path / "link.db")
    os.symlink(real, link)
    live = apsw.Connection(real)  # a live writer keeps its -wal
    live.execute("CREATE TABLE consumer(x); INSERT INTO consumer VALUES (1)")
    os.chmod(real + "-wal", 0o666)
    try:
        with pytest.raises(InsecureModeError, match="writable by group or others"):
            open_store(link).close()
    finally:
        live.close()


def test_open_store_creates_the_database_a_dangling_symlink_names(tmp_path):
    link = str(tmp_path / "link.db")
    os.symlink(str(tmp_path / "real.db"), link)
    open_store(link).close()
    assert os.path.isfile(tmp_path / "real.db")


@pytest.mark.parametrize("damage", [
    "CREATE TRIGGER t AFTER INSERT ON runs BEGIN SELECT 1; END",
    "INSERT INTO schema_migrations VALUES (7, '')",
    "DROP TABLE schema_migrations",
])
def test_a_read_write_open_existing_that_refuses_leaves_the_mode_as_it_was(tmp_path, damage):
    p = _db(tmp_path)
    c = apsw.Connection(p)
    c.execute(damage)
    c.close()
    os.chmod(p, 0o640)
    with pytest.raises(AgentrtError):
        open_existing(p, read_only=False)
    assert oct(os.stat(p).st_mode & 0o777) == "0o640"


@pytest.mark.parametrize("value", ["six", b"\x06"])
def test_a_schema_version_that_is_not_an_integer_is_one_sentence_from_the_cli(tmp_path, value):
    p = _db(tmp_path)
    c = apsw.Connection(p)
    c.execute("DROP TABLE schema_migrations; "
              "CREATE TABLE schema_migrations (version, applied_at TEXT NOT NULL)")
    c.execute("INSERT INTO schema_migrations VALUES (?, '')", (value,))
    c.close()
    r = subprocess.run([sys.executable, "-m", "agentrt.cli", "--db", p, "runs"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr[-300:]
    assert "not an integer" in r.stderr


def test_a_spent_seq_is_one_sentence_not_an_overflow(tmp_path):
    p = _db(tmp_path)
    s = open_store(p)
    with s.tx() as tx:
        tx.append("r", "", datetime.now(UTC), "run.created", {})
    s.close()
    c = apsw.Connection(p)
    c.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'events'", (2**63 - 1,))
    c.close()
    s = open_store(p)
    try:
        with pytest.raises(StoreWriteError, match="used every seq"), s.tx() as tx:
            tx.append("r", "", datetime.now(UTC), "run.started", {})
    finally:
        s.close()
    with open_existing(p) as store:
        assert [e.type for e in store.list_events("r")] == ["run.created"]


@pytest.mark.parametrize("text", ["2026-10-01T09:00:00.123456zZ",
                                  "2026-10-01T09:00:00.012342 56Z"])
def test_parse_time_refuses_what_is_not_rfc3339(text):
    with pytest.raises(ValueError):
        parse_time(text)


_AT = datetime(2026, 10, 1, tzinfo=UTC)


def _three_events_then(path: str, *edits: str) -> int:
    """A store with events 1-3, edited by another connection (``edits``, which end
    by deleting the newest event): the seq the writer gives the next event."""
    with open_store(path) as store, store.tx() as tx:
        tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) "
                   "VALUES ('r', 'g', 'RUNNING', '{}', '')")
        for i in range(3):
            tx.append("r", "", _AT, "run.started", {"i": i})
    conn = apsw.Connection(path)
    for sql in edits:
        conn.execute(sql)
    conn.close()
    with open_store(path) as store:
        with store.tx() as tx:
            tx.append("r", "", _AT, "run.started", {"i": 3})
        return store.chain_head()[0]


def test_a_seq_is_never_reused_when_events_is_named_in_another_case(tmp_path):
    """SQLite's names ignore case and sqlite_sequence keeps the name as written:
    for a table renamed "Events" the writer no longer saw the seqs handed out,
    and gave the seq of a deleted newest event to the next one (a follower's
    cursor past it skipped the new event)."""
    assert _three_events_then(str(tmp_path / "a.db"), "ALTER TABLE events RENAME TO ev_tmp",
                              "ALTER TABLE ev_tmp RENAME TO Events",
                              "DELETE FROM Events WHERE seq = 3") == 4


def test_a_stray_sequence_row_in_another_case_is_not_the_events_tables(tmp_path):
    """AUTOINCREMENT keeps the row named as the table was created; a second row
    named "EVENTS" (an edited file) must not decide the next seq, which could
    then be reused or skip ahead (review of 3842ca4)."""
    assert _three_events_then(
        str(tmp_path / "a.db"), "UPDATE sqlite_sequence SET rowid = 10 WHERE name = 'events'",
        "INSERT INTO sqlite_sequence (rowid, name, seq) VALUES (1, 'EVENTS', 0)",
        "DELETE FROM events WHERE seq = 3") == 4

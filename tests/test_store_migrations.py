"""Migrations 1-6: forward only, one transaction, and older databases keep their runs."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime, timedelta

import apsw
import pytest
from store_helpers import T0, build_old_database, file_state, raw

from agentrt import DEFAULT_LEASE_TTL, SchemaVersionError, chain_hash, open_existing, open_store
from agentrt.records import PRE_LEASE_OWNER
from agentrt.store import migrations, opening
from agentrt.store.migrations import MIGRATIONS
from agentrt.store.opening import StoreOpenError


def test_released_migrations_are_unchanged():
    """A released migration is never edited: these are the texts databases were built with."""
    def digest(texts: tuple[str, ...]) -> str:
        return hashlib.sha256("\0".join(texts).encode()).hexdigest()

    assert len(MIGRATIONS) == 6
    assert digest(MIGRATIONS[:4]) == (
        "e7c9fa8bd68e9ba9f5987750d5a9228820173569f3e9eb046a7eb4a62f98da33")
    assert digest(MIGRATIONS[:5]) == (
        "3764a266e52481967cf4352b28fae47168efecb937b683dc14850a0f4bc75e91")
    assert digest(MIGRATIONS[5:6]) == (
        "8426f6d8c864c82df5499c0d22e06d29812aa9c5599ba15d38a5e9551f962f4f")


def test_new_database_has_every_table_and_version(tmp_path):
    with open_store(str(tmp_path / "a.db")) as store:
        conn = store.db()
        tables = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table'")}
        assert {"runs", "steps", "events", "approvals", "model_calls", "tool_specs",
                "schema_migrations"} <= tables
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations")]
        assert versions == [1, 2, 3, 4, 5, 6]
        cols = {r[1] for r in conn.execute("PRAGMA table_info(events)")}
        assert cols == {"seq", "run_id", "step_id", "at", "type", "payload_json", "hash"}


# -- an older release's database ---------------------------------------------------

RUNS = [
    # id, status, goal, reason, result, step_count, created
    ("run-a", "COMPLETED", "ship the release", "goal_completed", '{"done":true}', 2, T0),
    ("run-b", "RUNNING", "fix the build", "", "", 1, T0 + timedelta(minutes=1)),
    ("run-c", "WAITING_FOR_APPROVAL", "push <main> & tag", "", "", 1,
     T0 + timedelta(minutes=2)),
    ("run-d", "RUNNING", "second running run", "", "", 0, T0 + timedelta(minutes=3)),
]


def _fmt(t: datetime) -> str:
    from agentrt.timefmt import format_time

    return format_time(t)


def _old_rows(conn: apsw.Connection) -> None:
    for run_id, status, goal, reason, result, steps, created in RUNS:
        conn.execute(
            "INSERT INTO runs (id, goal, status, reason, limits_json, step_count, created_at, "
            "started_at, result_json, model_calls, input_tokens, active_ms) "
            "VALUES (?, ?, ?, ?, '{\"max_steps\":50,\"max_consecutive_tool_failures\":3,"
            "\"loop_threshold\":3}', ?, ?, ?, ?, 2, 120, 1500)",
            (run_id, goal, status, reason, steps, _fmt(created), _fmt(created), result))
    conn.execute(
        "INSERT INTO steps (id, run_id, idx, status, decision_json, started_at) VALUES "
        "('s1', 'run-a', 0, 'done', '{\"kind\":\"tool_call\",\"tool\":\"echo\"}', ?)",
        (_fmt(T0),))
    # Events inserted out of seq order: the chain must follow seq, not insertion.
    events = [
        (3, "run-b", "", T0 + timedelta(seconds=3), "run.started", "{}"),
        (1, "run-a", "", T0, "run.created", '{"goal":"ship the release"}'),
        (2, "run-a", "s1", T0 + timedelta(seconds=1.5), "step.started", '{"index":0}'),
        (4, "run-c", "", T0 + timedelta(seconds=4), "approval.requested",
         '{"approval_id":"ap1","reason":"needs a human"}'),
        (5, "run-a", "", T0 + timedelta(seconds=5), "run.finished", '{"status":"COMPLETED"}'),
    ]
    for seq, run_id, step_id, at, type_, payload in events:
        conn.execute(
            "INSERT INTO events (seq, run_id, step_id, at, type, payload_json) "
            "VALUES (?, ?, ?, ?, ?, ?)", (seq, run_id, step_id, _fmt(at), type_, payload))


def _run_columns(conn: apsw.Connection) -> list[tuple[object, ...]]:
    return list(conn.execute(
        "SELECT id, goal, status, reason, reason_detail, limits_json, step_count, created_at, "
        "started_at, finished_at, result_json, model_calls, input_tokens, active_ms "
        "FROM runs ORDER BY rowid"))


def _expected_chain(conn: apsw.Connection) -> list[str]:
    prev, out = "", []
    for seq, run_id, step_id, at, type_, payload in conn.execute(
            "SELECT seq, run_id, step_id, at, type, payload_json FROM events ORDER BY seq"):
        prev = chain_hash(prev, seq, run_id, step_id, at, type_, payload)
        out.append(prev)
    return out


def _build(path, version: int) -> list[tuple[object, ...]]:
    conn = build_old_database(path, version)
    _old_rows(conn)
    if version >= 5:  # a v0.3 driver held run-b under its own lease
        conn.execute("UPDATE runs SET lease_owner = 'host-1/loop', "
                     "lease_expires_at = '2026-10-01T09:10:00Z' WHERE id = 'run-b'")
    before = _run_columns(conn)
    conn.close()
    os.chmod(path, 0o600)
    return before


def test_version_4_database_migrates_with_its_runs_and_placeholder_leases(tmp_path):
    path = tmp_path / "v4.db"
    before = _build(path, 4)
    opened = datetime.now(UTC)
    with open_store(str(path)) as store:
        conn = store.db()
        assert _run_columns(conn) == before
        assert [r.id for r in store.list_runs()] == ["run-d", "run-c", "run-b", "run-a"]
        assert store.get_run("run-a").result == b'{"done":true}'
        assert [s.id for s in store.list_steps("run-a")] == ["s1"]
        # Migration 5: every RUNNING run gets one lease of grace under the placeholder.
        for run_id in ("run-b", "run-d"):
            owner, expires = store.lease(run_id)
            assert owner == PRE_LEASE_OWNER == "agentrt:pre-lease-version"
            assert expires is not None
            assert opened + DEFAULT_LEASE_TTL - timedelta(seconds=1) <= expires
            assert expires <= datetime.now(UTC) + DEFAULT_LEASE_TTL
        for run_id in ("run-a", "run-c"):
            assert store.lease(run_id) == ("", None)
        # Migration 6: every stored event chained in seq order.
        hashes = [r[0] for r in conn.execute("SELECT hash FROM events ORDER BY seq")]
        assert hashes == _expected_chain(conn)
        assert hashes[0] == chain_hash("", 1, "run-a", "", "2026-10-01T09:00:00Z",
                                       "run.created", '{"goal":"ship the release"}')
        report = store.verify_events()
        assert report.intact and report.checked == 5
        # New events extend the migrated chain.
        with store.tx() as tx:
            tx.append("run-b", "", T0, "run.resumed", {})
        assert store.verify_events().checked == 6
    with open_existing(str(path)) as store:
        assert store.verify_events().intact


def test_version_5_database_migrates_keeping_its_leases_and_chaining_its_events(tmp_path):
    path = tmp_path / "v5.db"
    before = _build(path, 5)
    with open_store(str(path)) as store:
        conn = store.db()
        assert _run_columns(conn) == before
        # Migration 5 ran long ago: its placeholder is not handed out again.
        assert store.lease("run-b") == ("host-1/loop",
                                        datetime(2026, 10, 1, 9, 10, tzinfo=UTC))
        assert store.lease("run-d") == ("", None)
        hashes = [r[0] for r in conn.execute("SELECT hash FROM events ORDER BY seq")]
        assert hashes == _expected_chain(conn) and all(len(h) == 64 for h in hashes)
        assert [r[0] for r in conn.execute("SELECT version FROM schema_migrations")] == [
            1, 2, 3, 4, 5, 6]


def test_same_events_get_the_same_hashes_on_re_migration(tmp_path):
    chains = []
    for name in ("one.db", "two.db"):
        path = tmp_path / name
        _build(path, 4)
        with open_store(str(path)) as store:
            chains.append([r[0] for r in store.db().execute(
                "SELECT hash FROM events ORDER BY seq")])
    assert chains[0] == chains[1]


def test_migration_backfills_long_events_in_chunks(tmp_path):
    path = tmp_path / "v5.db"
    conn = build_old_database(path, 5)
    conn.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) "
                 "VALUES ('r', 'g', 'COMPLETED', '{}', '2026-10-01T09:00:00Z')")
    big = '{"content":"' + "é" * 100_000 + '"}'  # 200 KB: several 64 KiB chunks
    conn.execute("INSERT INTO events (run_id, at, type, payload_json) "
                 "VALUES ('r', '2026-10-01T09:00:00Z', 'step.tool_finished', ?)", (big,))
    conn.close()
    os.chmod(path, 0o600)
    with open_store(str(path)) as store:
        (stored,) = store.db().execute("SELECT hash FROM events").fetchone()
        assert stored == chain_hash("", 1, "r", "", "2026-10-01T09:00:00Z",
                                    "step.tool_finished", big.encode())


def test_migrations_apply_in_one_transaction(tmp_path, monkeypatch):
    """A migration that fails leaves the database at its old version, untouched."""
    path = tmp_path / "v5.db"
    conn = build_old_database(path, 5)
    _old_rows(conn)
    conn.execute("CREATE TABLE tool_specs (unrelated TEXT)")  # migration 6 cannot create it
    conn.close()
    os.chmod(path, 0o600)
    # Past the check that refuses such a file before writing (tested below): the
    # migration itself fails, part-way.
    monkeypatch.setattr(opening, "migration_clash", lambda conn, version: None)
    with pytest.raises(Exception, match="tool_specs already exists"):
        open_store(str(path))
    conn = raw(path)
    assert conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone() == (5,)
    cols = {r[1] for r in conn.execute("PRAGMA table_info(events)")}
    assert "hash" not in cols  # the ALTERs before the failure were rolled back too
    conn.close()


def _changed_database(tmp_path, version: int, change: str) -> str:
    """other.db (0600, rollback journal): another program's new file (version 0), or
    an older release's database at ``version``, with ``change`` made to it."""
    path = str(tmp_path / "other.db")
    if version:
        build_old_database(path, version).close()
        conn = raw(path)
        conn.execute("PRAGMA journal_mode=DELETE")
    else:
        conn = apsw.Connection(path)
    conn.execute(change)
    conn.close()
    os.chmod(path, 0o600)
    return path


@pytest.mark.parametrize(("version", "change", "said"), [
    (0, "CREATE TABLE runs (x); INSERT INTO runs VALUES (1)",
     "holds a table named runs, which agentrt creates"),
    (0, "CREATE TABLE other (x); CREATE INDEX Events_Run ON other (x)",
     "holds an index named events_run, which agentrt creates"),
    (5, "CREATE TABLE tool_specs (unrelated TEXT)",
     "holds a table named tool_specs, which agentrt creates"),
    (5, "ALTER TABLE events ADD COLUMN Hash TEXT",
     "has a column hash in its table events, which agentrt adds"),
    (3, "ALTER TABLE runs ADD COLUMN lease_owner TEXT",
     "has a column lease_owner in its table runs, which agentrt adds"),
    (3, "DROP TABLE approvals",
     "has no table approvals, which agentrt's migrations add a column to"),
])
def test_a_file_the_migrations_could_not_complete_is_refused_before_anything_is_written(
        tmp_path, version, change, said):
    """Another program's database with one of the runtime's names, or an older
    one whose tables another program changed: refused in one sentence, the file
    as it was (not even switched to WAL, which a failed migration left it)."""
    path = _changed_database(tmp_path, version, change)
    before = file_state(path)
    with pytest.raises(StoreOpenError) as info:
        open_store(path)
    assert str(info.value) == (
        f"agentrt: open store: {path} {said}, so it cannot be migrated to agentrt's schema: it "
        "is another program's database, or one another program changed; nothing was written: "
        "name a new file, or open a copy agentrt made")
    assert file_state(path) == before
    assert sorted(os.listdir(tmp_path)) == ["other.db"]


@pytest.mark.parametrize(("version", "change", "said"), [
    (0, "CREATE TABLE schema_migrations (version varchar NOT NULL PRIMARY KEY)",
     "table schema_migrations has no column named applied_at"),
    (0, "CREATE TABLE t (x); CREATE INDEX schema_migrations ON t (x)",
     "there is already an index named schema_migrations"),
    (4, "ALTER TABLE runs DROP COLUMN status", "no such column: status"),
    (0, "CREATE VIRTUAL TABLE notes USING fts5(body); CREATE TABLE schema_migrations "
        "(version varchar NOT NULL PRIMARY KEY)",
     "table schema_migrations has no column named applied_at"),
    (4, "CREATE VIRTUAL TABLE places USING rtree(id, x0, x1); "
        "ALTER TABLE runs DROP COLUMN status", "no such column: status"),
    (0, "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT "
        "NULL, checksum TEXT NOT NULL)",
     "NOT NULL constraint failed: schema_migrations.checksum"),
], ids=["another-programs-schema_migrations", "an-index-so-named", "a-column-a-side-step-reads",
        "beside-a-search-index", "beside-an-rtree", "a-constraint-of-its-own"])
def test_a_file_whose_migrations_would_fail_is_refused_with_sqlites_words_before_writing(
        tmp_path, version, change, said):
    """What the names alone do not tell: the migrations are rehearsed on an empty
    in-memory copy of the file's schema, side steps included."""
    path = _changed_database(tmp_path, version, change)
    before = file_state(path)
    with pytest.raises(StoreOpenError) as info:
        open_store(path)
    assert str(info.value) == (
        f"agentrt: open store: {path} fails its migrations ({said}), so it cannot be migrated "
        "to agentrt's schema: it is another program's database, or one another program "
        "changed; nothing was written: name a new file, or open a copy agentrt made")
    assert file_state(path) == before


class _Rows:
    """A virtual table module of another program's (not in the runtime's SQLite)."""

    def Create(self, db, modulename, dbname, tablename, *args):  # noqa: N802
        return "CREATE TABLE x(a)", _RowsTable()

    Connect = Create


class _RowsTable:
    def BestIndex(self, *args):  # noqa: N802
        return None

    def Disconnect(self):  # noqa: N802
        pass

    Destroy = Disconnect


def test_a_virtual_table_of_a_module_this_sqlite_lacks_leaves_the_rest_rehearsed(tmp_path):
    """The copy cannot make it (and no migration touches it): left out, the
    rest is still rehearsed, and the clash beside it refused before writing."""
    path = str(tmp_path / "other.db")
    conn = apsw.Connection(path)
    conn.create_module("theirs", _Rows())
    conn.execute("CREATE VIRTUAL TABLE v USING theirs()")
    conn.execute("CREATE TABLE schema_migrations (version varchar NOT NULL PRIMARY KEY)")
    conn.close()
    os.chmod(path, 0o600)
    before = file_state(path)
    with pytest.raises(StoreOpenError, match=r"fails its migrations \(table schema_migrations "
                                             r"has no column named applied_at\)"):
        open_store(path)
    assert file_state(path) == before


def test_a_file_of_other_tables_only_takes_the_runtime_s_beside_them(tmp_path):
    path = str(tmp_path / "shared.db")
    conn = apsw.Connection(path)
    conn.execute("CREATE TABLE inventory (item TEXT); INSERT INTO inventory VALUES ('bolt')")
    conn.close()
    os.chmod(path, 0o600)
    with open_store(path) as store:
        assert store.db().execute("SELECT item FROM inventory").fetchall() == [("bolt",)]


@pytest.mark.parametrize("version", [-1, -3])
def test_a_negative_schema_version_is_refused_by_every_opener_before_anything_is_written(
        tmp_path, version):
    """Neither older nor newer: migrating it ran the last migration first (a
    negative index) and failed inside, the file switched to WAL."""
    path = str(tmp_path / "neg.db")
    conn = apsw.Connection(path)
    conn.execute("CREATE TABLE schema_migrations "
                 "(version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
    conn.execute("INSERT INTO schema_migrations VALUES (?, '2026-01-01T00:00:00Z')", (version,))
    conn.close()
    os.chmod(path, 0o600)
    before = file_state(path)
    for opener in (open_store, open_existing):
        with pytest.raises(SchemaVersionError) as info:
            opener(path)
        assert str(info.value) == (
            f"agentrt: database schema version does not match this build: {path} is at version "
            f"{version}, which no agentrt build writes: it is not a database an agentrt consumer "
            "made; name the file one made")
        assert file_state(path) == before


def test_a_build_that_knows_fewer_migrations_refuses_the_migrated_database(
        tmp_path, monkeypatch):
    path = str(tmp_path / "a.db")
    open_store(path).close()
    os.chmod(path, 0o600)
    before = file_state(path)
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[:5])  # an older build
    with pytest.raises(SchemaVersionError) as info:
        open_store(path)
    assert "the database is at version 6, this build knows 5" in str(info.value)
    assert file_state(path) == before


def test_open_existing_never_migrates(tmp_path):
    path = tmp_path / "v4.db"
    _build(path, 4)
    before = file_state(path)
    for read_only in (True, False):
        with pytest.raises(SchemaVersionError):
            open_existing(str(path), read_only=read_only)
    assert file_state(path) == before


def test_consumer_tables_survive_and_do_not_trouble_the_migrator(tmp_path):
    path = tmp_path / "mine.db"
    conn = raw(path)
    conn.execute("CREATE TABLE my_orders (id INTEGER PRIMARY KEY, what TEXT)")
    conn.execute("INSERT INTO my_orders (what) VALUES ('a widget')")
    conn.close()
    os.chmod(path, 0o600)
    with open_store(str(path)) as store:
        assert store.db().execute("SELECT what FROM my_orders").fetchall() == [("a widget",)]
        with store.tx() as tx:  # a consumer's write in the runtime's transaction
            tx.execute("INSERT INTO my_orders (what) VALUES ('another')")
    with open_store(str(path)) as store:
        assert store.db().execute("SELECT COUNT(*) FROM my_orders").fetchone() == (2,)

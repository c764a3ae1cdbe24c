"""Opening rules: owner-only files, hardened connections, the two openers, bad input."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import apsw
import pytest
from store_helpers import (
    build_old_database,
    child_env,
    file_state,
    fill,
    insert_run,
    mode_of,
    raw,
    tmpfs_mount,
    without_file_privileges,
)

import agentrt
from agentrt import (
    InsecureModeError,
    SchemaVersionError,
    SymlinkError,
    UnsafeSchemaError,
    open_existing,
    open_store,
)
from agentrt.store import ReadOnlyStoreError, StoreOpenError, opening

posix_modes = pytest.mark.skipif(sys.platform == "win32", reason="modes mean nothing there")


def new_db(tmp_path: Path, name: str = "a.db") -> str:
    path = str(tmp_path / name)
    with open_store(path) as store:
        fill(store, runs=1, events=1)
    return path


def make_sidecar(path: str, suffix: str = "-wal", mode: int = 0o600) -> str:
    side = path + suffix
    Path(side).write_bytes(b"")
    os.chmod(side, mode)
    return side


def entry_state(path: str | Path) -> tuple[object, ...]:
    """What :func:`file_state` records, for a path that may not be a regular file
    (a directory, a symlink, a FIFO: reading one would fail or block): its type,
    mode, owner and mtime_ns, not following a link, plus a link's target or a
    directory's entries."""
    st = os.lstat(path)
    extra: object = None
    if stat.S_ISLNK(st.st_mode):
        extra = os.readlink(path)
    elif stat.S_ISDIR(st.st_mode):
        extra = sorted(os.listdir(path))
    return (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
            st.st_mtime_ns, extra)


def one_sentence(message: str, path: str, fix: str) -> None:
    """A refusal is one line naming the file and the fix."""
    assert "\n" not in message
    assert path in message
    assert fix in message
    assert message.startswith("agentrt: ")


# -- reopening and memory -------------------------------------------------------


def test_reopened_file_store_keeps_its_rows(tmp_path):
    path = new_db(tmp_path)
    with open_store(path) as store:
        assert [r.id for r in store.list_runs()] == ["r0"]
        assert len(store.list_events("r0")) == 1
        assert store.path == path and not store.read_only


def test_memory_store_is_migrated_and_writable():
    with open_store(":memory:") as store:
        fill(store, runs=2, events=2)
        assert [r.id for r in store.list_runs()] == ["r1", "r0"]
        with store.lease_connection() as conn:
            assert conn is store.db()  # one connection for everything in memory


def test_store_is_a_context_manager_and_close_is_idempotent(tmp_path):
    store = open_store(str(tmp_path / "a.db"))
    with store:
        pass
    store.close()
    with pytest.raises(apsw.ConnectionClosedError):
        store.list_runs()


# -- modes ------------------------------------------------------------------------


@posix_modes
@pytest.mark.parametrize("umask", [0o000, 0o077, 0o022, 0o277])
def test_files_are_owner_only_under_any_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        path = str(tmp_path / "a.db")
        with open_store(path) as store:
            fill(store)
            files = [path, path + "-wal", path + "-shm"]
            assert all(os.path.exists(f) for f in files)
            assert {f: mode_of(f) for f in files} == {f: 0o600 for f in files}
    finally:
        os.umask(old)


@posix_modes
@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666, 0o660])
@pytest.mark.parametrize("opener", ["open_store", "open_existing", "open_existing_rw"])
def test_refuses_a_database_others_can_write(tmp_path, mode, opener):
    path = new_db(tmp_path)
    os.chmod(path, mode)
    before = file_state(path)
    with pytest.raises(InsecureModeError) as info:
        if opener == "open_store":
            open_store(path)
        else:
            open_existing(path, read_only=opener == "open_existing")
    err = info.value
    assert (err.path, stat.S_IMODE(err.mode), err.reason) == (
        path, mode, "writable by group or others")
    assert str(err) == (
        f"agentrt: {path} is {stat.filemode(stat.S_IFREG | mode)}, writable by group or "
        "others; the runtime keeps its database readable and writable by its owner only: "
        f"chmod 600 {path} and chown it to the user that runs the runtime"
    )
    one_sentence(str(err), path, "chmod 600")
    assert file_state(path) == before
    assert not os.path.exists(path + "-wal")


@posix_modes
@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
def test_refuses_a_wal_file_others_can_write(tmp_path, suffix):
    path = new_db(tmp_path)
    side = make_sidecar(path, suffix, 0o606)
    before = file_state(path)
    for open_it in (lambda: open_store(path), lambda: open_existing(path)):
        with pytest.raises(InsecureModeError) as info:
            open_it()
        assert info.value.path == side
        assert "writable by group or others" in str(info.value)
        one_sentence(str(info.value), side, "chmod 600")
    assert file_state(path) == before and mode_of(side) == 0o606


@posix_modes
def test_tightens_a_database_others_can_read(tmp_path):
    path = new_db(tmp_path)
    os.chmod(path, 0o644)
    side = make_sidecar(path, "-wal", 0o640)
    with open_store(path):
        assert mode_of(path) == 0o600
        assert mode_of(side) == 0o600
    os.chmod(path, 0o604)
    with open_existing(path, read_only=False):
        assert mode_of(path) == 0o600


@posix_modes
def test_read_only_open_leaves_an_others_readable_database_as_it_is(tmp_path):
    path = new_db(tmp_path)
    os.chmod(path, 0o644)
    side = make_sidecar(path, "-wal", 0o644)
    with open_existing(path) as store:
        assert [r.id for r in store.list_runs()] == ["r0"]
    assert mode_of(path) == 0o644 and mode_of(side) == 0o644


@posix_modes
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a file to another user needs root")
def test_refuses_a_wal_file_owned_by_another_user(tmp_path):
    path = new_db(tmp_path)
    side = make_sidecar(path)
    os.chown(side, 4242, 4242)
    before = file_state(path), file_state(side), entry_state(side)
    listing = sorted(os.listdir(tmp_path))
    for open_it in (lambda: open_store(path), lambda: open_existing(path)):
        with pytest.raises(InsecureModeError) as info:
            open_it()
        assert info.value.path == side
        assert info.value.reason == "owned by another user than the database"
        one_sentence(str(info.value), side, "chown")
        # Nothing written: not the database, not the other user's -wal (nor its owner).
        assert (file_state(path), file_state(side), entry_state(side)) == before
        assert sorted(os.listdir(tmp_path)) == listing


@posix_modes
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="reading another user's database needs root")
def test_root_reading_a_users_database_leaves_the_wal_files_to_that_user(tmp_path):
    # Otherwise the owner's next open would refuse root's -wal as another user's.
    path = new_db(tmp_path)
    os.chown(path, 4242, 4242)
    with open_existing(path) as store:
        store.list_runs()
    sidecars = [path + "-wal", path + "-shm"]
    assert [(os.stat(f).st_uid, mode_of(f)) for f in sidecars] == [(4242, 0o600)] * 2
    assert file_state(path)[2] == 0o600


@posix_modes
@pytest.mark.parametrize("kind", ["directory", "symlink", "fifo"])
def test_refuses_a_wal_path_that_is_not_a_regular_file(tmp_path, kind):
    path = new_db(tmp_path)
    side = path + "-wal"
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    os.chmod(target, 0o600)
    if kind == "directory":
        os.mkdir(side, 0o700)
    elif kind == "symlink":
        os.symlink(target, side)
    else:
        os.mkfifo(side, 0o600)
    before = file_state(path), entry_state(side), file_state(target)
    listing = sorted(os.listdir(tmp_path))
    for open_it in (lambda: open_store(path), lambda: open_existing(path)):
        with pytest.raises(InsecureModeError) as info:
            open_it()
        assert info.value.path == side
        assert info.value.reason == "which is not a regular file"
        # Nothing written: the database, the -wal path and what a link points to.
        assert (file_state(path), entry_state(side), file_state(target)) == before
        assert sorted(os.listdir(tmp_path)) == listing


# -- triggers, views and the hardened connections ----------------------------------


def edited_behind_the_store(tmp_path, sql: str) -> str:
    """A new database edited by ``sql`` through a plain connection, left in
    rollback-journal mode so that a switch to WAL would show in its bytes."""
    path = new_db(tmp_path)
    conn = raw(path)
    conn.execute(sql)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    return path


def every_opener(path: str) -> list:
    return [lambda: open_store(path), lambda: open_existing(path),
            lambda: open_existing(path, read_only=False)]


@pytest.mark.parametrize(
    ("kind", "sql"),
    [
        ("trigger", "CREATE TRIGGER t AFTER INSERT ON runs BEGIN DELETE FROM events; END"),
        ("view", "CREATE VIEW v AS SELECT * FROM runs"),
    ],
)
def test_refuses_triggers_and_views_with_both_openers(tmp_path, kind, sql):
    path = edited_behind_the_store(tmp_path, sql)
    before = file_state(path)
    name = "t" if kind == "trigger" else "v"
    for open_it in every_opener(path):
        with pytest.raises(UnsafeSchemaError) as info:
            open_it()
        assert str(info.value).startswith(
            f'agentrt: database holds a trigger or view: {path} has {kind} "{name}"')
        one_sentence(str(info.value), path, f'DROP {kind.upper()} "{name}"')
    assert file_state(path) == before


_EVENTS_REBUILT = (
    "ALTER TABLE events RENAME TO old; CREATE TABLE events ({seq} run_id TEXT NOT NULL, "
    "step_id TEXT NOT NULL DEFAULT '', at TEXT NOT NULL, type TEXT NOT NULL, "
    "payload_json TEXT NOT NULL, hash TEXT NOT NULL DEFAULT ''{key}); "
    "INSERT INTO events SELECT * FROM old; DROP TABLE old")
_APPROVALS_WITHOUT_ROWID = (
    "ALTER TABLE approvals RENAME TO old; CREATE TABLE {name} (id TEXT PRIMARY KEY, "
    "run_id TEXT, step_id TEXT, kind TEXT, capability_json TEXT, presentation_json TEXT, "
    "request_json TEXT, hash TEXT, status TEXT, created_at TEXT, decided_at TEXT, "
    "decided_by TEXT, note TEXT, expires_at TEXT) WITHOUT ROWID; DROP TABLE old")


@pytest.mark.parametrize(
    ("sql", "detail"),
    [
        ("DROP TABLE model_calls", "has no table model_calls"),
        ("ALTER TABLE steps DROP COLUMN policy_id", "has a table steps without its column "
                                                     "policy_id"),
        # Rebuilt with seq as a plain column: no longer the rowid that orders the events.
        ("ALTER TABLE events RENAME TO old; CREATE TABLE events (seq TEXT PRIMARY KEY, "
         "run_id TEXT, step_id TEXT, at TEXT, type TEXT, payload_json TEXT, hash TEXT); "
         "INSERT INTO events SELECT * FROM old; DROP TABLE old",
         "has a table events whose seq is not its INTEGER PRIMARY KEY"),
        # An INTEGER key that SQLite keeps in an index of its own, not the rowid
        # the page reads cut long payloads by: they would hand out another row's.
        (_EVENTS_REBUILT.format(seq="seq INTEGER PRIMARY KEY DESC,", key=""),
         "has a table events whose seq is not its INTEGER PRIMARY KEY"),
        (_EVENTS_REBUILT.format(seq="seq INTEGER,", key=", PRIMARY KEY (seq, run_id)"),
         "has a table events whose seq is not its INTEGER PRIMARY KEY"),
        # Rebuilt without the rowid the page reads order by and cut big cells by.
        (_APPROVALS_WITHOUT_ROWID.format(name="approvals"), "has a table approvals WITHOUT ROWID"),
        # SQLite's names ignore case: "Approvals" is the approvals table.
        (_APPROVALS_WITHOUT_ROWID.format(name="Approvals"), "has a table approvals WITHOUT ROWID"),
        # A column named rowid: SELECT rowid would read its values instead.
        ("ALTER TABLE runs RENAME TO old; CREATE TABLE runs AS SELECT *, 1 AS rowid FROM old; "
         "DROP TABLE old", "has a table runs whose column rowid hides its rowid"),
    ],
    ids=["table", "column", "seq", "seq-desc", "seq-in-a-composite-key", "without-rowid",
         "without-rowid-named-in-capitals", "rowid-column"],
)
def test_a_table_another_program_changed_is_refused_by_both_openers_in_one_sentence(
        tmp_path, sql, detail):
    path = edited_behind_the_store(tmp_path, sql)
    before = file_state(path)
    for open_it in every_opener(path):
        with pytest.raises(StoreOpenError) as info:
            open_it()
        assert str(info.value) == (
            f"agentrt: open store: {path} {detail}, so it is not the agentrt schema its "
            "version says: another program changed it; open a backup, or a copy agentrt made")
    assert file_state(path) == before


def test_a_consumers_own_tables_and_columns_are_not_a_foreign_shape(tmp_path):
    path = edited_behind_the_store(
        tmp_path, "CREATE TABLE mine (x); ALTER TABLE runs ADD COLUMN my_note TEXT; "
        "CREATE TABLE kv (k TEXT PRIMARY KEY, v) WITHOUT ROWID")
    for open_it in every_opener(path):
        open_it().close()


def test_a_column_renamed_in_another_case_is_not_missing(tmp_path):
    """SQLite's names ignore case, so every read finds ``Goal`` as ``goal``."""
    path = edited_behind_the_store(tmp_path, "ALTER TABLE runs RENAME COLUMN goal TO Goal")
    for open_it in every_opener(path):
        open_it().close()


@pytest.mark.parametrize("seq", ["seq INTEGER PRIMARY KEY DESC", "seq INTEGER", ""],
                         ids=["key-in-an-index", "no-key", "no-seq"])
def test_an_older_file_whose_events_seq_is_not_the_rowid_is_refused_before_migrating(
        tmp_path, seq):
    """Migration 6 chains the events, reading long payloads by seq as the rowid:
    run on such a table it would commit hashes of other rows' payloads."""
    path = str(tmp_path / "old.db")
    conn = build_old_database(path, 5)
    columns = ("seq, " if seq else "") + "run_id, step_id, at, type, payload_json"
    conn.execute(f"ALTER TABLE events RENAME TO old; CREATE TABLE events ({seq}{', ' * bool(seq)}"
                 "run_id TEXT NOT NULL, step_id TEXT NOT NULL DEFAULT '', at TEXT "
                 "NOT NULL, type TEXT NOT NULL, payload_json TEXT NOT NULL); "
                 f"INSERT INTO events ({columns}) SELECT {columns} FROM old; DROP TABLE old")
    conn.close()
    before = file_state(path)
    with pytest.raises(StoreOpenError, match="has a table events whose seq is not its INTEGER"):
        open_store(path).close()
    assert file_state(path) == before


def test_an_older_file_without_an_events_table_is_refused_as_such_before_migrating(tmp_path):
    path = str(tmp_path / "old.db")
    conn = build_old_database(path, 5)
    conn.execute("DROP TABLE events")
    conn.close()
    before = file_state(path)
    with pytest.raises(StoreOpenError, match=r"old\.db has no table events, so it is not"):
        open_store(path).close()
    assert file_state(path) == before


def test_an_older_file_whose_table_another_program_rebuilt_is_refused_once_migrated(tmp_path):
    """Its shape is the runtime's only once its migrations ran, so it is checked then;
    before, such a file was migrated, accepted, and failed its page reads."""
    path = str(tmp_path / "old.db")
    conn = build_old_database(path, 5)
    columns = [str(r[1]) for r in conn.execute("PRAGMA table_info(approvals)")]
    conn.execute("ALTER TABLE approvals RENAME TO old; CREATE TABLE approvals (id TEXT PRIMARY "
                 "KEY, " + ", ".join(f"{c} TEXT" for c in columns[1:])
                 + ") WITHOUT ROWID; DROP TABLE old")
    conn.close()
    for _ in range(2):
        with pytest.raises(StoreOpenError, match="has a table approvals WITHOUT ROWID"):
            open_store(path).close()


def _pragmas(conn: apsw.Connection) -> dict[str, object]:
    def one(name: str) -> object:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]

    return {
        "trusted_schema": one("trusted_schema"),
        "defensive": conn.config(apsw.SQLITE_DBCONFIG_DEFENSIVE, -1),
        "foreign_keys": one("foreign_keys"),
        "busy_timeout": one("busy_timeout"),
        "journal_mode": one("journal_mode"),
        "synchronous": one("synchronous"),
    }


WRITER = {"trusted_schema": 0, "defensive": 1, "foreign_keys": 1, "busy_timeout": 5000,
          "journal_mode": "wal", "synchronous": 2}


@pytest.mark.parametrize("opener", ["open_store", "open_existing_rw"])
def test_writers_harden_both_connections(tmp_path, opener):
    path = new_db(tmp_path)
    store = open_store(path) if opener == "open_store" else open_existing(path, read_only=False)
    with store, store.lease_connection() as lease:
        assert lease is not store.db()
        assert _pragmas(store.db()) == WRITER
        assert _pragmas(lease) == WRITER


def test_writers_sync_every_commit_whatever_sqlites_default(tmp_path, monkeypatch):
    # Some SQLite builds default to synchronous=NORMAL; imitate one on every connection.
    monkeypatch.setattr(apsw, "connection_hooks",
                        [*apsw.connection_hooks,
                         lambda conn: conn.execute("PRAGMA synchronous=OFF")])
    path = new_db(tmp_path)
    for store in (open_store(path), open_existing(path, read_only=False)):
        with store, store.lease_connection() as lease:
            for conn in (store.db(), lease):
                assert conn.execute("PRAGMA synchronous").fetchone() == (2,)


def test_read_only_connection_is_hardened_too(tmp_path):
    path = new_db(tmp_path)
    with open_existing(path) as store:
        got = _pragmas(store.db())
        assert {k: got[k] for k in ("trusted_schema", "defensive", "busy_timeout")} == {
            "trusted_schema": 0, "defensive": 1, "busy_timeout": 5000}


def test_defensive_mode_refuses_writing_the_schema(tmp_path):
    path = new_db(tmp_path)
    with open_store(path) as store:
        for conn in (store.db(), store._lease_conn):
            assert conn is not None
            conn.execute("PRAGMA writable_schema=ON")
            with pytest.raises(apsw.Error, match="may not be modified"):
                conn.execute("UPDATE sqlite_schema SET sql = 'CREATE TABLE x(y)' "
                             "WHERE name = 'runs'")


def test_transactions_begin_immediate(tmp_path):
    path = new_db(tmp_path)
    with open_store(path) as store, store.tx() as tx:
        # IMMEDIATE takes the write lock at BEGIN: a second writer is shut out
        # before this transaction has written anything.
        other = raw(path)
        other.set_busy_timeout(0)
        with pytest.raises(apsw.BusyError):
            other.execute("BEGIN IMMEDIATE")
        other.close()
        assert tx.one("SELECT COUNT(*) FROM runs") == (1,)


# -- paths ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["we?ird.db", "ha#sh.db", "per%20cent.db", "a?b#c%d.db"])
def test_path_with_uri_characters_opens_the_file_it_names(tmp_path, name):
    folder = tmp_path / "dir?#%"
    folder.mkdir()
    path = str(folder / name)
    with open_store(path) as store:
        fill(store, runs=1, events=1)
    assert os.path.isfile(path)
    assert sorted(os.listdir(folder)) == [name]  # nothing made under a cut-short name
    assert sorted(os.listdir(tmp_path)) == ["dir?#%"]
    with open_existing(path) as store:
        assert [r.id for r in store.list_runs()] == ["r0"]


def test_relative_path_opens_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_store("rel#1.db") as store:
        fill(store, runs=1, events=0)
    assert os.path.isfile(tmp_path / "rel#1.db")


def test_open_store_follows_a_symbolic_link(tmp_path):
    path = new_db(tmp_path)
    link = str(tmp_path / "link.db")
    os.symlink(path, link)
    with open_store(link) as store:
        assert [r.id for r in store.list_runs()] == ["r0"]
        with store.tx() as tx:
            insert_run(tx, "via-link")
    with open_existing(path) as store:
        assert {r.id for r in store.list_runs()} == {"r0", "via-link"}


def test_open_existing_refuses_a_symbolic_link(tmp_path):
    path = new_db(tmp_path)
    link = str(tmp_path / "link.db")
    os.symlink(path, link)
    before = file_state(path)
    for read_only in (True, False):
        with pytest.raises(SymlinkError) as info:
            open_existing(link, read_only=read_only)
        assert info.value.path == link
        assert str(info.value) == (
            f"agentrt: database path is a symbolic link: {link}; name the database file itself")
    assert file_state(path) == before


def test_open_existing_refuses_what_is_not_a_regular_file(tmp_path):
    folder = tmp_path / "folder.db"
    folder.mkdir()
    fifo = tmp_path / "fifo.db"
    os.mkfifo(fifo)
    before = {p: entry_state(p) for p in (folder, fifo)}
    listing = sorted(os.listdir(tmp_path))
    for path in (str(folder), str(fifo)):
        for read_only in (True, False):
            with pytest.raises(StoreOpenError) as info:
                open_existing(path, read_only=read_only)
            assert str(info.value) == (
                f"agentrt: open store: {path} is not a regular file; "
                "name the database file itself")
            # Nothing written: no file inside the directory, no sidecar next to them.
            assert {p: entry_state(p) for p in (folder, fifo)} == before
            assert sorted(os.listdir(tmp_path)) == listing


def test_open_store_refuses_a_directory(tmp_path):
    folder = tmp_path / "folder.db"
    folder.mkdir()
    with pytest.raises(StoreOpenError, match="is not a regular file"):
        open_store(str(folder))


# -- open_existing: never creates, never migrates, one version ------------------------


def test_open_existing_never_creates(tmp_path):
    path = str(tmp_path / "missing.db")
    with pytest.raises(StoreOpenError) as info:
        open_existing(path)
    assert str(info.value) == (
        f"agentrt: open store: {path} does not exist; name an existing agentrt database file")
    assert os.listdir(tmp_path) == []


def test_open_existing_refuses_a_file_that_is_not_sqlite(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 100)
    os.chmod(path, 0o600)
    before = file_state(path)
    for open_it in every_opener(str(path)):
        with pytest.raises(StoreOpenError) as info:
            open_it()
        assert str(info.value) == (
            f"agentrt: open store: {path} is not a SQLite database; "
            "name the agentrt database file")
    assert file_state(path) == before
    assert sorted(os.listdir(tmp_path)) == ["notes.db"]


def test_open_existing_refuses_a_sqlite_file_that_is_not_agentrt(tmp_path):
    path = tmp_path / "other.db"
    conn = raw(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.close()
    os.chmod(path, 0o600)
    before = file_state(path)
    with pytest.raises(StoreOpenError) as info:
        open_existing(str(path))
    message = str(info.value)
    assert message.startswith(f"agentrt: open store: {path} is not an agent-runtime database")
    one_sentence(message, str(path), "name the database file an agentrt consumer created")
    assert file_state(path) == before


@pytest.mark.parametrize(("version", "newer"), [(4, "this build"), (5, "this build"),
                                                (7, "the database")])
def test_open_existing_refuses_either_other_version(tmp_path, version, newer):
    path = tmp_path / "old.db"
    conn = build_old_database(path, min(version, 6))
    if version == 7:
        conn.execute("INSERT INTO schema_migrations VALUES (7, '2027-01-01T00:00:00Z')")
    conn.close()
    os.chmod(path, 0o600)
    before = file_state(path)
    for read_only in (True, False):
        with pytest.raises(SchemaVersionError) as info:
            open_existing(str(path), read_only=read_only)
        err = info.value
        assert (err.found, err.known) == (version, 6)
        message = str(err)
        assert message.startswith(
            f"agentrt: database schema version does not match this build: {path} is at "
            f"version {version}, this build writes 6: {newer} is newer")
        one_sentence(message, str(path), "open")
    assert file_state(path) == before  # never migrated


def test_read_only_open_never_writes(tmp_path):
    path = new_db(tmp_path)
    os.chmod(path, 0o640)
    before = file_state(path)
    with open_existing(path) as store:
        assert store.read_only
        store.list_runs()
        store.list_events_after("", 0, 10)
        store.verify_events()
        refusal = "open_existing\\(path, read_only=False\\)"
        with pytest.raises(ReadOnlyStoreError, match=refusal), store.tx():
            pass
        with pytest.raises(apsw.ReadOnlyError):
            store.db().execute("DELETE FROM events")
    assert file_state(path) == before


def test_read_only_open_reads_uncheckpointed_wal_content(tmp_path):
    path = new_db(tmp_path)
    with open_store(path) as writer:
        with writer.tx() as tx:
            insert_run(tx, "in-the-wal")
        assert os.path.getsize(path + "-wal") > 0
        before = file_state(path)
        with open_existing(path) as reader:
            assert {r.id for r in reader.list_runs()} == {"r0", "in-the-wal"}
        assert file_state(path) == before


def test_open_store_refuses_a_newer_schema_and_leaves_it_unchanged(tmp_path):
    path = tmp_path / "newer.db"
    conn = build_old_database(path, 6)
    conn.execute("INSERT INTO schema_migrations VALUES (7, '2027-01-01T00:00:00Z')")
    conn.close()
    os.chmod(path, 0o644)
    before = file_state(path)
    with pytest.raises(SchemaVersionError) as info:
        open_store(str(path))
    assert (info.value.found, info.value.known) == (7, 6)
    assert str(info.value) == (
        f"agentrt: database schema version does not match this build: {path}: the database "
        "is at version 7, this build knows 6; open it with the agentrt build that migrated "
        "it to version 7")
    assert file_state(path) == before  # not switched to WAL, not tightened
    assert sorted(os.listdir(tmp_path)) == ["newer.db"]


def test_bad_input_messages_are_one_sentence_each(tmp_path):
    """Every refusal of the issue's bad-input list names the file and the fix."""
    messages = []
    path = new_db(tmp_path)
    os.chmod(path, 0o666)
    before = file_state(path)
    listing = sorted(os.listdir(tmp_path))
    with pytest.raises(InsecureModeError) as a:
        open_store(path)
    messages.append(str(a.value))
    assert file_state(path) == before  # not tightened, not written
    assert sorted(os.listdir(tmp_path)) == listing
    os.chmod(path, 0o600)
    link = str(tmp_path / "l.db")
    os.symlink(path, link)
    before = file_state(path), entry_state(link)
    listing = sorted(os.listdir(tmp_path))
    with pytest.raises(SymlinkError) as b:
        open_existing(link)
    messages.append(str(b.value))
    assert (file_state(path), entry_state(link)) == before
    assert sorted(os.listdir(tmp_path)) == listing
    with pytest.raises(StoreOpenError) as c:
        open_existing(str(tmp_path / "nope.db"))
    messages.append(str(c.value))
    assert (file_state(path), entry_state(link)) == before
    assert sorted(os.listdir(tmp_path)) == listing  # nope.db was not created
    for message in messages:
        assert "\n" not in message
        assert len(re.findall(r"\.\s+[A-Z]", message)) == 0  # no second sentence


# -- what keeps SQLite from the file: permissions, a read-only directory, a lock -------

_OPEN_AND_SAY = (
    "import sys\n"
    "from agentrt import open_existing\n"
    "try:\n"
    "    open_existing(sys.argv[1], read_only=sys.argv[2] == 'ro').close()\n"
    "except Exception as exc:\n"
    "    print(type(exc).__name__, exc)\n"
    "else:\n"
    "    print('opened')\n"
)


@posix_modes
@pytest.mark.parametrize(("case", "how", "says"), [
    ("mode-000", "ro", ["cannot be opened: permission denied, this user may not read it "
                        "(----------, owner uid {uid}); as its owner, chmod 600 {path}"]),
    ("mode-000", "rw", ["cannot be opened: permission denied, this user may not read and "
                        "write it (----------, owner uid {uid}); as its owner, chmod 600 {path}"]),
    ("read-only-file", "rw", ["is read-only to this user (-r--------, owner uid {uid}) and "
                              "this needs to write it: as its owner, chmod 600 {path}"]),
    ("read-only-file", "ro", []),
    ("read-only-directory", "rw", ["is in a directory this user cannot write ({dir}): to "
                                   "write the database SQLite creates a.db-wal and a.db-shm",
                                   "chmod u+w {dir}"]),
])
def test_an_open_that_permissions_refuse_says_the_cause_and_the_fix(tmp_path, case, how, says):
    prefix = without_file_privileges()
    folder = tmp_path / "d"
    folder.mkdir()
    path = new_db(folder)
    before = file_state(path)
    listing = sorted(os.listdir(folder))
    mode = {"mode-000": 0o000, "read-only-file": 0o400}.get(case, 0o600)
    os.chmod(path, mode)
    if case == "read-only-directory":
        os.chmod(folder, 0o500)
    try:
        done = subprocess.run([*prefix, sys.executable, "-c", _OPEN_AND_SAY, path, how],
                              capture_output=True, text=True, env=child_env(), timeout=60)
    finally:
        os.chmod(folder, 0o700)
        os.chmod(path, 0o600)
    assert done.returncode == 0, done.stderr
    said = done.stdout.strip()
    if not says:
        assert said == "opened"
    else:
        assert said.startswith(f"StoreOpenError agentrt: open store: {path} ")
        message = said[len("StoreOpenError "):]
        subs = {"{path}": path, "{dir}": str(folder), "{uid}": str(os.getuid())}
        for part in says:
            for key, value in subs.items():
                part = part.replace(key, value)
            assert part in message
        one_sentence(message, path, "chmod")
    assert file_state(path)[:2] == before[:2]  # not written
    # Nothing else beside it but the empty -wal and the -shm any read of a WAL file leaves.
    left = set(os.listdir(folder)) - set(listing)
    assert left <= {"a.db-wal", "a.db-shm"}
    assert "a.db-wal" not in left or os.path.getsize(path + "-wal") == 0


@pytest.mark.parametrize("read_only", [True, False])
def test_an_open_another_process_holds_locked_says_so_and_to_try_again(tmp_path, monkeypatch,
                                                                        read_only):
    path = new_db(tmp_path)
    other = raw(path)
    other.execute("PRAGMA journal_mode=DELETE")  # a rollback journal: its lock bars readers
    before = file_state(path)
    monkeypatch.setattr(opening, "BUSY_TIMEOUT_MS", 200)
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreOpenError) as info:
            open_existing(path, read_only=read_only)
    finally:
        other.execute("ROLLBACK")
        other.close()
    message = str(info.value)
    assert message == (
        f"agentrt: open store: {path} is locked: another process holds its write lock and "
        "kept it past the 0.2 s busy timeout; nothing was changed, try again when it has "
        "finished")
    assert file_state(path) == before


def test_public_names():
    assert agentrt.SCHEMA_VERSION == 6
    assert agentrt.MAX_PAGE_TEXT == 65536
    assert agentrt.open_store is open_store and agentrt.open_existing is open_existing
    assert agentrt.Store.__name__ == "Store"
    for name in ("NotFoundError", "RunStateError", "LeaseLostError", "NotPendingError",
                 "SchemaVersionError", "UnsafeSchemaError", "InsecureModeError",
                 "SymlinkError", "ApprovalHashError", "ApprovalExpiredError"):
        assert issubclass(getattr(agentrt, name), agentrt.AgentrtError)
    assert issubclass(agentrt.RunLeasedError, agentrt.RunStateError)


def test_a_database_on_a_read_only_file_system_is_read_and_writers_are_told_to_remount(
        tmp_path):
    """No -shm can be made there, so no writer can be live: the reader opens the
    file immutable, as in a directory it cannot write. Writers get the fix that
    applies (remount or copy), not the chmod that os.access would suggest."""
    mount = str(tmp_path / "mnt")
    path = os.path.join(mount, "ro.db")
    with tmpfs_mount(mount) as remount_read_only:
        with open_store(path) as store:
            fill(store, runs=2, events=3)
        assert sorted(os.listdir(mount)) == ["ro.db"]  # a clean close leaves no -wal or -shm
        before = file_state(path)
        remount_read_only()
        with open_existing(path) as reader:
            assert sorted(r.id for r in reader.list_runs()) == ["r0", "r1"]
            assert len(reader.list_events_after("", 0, 100)) == 6
        for opener in (lambda: open_store(path), lambda: open_existing(path, read_only=False)):
            with pytest.raises(StoreOpenError) as refused:
                opener()
            assert str(refused.value) == (
                f"agentrt: open store: {path} is on a read-only file system and this needs "
                "to write it: copy it to a writable one, or remount that one read-write")
        assert sorted(os.listdir(mount)) == ["ro.db"] and file_state(path) == before

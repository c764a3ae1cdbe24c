"""Opening edges: a file this user cannot write, a schema_migrations in another
case, a path naming a directory, Go's mode strings, sidecars a read left read-only."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from store_helpers import (
    build_old_database,
    child_env,
    file_state,
    fill,
    mode_of,
    raw,
    without_file_privileges,
)

from agentrt import InsecureModeError, SchemaVersionError, open_existing, open_store
from agentrt.errors import mode_string
from agentrt.store import StoreOpenError

posix_modes = pytest.mark.skipif(sys.platform == "win32", reason="modes mean nothing there")
as_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                             reason="giving a file to another user needs root")

TESTS = str(Path(__file__).resolve().parent)


def new_db(folder: Path, name: str = "a.db") -> str:
    path = str(folder / name)
    with open_store(path) as store:
        fill(store, runs=1, events=1)
    return path


def in_child(code: str, *args: str) -> str:
    """Run ``code`` in a process bound by file modes (root's bypass dropped); its stdout."""
    done = subprocess.run([*without_file_privileges(), sys.executable, "-c", code, *args],
                          capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# -- a database this user cannot write ---------------------------------------------

_EACH_WRITER = (
    "import sys\n"
    "from agentrt import open_existing, open_store\n"
    "for opener in (lambda p: open_existing(p, read_only=False), open_store):\n"
    "    try:\n"
    "        opener(sys.argv[1]).close()\n"
    "    except Exception as exc:\n"
    "        print(type(exc).__name__, exc)\n"
    "    else:\n"
    "        print('opened')\n"
)


@posix_modes
@pytest.mark.parametrize("case", ["own-0400", "another-users-0644"])
def test_open_store_refuses_a_database_this_user_cannot_write_as_open_existing_does(
        tmp_path, case):
    """SQLite opens such a file read-only without a word: accepted, the store's
    first write would fail as apsw.ReadOnlyError, after whatever came before it."""
    folder = tmp_path / "d"
    folder.mkdir()
    path = new_db(folder)
    if case == "own-0400":
        os.chmod(path, 0o400)
        fix = f"as its owner, chmod 600 {path}"
        shown = f"-r--------, owner uid {os.getuid()}"
    else:
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            pytest.skip("giving a file to another user needs root")
        os.chown(path, 4242, 4242)
        os.chmod(path, 0o644)
        fix = f"run agentrt as the user that owns it (uid 4242), or have that user chmod 600 {path}"
        shown = "-rw-r--r--, owner uid 4242"
    before = file_state(path)
    listing = sorted(os.listdir(folder))
    said = in_child(_EACH_WRITER, path).splitlines()
    sentence = (f"StoreOpenError agentrt: open store: {path} is read-only to this user "
                f"({shown}) and this needs to write it: {fix}")
    assert said == [sentence, sentence]
    assert file_state(path) == before
    assert sorted(os.listdir(folder)) == listing  # refused before any read made a -wal


# -- schema_migrations spelled in another case ---------------------------------------


def renamed_migrations(conn, name: str) -> None:
    conn.execute(f"ALTER TABLE schema_migrations RENAME TO tmp_sm; "
                 f"ALTER TABLE tmp_sm RENAME TO {name}")


@pytest.mark.parametrize("name", ["Schema_Migrations", "SCHEMA_MIGRATIONS"])
def test_a_newer_file_whose_schema_migrations_is_in_another_case_is_refused_before_wal(
        tmp_path, name):
    path = str(tmp_path / "newer.db")
    conn = build_old_database(path, 6)
    renamed_migrations(conn, name)
    conn.execute(f"INSERT INTO {name} VALUES (7, '2027-01-01T00:00:00Z')")
    conn.close()
    os.chmod(path, 0o600)
    before = file_state(path)
    with pytest.raises(SchemaVersionError) as info:
        open_store(path)
    assert (info.value.found, info.value.known) == (7, 6)
    assert file_state(path) == before  # not switched to WAL
    assert sorted(os.listdir(tmp_path)) == ["newer.db"]


def test_a_foreign_shape_whose_schema_migrations_is_in_another_case_is_refused_unwritten(
        tmp_path):
    path = new_db(tmp_path)
    conn = raw(path)
    renamed_migrations(conn, "Schema_Migrations")
    conn.execute("DROP TABLE model_calls")
    conn.execute("PRAGMA journal_mode=DELETE")  # a switch back to WAL would show
    conn.close()
    before = file_state(path)
    for opener in (open_store, open_existing):
        with pytest.raises(StoreOpenError) as info:
            opener(path)
        assert str(info.value) == (
            f"agentrt: open store: {path} has no table model_calls, so it is not the agentrt "
            "schema its version says: another program changed it; open a backup, or a copy "
            "agentrt made")
    assert file_state(path) == before


def test_an_older_file_whose_schema_migrations_is_in_another_case_is_checked_before_migrating(
        tmp_path):
    """Migration 6 would hash other rows' payloads through a seq that is not the rowid."""
    path = str(tmp_path / "old.db")
    conn = build_old_database(path, 5)
    renamed_migrations(conn, "Schema_Migrations")
    conn.execute("ALTER TABLE events RENAME TO old; CREATE TABLE events (seq INTEGER PRIMARY "
                 "KEY DESC, run_id TEXT NOT NULL, step_id TEXT NOT NULL DEFAULT '', at TEXT "
                 "NOT NULL, type TEXT NOT NULL, payload_json TEXT NOT NULL); DROP TABLE old")
    conn.execute("INSERT INTO events (seq, run_id, at, type, payload_json) VALUES "
                 "(1, 'r', 't', 'a', '{}'), (2, 'r', 't', 'b', '{}')")
    conn.close()
    before = file_state(path)
    with pytest.raises(StoreOpenError, match="has a table events whose seq is not its INTEGER"):
        open_store(path)
    assert file_state(path) == before


# -- a path that names a directory -----------------------------------------------------


#: Both openers, the reader in both modes.
_OPENERS = (open_store, open_existing, lambda p: open_existing(p, read_only=False))


@pytest.mark.parametrize("name", ["state/", "state//", "state/.", "./state/..", "/abs/state/"])
@pytest.mark.parametrize("exists", [False, True], ids=["missing", "a-directory"])
def test_a_path_naming_a_directory_is_refused_by_both_openers_before_anything_is_created(
        tmp_path, monkeypatch, name, exists):
    """realpath drops the trailing separator: open_store("state/") made a file named state."""
    monkeypatch.chdir(tmp_path)
    if name.startswith("/abs/"):
        name = str(tmp_path) + name[len("/abs"):]
    if exists:
        (tmp_path / "state").mkdir()
    listing = sorted(os.listdir(tmp_path))
    # The readers create nothing: a missing path is one that does not exist (below).
    for opener in _OPENERS if exists else _OPENERS[:1]:
        with pytest.raises(StoreOpenError) as info:
            opener(name)
        assert str(info.value) == (
            f"agentrt: open store: {name} names a directory, not a database file: name the "
            f"database file itself, such as {os.path.join(name, 'agentrt.db')}")
        assert sorted(os.listdir(tmp_path)) == listing
        if exists:
            assert os.listdir(tmp_path / "state") == []


@pytest.mark.parametrize("name", ["state/", "state//", "state/.", "./state/..", "/abs/state/"])
@pytest.mark.parametrize("read_only", [True, False])
def test_a_missing_path_ending_as_a_directory_does_not_exist_to_the_reader(
        tmp_path, monkeypatch, name, read_only):
    """open_existing creates nothing, so "names a directory" (and a made-up file
    to name inside it) said of a path with nothing there was wrong: it does not
    exist, as any missing path (docs/operator.md)."""
    monkeypatch.chdir(tmp_path)
    if name.startswith("/abs/"):
        name = str(tmp_path) + name[len("/abs"):]
    with pytest.raises(StoreOpenError) as info:
        open_existing(name, read_only=read_only)
    assert str(info.value) == (
        f"agentrt: open store: {name} does not exist; name an existing agentrt database file")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("tail", ["/", "//", "/.", "/.."])
def test_a_file_followed_by_a_slash_is_refused_as_that_not_as_a_directory_by_both_openers(
        tmp_path, monkeypatch, tail):
    """``ops.db/`` with ops.db a regular file was said to name a directory, with
    ``ops.db/agentrt.db`` to name instead, which cannot exist under a file."""
    monkeypatch.chdir(tmp_path)
    path = new_db(tmp_path, "ops.db")
    before = file_state(path)
    listing = sorted(os.listdir(tmp_path))
    name = "ops.db" + tail
    for opener in _OPENERS:
        with pytest.raises(StoreOpenError) as info:
            opener(name)
        assert str(info.value) == (
            f"agentrt: open store: {name} names the file ops.db followed by '{tail}', which "
            f"is not a directory: name the database file without the '{tail}', ops.db")
        assert sorted(os.listdir(tmp_path)) == listing
        assert file_state(path) == before


@pytest.mark.parametrize("target", ["state/", "state/.", "hop"])
def test_a_link_to_a_path_naming_a_directory_is_refused_before_anything_is_created(
        tmp_path, monkeypatch, target):
    """open_store follows links, and realpath dropped the link target's last
    part: a link to "state/" made a file named state (review of c7a2407)."""
    monkeypatch.chdir(tmp_path)
    if target == "hop":  # a link to a link to "state/."
        os.symlink("state/.", "hop")
    os.symlink(target, "db")
    listing = sorted(os.listdir(tmp_path))
    with pytest.raises(StoreOpenError) as info:
        open_store("db")
    assert str(info.value).startswith("agentrt: open store: db (a link to ")
    assert "names a directory, not a database file" in str(info.value)
    assert sorted(os.listdir(tmp_path)) == listing


# -- mode strings as Go's FileMode.String() prints them -----------------------------


GO_MODE_STRINGS = [
    (stat.S_IFREG | 0o600, "-rw-------"),
    (stat.S_IFREG | 0o666, "-rw-rw-rw-"),
    (stat.S_IFREG | 0o000, "----------"),
    (stat.S_IFDIR | 0o755, "drwxr-xr-x"),
    (stat.S_IFLNK | 0o777, "Lrwxrwxrwx"),
    (stat.S_IFIFO | 0o600, "prw-------"),
    (stat.S_IFSOCK | 0o755, "Srwxr-xr-x"),
    (stat.S_IFCHR | 0o666, "Dcrw-rw-rw-"),
    (stat.S_IFBLK | 0o660, "Drw-rw----"),
    (stat.S_IFREG | 0o4755, "urwxr-xr-x"),
    (stat.S_IFREG | 0o2755, "grwxr-xr-x"),
    (stat.S_IFDIR | 0o1777, "dtrwxrwxrwx"),
    (stat.S_IFDIR | 0o7700, "dugtrwx------"),
    (stat.S_IFCHR | 0o4600, "Ducrw-------"),
]


@pytest.mark.parametrize(("mode", "shown"), GO_MODE_STRINGS, ids=[s for _, s in GO_MODE_STRINGS])
def test_mode_strings_are_gos_file_mode_strings(mode, shown):
    assert mode_string(mode) == shown


@posix_modes
@pytest.mark.parametrize(("kind", "shown", "reason"), [
    ("symlink", "Lrwxrwxrwx", "which is not a regular file"),
    ("fifo", "prw-------", "which is not a regular file"),
    ("sticky-directory", "dtrwx------", "which is not a regular file"),
    ("setuid-file", "urw--w----", "writable by group or others"),
])
def test_an_insecure_mode_is_shown_as_go_shows_it(tmp_path, kind, shown, reason):
    path = new_db(tmp_path)
    side = path + "-wal"
    if kind == "symlink":
        os.symlink("/dev/null", side)
    elif kind == "fifo":
        os.mkfifo(side, 0o600)
    elif kind == "sticky-directory":
        os.mkdir(side)
        os.chmod(side, 0o1700)
    else:
        Path(side).write_bytes(b"")
        os.chmod(side, 0o4620)
    for opener in (open_store, open_existing):
        with pytest.raises(InsecureModeError) as info:
            opener(path)
        if reason == "which is not a regular file":  # chmod would follow a link: remove it
            remove = "rmdir" if kind == "sticky-directory" else "rm"
            fix = ("SQLite makes it as a regular file of the database's owner, and a link or "
                   "anything else there would take the database's writes elsewhere: remove it "
                   f"({remove} {side}) once no process has the database open")
        else:
            fix = ("the runtime keeps its database readable and writable by its owner only: "
                   f"chmod 600 {side} and chown it to the user that runs the runtime")
        assert str(info.value) == f"agentrt: {side} is {shown}, {reason}; {fix}"


# -- a -wal and -shm left read-only by a read of a database its owner froze -------------

_READ = (
    "import sys\n"
    "from agentrt import open_existing\n"
    "with open_existing(sys.argv[1]) as store:\n"
    "    print(len(store.list_runs()))\n"
)

_WRITE = (
    "import os, sys\n"
    f"sys.path.insert(0, {TESTS!r})\n"
    "from store_helpers import insert_run\n"
    "from agentrt import open_existing, open_store\n"
    "if sys.argv[3] == 'chmod-fails':\n"
    "    def chmod(path, mode, **kw):\n"
    "        raise PermissionError(1, 'Operation not permitted', path)\n"
    "    os.chmod = chmod\n"
    "opener = open_store if sys.argv[2] == 'open_store' else (\n"
    "    lambda p: open_existing(p, read_only=False))\n"
    "try:\n"
    "    store = opener(sys.argv[1])\n"
    "except Exception as exc:\n"
    "    print(type(exc).__name__, exc)\n"
    "else:\n"
    "    with store, store.tx() as tx:\n"
    "        insert_run(tx, 'written')\n"
    "    print('written')\n"
)


def frozen_then_read_then_thawed(folder: Path) -> str:
    """The owner makes the database 0400, reads it (SQLite makes the -wal and -shm
    with the database's mode), then follows the fix a writer gave: chmod 600."""
    path = new_db(folder)
    os.chmod(path, 0o400)
    assert in_child(_READ, path) == "1"
    assert [mode_of(path + s) for s in ("-wal", "-shm")] == [0o400, 0o400]
    os.chmod(path, 0o600)
    return path


@posix_modes
@pytest.mark.parametrize("opener", ["open_store", "open_existing"])
def test_a_wal_and_shm_a_read_left_read_only_are_made_writable_again_by_their_owner(
        tmp_path, opener):
    path = frozen_then_read_then_thawed(tmp_path)
    assert in_child(_WRITE, path, opener, "") == "written"
    left = [path + s for s in ("-wal", "-shm") if os.path.exists(path + s)]
    assert [mode_of(f) for f in left] == [0o600] * len(left)
    with open_existing(path) as store:
        assert {r.id for r in store.list_runs()} == {"r0", "written"}


@posix_modes
@pytest.mark.parametrize("opener", ["open_store", "open_existing"])
def test_a_shm_this_user_cannot_make_writable_is_named_with_its_fix(tmp_path, opener):
    """SQLite gives an empty -wal the database's mode when it opens it; the -shm
    keeps the mode it was made with, and every write fails on it."""
    path = frozen_then_read_then_thawed(tmp_path)
    before = file_state(path)
    said = in_child(_WRITE, path, opener, "chmod-fails")
    assert said == (
        f"StoreOpenError agentrt: open store: {path}-shm is read-only to this user "
        f"(-r--------, owner uid {os.getuid()}) and this needs to write it: as its owner, "
        f"chmod 600 {path}-shm")
    assert file_state(path) == before


# -- a new database: nothing is created for a refusal, and a create that fails says why ---

def test_a_new_database_refused_for_its_sidecar_is_not_created(tmp_path):
    """A -wal left beside a name with no database (others may write it): the refusal
    used to come after the new, empty database file had been made."""
    path = str(tmp_path / "new.db")
    Path(path + "-wal").write_bytes(b"")
    os.chmod(path + "-wal", 0o666)
    with pytest.raises(InsecureModeError, match="writable by group or others"):
        open_store(path)
    assert sorted(os.listdir(tmp_path)) == ["new.db-wal"]


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_the_fix_given_for_a_sidecar_that_is_not_a_file_works(tmp_path, kind):
    path = new_db(tmp_path)
    side = path + "-wal"
    if kind == "symlink":
        os.symlink(tmp_path / "notes.txt", side)
    elif kind == "fifo":
        os.mkfifo(side, 0o600)
    else:
        os.mkdir(side, 0o700)
    with pytest.raises(InsecureModeError) as info:
        open_store(path)
    fix = re.search(r"remove it \((rm(?:dir)? \S+)\)", str(info.value))
    assert fix is not None, str(info.value)
    subprocess.run(fix.group(1).split(" ", 1), check=True)
    open_store(path).close()


def test_a_new_database_refused_for_a_sidecar_that_appears_while_it_is_created_is_not_left(
        tmp_path, monkeypatch):
    """Another process plants a link at its -wal between the check and the create:
    the check after the create refuses it, and the empty file just made goes too."""
    from agentrt.store import opening

    path = str(tmp_path / "new.db")
    real_open = os.open

    def racing_open(name, flags, *args, **kwargs):
        if name == path and flags & os.O_CREAT and not os.path.lexists(path + "-wal"):
            os.symlink(tmp_path / "elsewhere", path + "-wal")
        return real_open(name, flags, *args, **kwargs)

    monkeypatch.setattr(opening.os, "open", racing_open)
    with pytest.raises(InsecureModeError):
        open_store(path)
    assert sorted(os.listdir(tmp_path)) == ["new.db-wal"]


@pytest.mark.parametrize("where", ["read-only directory", "directory without search",
                                   "parent without search", "missing directory",
                                   "under a file"])
def test_a_new_database_that_cannot_be_created_says_why_and_the_fix(tmp_path, where):
    prefix = without_file_privileges()
    directory = tmp_path / "state"
    if where == "read-only directory":
        directory.mkdir()
        os.chmod(directory, 0o500)
        said = (f"{directory}/new.db cannot be created: this user may not create files in its "
                f"directory ({directory}); as the directory's owner, chmod u+wx {directory}, "
                "or name a database in a directory this user can write")
    elif where in ("directory without search", "parent without search"):
        closed = directory
        if where == "parent without search":
            directory.mkdir()
            directory = directory / "db"
        directory.mkdir()
        os.chmod(closed, 0o600)  # no x: nothing in it can be looked up
        said = (f"{directory}/new.db cannot be created: this user may not look into {closed}, "
                f"on its way; as that directory's owner, chmod u+x {closed}, or name a database "
                "in a directory this user can reach")
    elif where == "under a file":
        directory.write_text("")
        said = (f"{directory}/new.db cannot be created: a part of {directory} is a file, not a "
                "directory; name a file in a directory")
    else:
        said = (f"{directory}/new.db cannot be created: its directory {directory} does not "
                f"exist; create it (mkdir -p {directory}), or name a file in an existing "
                "directory")
    code = ("import sys\nfrom agentrt.store import open_store\n"
            "try:\n    open_store(sys.argv[1])\nexcept Exception as e:\n    print(e)\n")
    try:
        out = subprocess.run([*prefix, sys.executable, "-c", code, f"{directory}/new.db"],
                             capture_output=True, text=True, env=child_env(), check=True).stdout
    finally:
        if (tmp_path / "state").is_dir():
            os.chmod(tmp_path / "state", 0o700)
        if directory.is_dir():
            os.chmod(directory, 0o700)
    assert out == f"agentrt: open store: {said}\n"
    assert not os.path.exists(directory / "new.db")

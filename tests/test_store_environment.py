"""The store where it meets its environment: journals and -wal files other
programs left, paths SQLite cannot take as given, files with two names, and
databases another program made."""

from __future__ import annotations

import os
import shutil
import struct
import sys
from pathlib import Path

import pytest
from eventdb import child_process
from store_helpers import (
    child_env,
    file_state,
    fill,
    insert_run,
    raw,
    tmpfs_mount,
    without_file_privileges,
)

from agentrt import InsecureModeError, open_existing, open_store
from agentrt.store import StoreOpenError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX files and processes")

as_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                             reason="giving a file to another user needs root")


def new_db(folder: Path, name: str = "a.db") -> str:
    path = str(folder / name)
    with open_store(path) as store:
        fill(store, runs=2, events=3)
    return path


def goals(path: str) -> list[str]:
    with open_existing(path) as store:
        return sorted(r.goal for r in store.list_runs())


def every_opener(path: str) -> list:
    return [lambda: open_store(path), lambda: open_existing(path),
            lambda: open_existing(path, read_only=False)]


# -- a rollback journal beside the database -----------------------------------------


def plant_journal(path: str, old: bytes, new: bytes) -> str:
    """A hot rollback journal, written by hand, whose one page is the database's
    page holding ``old`` with ``new`` in its place: what anyone who can create
    files in the directory can write. Opening the database plays it back."""
    data = Path(path).read_bytes()
    (size,) = struct.unpack(">H", data[16:18])
    size = 65536 if size == 1 else size
    number = next(n for n in range(len(data) // size) if old in data[n * size:(n + 1) * size])
    page = data[number * size:(number + 1) * size].replace(old, new)
    nonce, sector = 12345, 512
    checksum = nonce
    for i in range(size - 200, 0, -200):
        checksum = (checksum + page[i]) & 0xFFFFFFFF
    header = (bytes.fromhex("d9d505f920a163d7")
              + struct.pack(">IIIII", 1, nonce, len(data) // size, sector, size))
    journal = path + "-journal"
    Path(journal).write_bytes(header.ljust(sector, b"\0") + struct.pack(">I", number + 1)
                              + page + struct.pack(">I", checksum))
    return journal


def test_a_planted_journal_is_played_back_by_sqlite_so_the_test_means_what_it_says(tmp_path):
    path = new_db(tmp_path)
    plant_journal(path, b"a goal", b"FORGED")
    conn = raw(path)  # a plain connection, as SQLite does it
    assert conn.execute("SELECT DISTINCT goal FROM runs").fetchall() == [("FORGED",)]
    conn.close()


@pytest.mark.parametrize("who", [
    pytest.param("another user", marks=as_root),
    "group and others",
    "not a regular file",
])
def test_a_journal_others_could_write_is_refused_before_it_is_rolled_into_the_database(
        tmp_path, who):
    path = new_db(tmp_path)
    journal = plant_journal(path, b"a goal", b"FORGED")
    reason = "writable by group or others"
    if who == "another user":
        os.chown(journal, 4242, 4242)
        os.chmod(journal, 0o600)
        reason = "owned by another user than the database"
    elif who == "group and others":
        os.chmod(journal, 0o666)
    else:
        os.rename(journal, tmp_path / "elsewhere")
        os.symlink(tmp_path / "elsewhere", journal)
        reason = "which is not a regular file"
    before = file_state(path), os.lstat(journal).st_mtime_ns
    for open_it in every_opener(path):
        with pytest.raises(InsecureModeError) as info:
            open_it()
        assert info.value.path == journal and info.value.reason == reason
        assert (file_state(path), os.lstat(journal).st_mtime_ns) == before
    os.unlink(journal)
    assert goals(path) == ["a goal", "a goal"]


_KILLED_MID_TRANSACTION = """
import sys, time, apsw
conn = apsw.Connection(sys.argv[1])
conn.execute("PRAGMA journal_mode=DELETE")
conn.execute("PRAGMA cache_size=1")  # the changed pages go to the file before COMMIT
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE runs SET goal = 'half written'")
conn.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) "
             "SELECT 'x' || seq, zeroblob(20000), 'RUNNING', '{}', '' FROM events")
print("written", flush=True)
time.sleep(60)
"""


def test_a_hot_journal_is_named_to_a_reader_and_rolled_back_by_a_writer(tmp_path):
    """An older writer in rollback-journal mode killed inside a transaction: a
    read-only open cannot roll it back and says so (not SQLite's "attempt to
    write a readonly database"); a writer rolls it back."""
    path = new_db(tmp_path)
    with child_process([sys.executable, "-c", _KILLED_MID_TRANSACTION, path]) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"written\n", proc.stderr
        proc.kill()
        proc.wait()
    assert os.path.getsize(path + "-journal") > 0
    before = file_state(path), file_state(path + "-journal")
    with pytest.raises(StoreOpenError) as info:
        open_existing(path)
    assert str(info.value) == (
        f"agentrt: open store: {path} has a hot rollback journal (a.db-journal) left by a "
        "writer that stopped mid-transaction, and a read-only open cannot roll it back: open "
        "it once for writing, as its owner (open_existing with read_only=False, or the "
        "consumer's open_store), then read it")
    assert (file_state(path), file_state(path + "-journal")) == before
    with open_existing(path, read_only=False) as store:
        assert sorted(r.id for r in store.list_runs()) == ["r0", "r1"]
    assert goals(path) == ["a goal", "a goal"]


# -- a -wal without its -shm, where no -shm can be made ------------------------------


_COMMIT_THEN_WAIT = """
import sys, time
from agentrt import open_store
store = open_store(sys.argv[1])
with store.tx() as tx:
    tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) "
                "VALUES ('late', 'g', 'RUNNING', '{}', '2026-10-01T09:00:00Z')")
print("committed", flush=True)
time.sleep(60)
"""


def killed_after_a_commit(path: str) -> None:
    """A writer killed after its last commit: the commit is in the -wal only."""
    with child_process([sys.executable, "-c", _COMMIT_THEN_WAIT, path]) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"committed\n", proc.stderr
        proc.kill()
        proc.wait()
    assert os.path.getsize(path + "-wal") > 32


def test_a_wal_with_commits_and_no_shm_on_a_read_only_file_system_is_not_read_stale(
        tmp_path):
    """Immutable, SQLite would read the database without its -wal: the last
    commits would silently be missing. (A database copied with its -wal but
    without its -shm, then mounted read-only.)"""
    mount = str(tmp_path / "mnt")
    path = os.path.join(mount, "a.db")
    with tmpfs_mount(mount) as remount_read_only:
        new_db(Path(mount))
        killed_after_a_commit(path)
        os.unlink(path + "-shm")
        remount_read_only()
        before = file_state(path), file_state(path + "-wal")
        with pytest.raises(StoreOpenError) as info:
            open_existing(path)
        assert str(info.value) == (
            f"agentrt: open store: {path}-wal may hold commits not yet in a.db, and SQLite "
            "reads them only through a.db-shm, which cannot be created on a read-only file "
            "system: copy a.db and a.db-wal together to a directory this user can write and "
            "open the copy")
        assert (file_state(path), file_state(path + "-wal")) == before
        copy = tmp_path / "copy"
        copy.mkdir()
        for name in ("a.db", "a.db-wal"):
            shutil.copy(os.path.join(mount, name), copy / name)
    with open_existing(str(copy / "a.db")) as store:
        assert sorted(r.id for r in store.list_runs()) == ["late", "r0", "r1"]


_READ = """
import sys
from agentrt import open_existing
try:
    with open_existing(sys.argv[1]) as store:
        print("runs", *sorted(r.id for r in store.list_runs()))
except Exception as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize("wal", ["with commits", "empty"])
def test_a_wal_and_no_shm_in_a_directory_the_reader_cannot_write(tmp_path, wal):
    """Commits in the -wal are refused in one sentence, not "unable to open
    database file"; an empty -wal holds nothing, so the file is read."""
    prefix = without_file_privileges()
    folder = tmp_path / "d"
    folder.mkdir()
    path = new_db(folder)
    if wal == "empty":
        Path(path + "-wal").write_bytes(b"")
        os.chmod(path + "-wal", 0o600)
    else:
        killed_after_a_commit(path)
        os.unlink(path + "-shm")
    before = sorted(os.listdir(folder)), file_state(path), file_state(path + "-wal")
    os.chmod(folder, 0o500)
    try:
        with child_process([*prefix, sys.executable, "-c", _READ, path],
                           env=child_env()) as proc:
            out, err = proc.communicate(timeout=60)
    finally:
        os.chmod(folder, 0o700)
    said = out.decode().strip()
    if wal == "empty":
        assert said == "runs r0 r1", err
    else:
        assert said == (
            f"StoreOpenError agentrt: open store: {path}-wal may hold commits not yet in "
            f"a.db, and SQLite reads them only through a.db-shm, which cannot be created in "
            f"{folder}, which this user cannot write: copy a.db and a.db-wal together to a "
            "directory this user can write and open the copy"), err
    assert (sorted(os.listdir(folder)), file_state(path), file_state(path + "-wal")) == before


# -- paths SQLite cannot take as given -------------------------------------------------


def test_a_path_whose_bytes_are_not_utf8_opens_the_file_it_names(tmp_path):
    name = b"caf\xe9 %?#.db"  # Latin-1, as an older system may have named it
    path = os.fsdecode(os.path.join(os.fsencode(str(tmp_path)), name))
    with open_store(path) as store:
        fill(store, runs=1, events=2)
        assert sorted(os.listdir(os.fsencode(str(tmp_path)))) == [
            name, name + b"-shm", name + b"-wal"]
    for read_only in (True, False):
        with open_existing(path, read_only=read_only) as store:
            assert [r.id for r in store.list_runs()] == ["r0"]
            assert store.verify_events().broken is None
    assert sorted(os.listdir(os.fsencode(str(tmp_path)))) == [name]


def test_a_path_too_long_for_sqlite_is_refused_before_a_file_is_created(tmp_path):
    """SQLite opens no database whose absolute path, with "-journal", passes
    512 bytes, and says only "unable to open database file"; the file the
    opener made first was left behind, empty."""
    folder = tmp_path / ("x" * 200) / ("y" * 200)
    folder.mkdir(parents=True)
    room = 504 - len(os.fsencode(str(folder))) - 1
    fits = str(folder / ("f" * (room - 3) + ".db"))
    assert len(os.fsencode(fits)) == 504
    with open_store(fits) as store:  # the longest path SQLite takes still opens
        fill(store, runs=1, events=1)
    too_long = str(folder / ("g" * (room - 2) + ".db"))
    with pytest.raises(StoreOpenError) as info:
        open_store(too_long)
    assert str(info.value) == (
        f"agentrt: open store: {too_long} is 505 bytes long as an absolute path with its "
        "links resolved, and SQLite opens no database past 504: move it to a shorter path")
    assert sorted(os.listdir(folder)) == [os.path.basename(fits)]
    Path(too_long).write_bytes(Path(fits).read_bytes())  # one made some other way
    os.chmod(too_long, 0o600)
    before = file_state(too_long)
    for read_only in (True, False):
        with pytest.raises(StoreOpenError) as info:
            open_existing(too_long, read_only=read_only)
        assert "is 505 bytes long as an absolute path" in str(info.value)
    assert file_state(too_long) == before


# -- a database another program made -----------------------------------------------


def test_a_utf16_database_is_refused_by_both_openers_before_anything_is_written(tmp_path):
    """A consumer that made the file first with PRAGMA encoding='UTF-16le':
    written there, every event payload read back as UTF-16 bytes and every
    chain hash verified as broken."""
    path = str(tmp_path / "u16.db")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    os.close(fd)
    conn = raw(path)
    conn.execute("PRAGMA encoding='UTF-16le'")
    conn.execute("CREATE TABLE consumer (x)")
    conn.close()
    before = file_state(path), sorted(os.listdir(tmp_path))
    for open_it in every_opener(path):
        with pytest.raises(StoreOpenError) as info:
            open_it()
        assert str(info.value).startswith(
            f"agentrt: open store: {path} stores its text as UTF-16le, and the runtime reads "
            f"and hashes it as UTF-8: copy it into a new file (sqlite3 {path} .dump")
        assert (file_state(path), sorted(os.listdir(tmp_path))) == before


_WRITE_RUNS = """
import sys
from agentrt import open_store
try:
    store = open_store(sys.argv[1])
except Exception as exc:
    print(type(exc).__name__, exc)
    raise SystemExit
for i in range(200):
    with store.tx() as tx:
        tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at) "
                   "VALUES (?, 'g', 'RUNNING', '{}', '2026-10-01T09:00:00Z')",
                   (sys.argv[2] + str(i),))
print("wrote", len(store.list_runs()))
"""


def test_writers_refuse_a_database_with_a_second_name(tmp_path):
    """Each name gets its own -wal, so two writers using two names each lose the
    other's commits (both report theirs; the file keeps one side's). Readers
    change nothing and still read it."""
    path = new_db(tmp_path)
    other = str(tmp_path / "b.db")
    os.link(path, other)
    before = file_state(path)
    with child_process([sys.executable, "-c", _WRITE_RUNS, path, "a"]) as one, \
            child_process([sys.executable, "-c", _WRITE_RUNS, other, "b"]) as two:
        said = [p.communicate(timeout=60)[0].decode().strip() for p in (one, two)]
    for name, line in zip((path, other), said, strict=True):
        assert line == (
            f"StoreOpenError agentrt: open store: {name} has 2 names (hard links), and SQLite "
            "keeps a -wal for each name, so writers using two of them lose each other's "
            f"commits: remove the other names (find / -xdev -samefile {name}), or give this "
            "one a copy of its own")
    with pytest.raises(StoreOpenError):
        open_existing(other, read_only=False)
    assert file_state(path) == before
    with open_existing(other) as store:
        assert sorted(r.id for r in store.list_runs()) == ["r0", "r1"]
    os.unlink(other)
    with open_store(path) as store, store.tx() as tx:
        insert_run(tx, "one name again")

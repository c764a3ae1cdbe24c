"""How a database file is opened: the owner-only mode rules and hardened connections.

Anyone who can write the file can forge an approval (its hash holds no
secret), so the file is the operator's: created 0600, refused when group or
others can write it, and opened with SQLite's defensive mode on and
``trusted_schema`` off so a crafted file cannot run its author's SQL inside
the runtime's statements.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import stat
import sys
import time
from collections.abc import Callable, Iterator

import apsw

from agentrt.errors import (
    NOT_A_REGULAR_FILE,
    AgentrtError,
    InsecureModeError,
    SchemaVersionError,
    SymlinkError,
    UnsafeSchemaError,
    mode_string,
)
from agentrt.records import SCHEMA_VERSION
from agentrt.store.migrations import (
    current_version,
    migrate,
    migration_clash,
    refuse_newer,
    rehearse,
    unknown_version,
)
from agentrt.store.tx import WRITE_FAILED, write_failed

__all__ = [
    "BUSY_TIMEOUT_MS",
    "StoreOpenError",
    "close_quietly",
    "connect",
    "lstat_regular",
    "open_memory",
    "open_reader",
    "open_writer",
    "refuse_unsafe_schema",
    "secure_files",
    "sqlite_failure",
    "sqlite_uri",
    "switch_to_wal",
]

BUSY_TIMEOUT_MS = 5000
_WAL_SWITCH_DEADLINE = 5.0
_WAL_SWITCH_SLEEP = 0.005
_MODES_MEAN_OWNERSHIP = sys.platform != "win32"


class StoreOpenError(AgentrtError):
    """The file cannot be opened as an agentrt database."""

    base = "agentrt: open store"


def sqlite_uri(path: str, params: dict[str, str]) -> str:
    """A ``file:`` URI naming exactly ``path``, even with ``?``, ``#`` or ``%`` in it."""
    escaped = path.replace("%", "%25").replace("?", "%3F").replace("#", "%23")
    if not escaped.isascii() and not _is_utf8(escaped):
        # Bytes that are not UTF-8 (os.fsdecode keeps them as surrogates): a
        # URI carries them as %XX, which SQLite hands to open() as they were.
        escaped = "".join(chr(b) if b < 0x80 else f"%{b:02X}" for b in os.fsencode(escaped))
    # An absolute path gets an empty authority, so a leading // stays a path.
    escaped = ("file://" if os.path.isabs(path) else "file:") + escaped
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"{escaped}?{query}" if query else escaped


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_one(path: str, st: os.stat_result, db_uid: int, sidecar: bool) -> None:
    if sidecar and not stat.S_ISREG(st.st_mode):
        raise InsecureModeError(path, st.st_mode, NOT_A_REGULAR_FILE)
    if sidecar and st.st_uid != db_uid:
        raise InsecureModeError(path, st.st_mode, "owned by another user than the database")
    if st.st_mode & 0o022:
        raise InsecureModeError(path, st.st_mode, "writable by group or others")


def secure_files(path: str, *, create: bool, write: bool) -> None:
    """Apply the mode rules to the database file and its ``-wal``/``-shm``/``-journal``.

    Creates a missing file 0600 when ``create``; refuses a database that is
    not a regular file, a file group or others can write, and a sidecar that
    is not a regular file or has another owner than the database; with
    ``write``, tightens to 0600 the files this user owns that others can read.
    A read-only open changes nothing. Skipped where file modes do not mean
    owner, group and others.
    """
    if not _MODES_MEAN_OWNERSHIP:
        return
    created = False
    if create:
        if not os.path.lexists(path):
            _sidecars(path, os.geteuid(), creating=True)  # a refusal creates no file
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another creator won the race; the checks below still apply
        except OSError as exc:
            raise StoreOpenError(_cannot_create(path, exc)) from exc
        else:
            created = True
            try:
                os.fchmod(fd, 0o600)  # whatever the umask
            finally:
                os.close(fd)
    try:
        db = _stat(path, os.stat)
        if not stat.S_ISREG(db.st_mode):
            raise StoreOpenError(f"{path} is not a regular file; name the database file itself")
        _check_one(path, db, db.st_uid, sidecar=False)
        files = [(path, db), *_sidecars(path, db.st_uid)]
    except AgentrtError:
        if created:  # a sidecar that appeared since the check: the empty file goes too
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise
    if write:
        me = os.geteuid()
        for name, st in files:
            if st.st_uid == me and st.st_mode & 0o077:
                # A -journal comes and goes with each transaction of another
                # writer that keeps one: gone, there is nothing to tighten.
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(name, 0o600)


def _sidecars(path: str, db_uid: int, *, creating: bool = False,
              ) -> list[tuple[str, os.stat_result]]:
    """The database's ``-wal``, ``-shm`` and ``-journal`` that exist, each checked.

    A hot -journal is rolled back into the database by the next opener, even
    a WAL one: whoever can write it can write the database. ``creating`` (the
    database is not there yet): a path that cannot be looked up is left to the
    create, which says it of the database the user named."""
    found: list[tuple[str, os.stat_result]] = []
    for suffix in ("-wal", "-shm", "-journal"):
        side = path + suffix
        try:
            st = os.lstat(side)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if creating:
                return found
            raise StoreOpenError(f"{side}: {exc.strerror}") from exc
        _check_one(side, st, db_uid, sidecar=True)
        found.append((side, st))
    return found


def _cannot_create(path: str, exc: OSError) -> str:
    """Why a new database file could not be made, and the fix."""
    directory = os.path.dirname(path) or "."
    closed = _unsearchable(directory) if exc.errno == errno.EACCES else None
    if closed is not None:
        return (f"{path} cannot be created: this user may not look into {closed}, on its "
                f"way; as that directory's owner, chmod u+x {closed}, or name a database in "
                "a directory this user can reach")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (f"{path} cannot be created: this user may not create files in its "
                f"directory ({directory}); as the directory's owner, chmod u+wx {directory}, "
                "or name a database in a directory this user can write")
    if exc.errno == errno.ENOENT:
        return (f"{path} cannot be created: its directory {directory} does not exist; "
                f"create it (mkdir -p {directory}), or name a file in an existing directory")
    if exc.errno == errno.ENOTDIR:
        return (f"{path} cannot be created: a part of {directory} is a file, not a "
                "directory; name a file in a directory")
    if exc.errno == errno.EROFS:
        return (f"{path} cannot be created: {directory} is on a read-only file system; name "
                "a database on a writable one")
    return f"cannot create {path}: {exc.strerror}"


def _unsearchable(directory: str) -> str | None:
    """The first directory on the way to ``directory`` (itself included) that this
    user may not look into (no ``x``), or None. Tried, not judged by mode bits."""
    parts = os.path.abspath(directory).split(os.sep)
    for end in range(2, len(parts) + 1):
        step = os.sep.join(parts[:end]) or os.sep
        try:
            os.stat(os.path.join(step, "."))
        except PermissionError:
            return step
        except OSError:
            return None
    return None


def connect(uri: str, *, write: bool, create: bool = False, path: str = "") -> apsw.Connection:
    """A connection with the runtime's pragmas: defensive, untrusted schema, busy wait.

    Writers also get ``synchronous=FULL``: in WAL mode NORMAL can lose the last
    commits on power loss, and the last commit may be the ``step.tool_started``
    of a tool that ran. A writer of a file this user cannot write (``path``) is
    refused before the pragmas read it.
    """
    flags = apsw.SQLITE_OPEN_URI
    if write:
        flags |= apsw.SQLITE_OPEN_READWRITE
        if create:
            flags |= apsw.SQLITE_OPEN_CREATE
    else:
        flags |= apsw.SQLITE_OPEN_READONLY
    conn = apsw.Connection(uri, flags=flags)
    try:
        if write:
            refuse_read_only(conn, path or uri)
        conn.set_busy_timeout(BUSY_TIMEOUT_MS)
        conn.config(apsw.SQLITE_DBCONFIG_DEFENSIVE, 1)
        conn.config(apsw.SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0)
        conn.execute("PRAGMA foreign_keys=ON")
        if write:
            conn.execute("PRAGMA synchronous=FULL")
    except BaseException:
        conn.close()
        raise
    return conn


def switch_to_wal(conn: apsw.Connection, path: str) -> None:
    """Put the file in WAL mode, waiting out another opener for up to five seconds."""
    deadline = time.monotonic() + _WAL_SWITCH_DEADLINE
    while True:
        try:
            row = conn.execute("PRAGMA journal_mode=WAL").fetchone()
            break
        except apsw.BusyError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(_WAL_SWITCH_SLEEP)
    mode = str(row[0]).lower() if row else ""
    if mode != "wal":
        raise StoreOpenError(f"{path}: journal mode is {mode}, not wal")


def refuse_unsafe_schema(conn: apsw.Connection, path: str) -> None:
    """Refuse a file holding a trigger or view: either would run its author's
    SQL inside the runtime's own statements. The runtime creates neither."""
    row = conn.execute(
        # SQLite takes the type column case-insensitively when it loads the
        # schema: a row typed 'TRIGGER' or 'View' is a trigger or view too.
        "SELECT lower(type), CAST(substr(name, 1, 128) AS BLOB) FROM sqlite_schema "
        "WHERE lower(type) IN ('trigger', 'view') LIMIT 1"
    ).fetchone()
    if row is not None:
        kind = str(row[0])
        name = bytes(row[1] or b"").decode("utf-8", "replace")
        raise UnsafeSchemaError(
            f'{path} has {kind} "{name}"; the runtime creates neither and will not run SQL '
            f'a database\'s author put there: drop it (DROP {kind.upper()} "{name}") if you '
            "trust the file, or open a copy without it"
        )


def refuse_other_encoding(conn: apsw.Connection, path: str) -> None:
    """Refuse a file whose text is UTF-16 (a consumer made it first, with its own
    ``PRAGMA encoding``): the chain hashes the stored bytes of each event, and
    reads hand payloads out as those bytes, so every event would read as UTF-16
    and every hash written there as broken. The runtime creates UTF-8 files."""
    row = conn.execute("PRAGMA encoding").fetchone()
    encoding = str(row[0]) if row else "UTF-8"
    if encoding.upper() != "UTF-8":
        raise StoreOpenError(
            f"{path} stores its text as {encoding}, and the runtime reads and hashes it as "
            f"UTF-8: copy it into a new file (sqlite3 {path} .dump | sqlite3 NEW.db) and "
            "open that")


def refuse_other_names(path: str) -> None:
    """Refuse to write a file with more than one name (hard link): SQLite keeps a
    -wal per name, so writers using two names each lose the other's commits."""
    links = _stat(path, os.stat).st_nlink
    if links > 1:
        raise StoreOpenError(
            f"{path} has {links} names (hard links), and SQLite keeps a -wal for each name, "
            "so writers using two of them lose each other's commits: remove the other names "
            f"(find / -xdev -samefile {path}), or give this one a copy of its own")


def refuse_directory_path(path: str, *, create: bool) -> None:
    """Refuse a path that can only name a directory ("state/", "state/.", ".."),
    itself or through the symbolic links it names, before anything is created:
    realpath drops that last part, so open_store would make a file named as
    the directory is. The sentence says what is there: a directory, or a file
    followed by "/" (no file is a directory); where nothing is, the writer
    (``create``) refuses the name all the same, and a reader, which creates
    nothing, leaves it to the sentence for any path that does not exist."""
    name = path
    for _ in range(40):  # the kernel's own limit on links followed
        if os.path.basename(name) in ("", ".", ".."):
            _refuse_directory_ending(path, name, create=create)
            return
        try:
            target = os.readlink(name)
        except OSError:  # not a link (or nothing there yet): the name is what it says
            return
        name = os.path.join(os.path.dirname(name), target)


def _refuse_directory_ending(path: str, name: str, *, create: bool) -> None:
    """The refusal for ``path``, which (as ``name``, its links followed) ends as
    only a directory's name can: see :func:`refuse_directory_path`."""
    shown = path if name == path else f"{path} (a link to {name})"
    try:
        os.stat(name)
    except OSError:
        head, tail = _directory_ending(name)
        try:
            st: os.stat_result | None = os.stat(head) if tail else None
        except OSError:
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            if stat.S_ISREG(os.lstat(head).st_mode):
                raise StoreOpenError(
                    f"{shown} names the file {head} followed by '{tail}', which is not a "
                    f"directory: name the database file without the '{tail}', {head}") from None
            raise StoreOpenError(  # a device, a FIFO, a link: not a database to suggest
                f"{shown} names {head} followed by '{tail}', and {head} is not a "
                "directory: name the database file itself") from None
        if not create:
            return  # nothing there: the reader's next check says it does not exist
    raise StoreOpenError(
        f"{shown} names a directory, not a database file: name the database file "
        f"itself, such as {os.path.join(path, 'agentrt.db')}")


def _directory_ending(name: str) -> tuple[str, str]:
    """``name`` split before its ending of separators, "." and "..":
    ("ops.db", "/") for "ops.db/", ("ops.db", "/..") for "ops.db/..". The ending
    is empty for a name that is all of it ("/", "..")."""
    seps = os.sep + (os.altsep or "")
    head = name
    while True:
        bare = head.rstrip(seps)
        if bare and bare != head:
            head = bare
        elif os.path.basename(head) in (".", "..") and os.path.dirname(head):
            head = os.path.dirname(head)
        else:
            return head, name[len(head):]


def refuse_long_path(path: str) -> None:
    """Refuse, before a file is created, a path SQLite cannot open: its absolute
    form, links resolved, with "-journal" added must fit the VFS's limit, and
    past it SQLite says only "unable to open database file"."""
    limit = int(apsw.vfs_details()[0]["mxPathname"]) - len("-journal")
    try:
        length = len(os.fsencode(os.path.realpath(path)))
    except OSError:
        return  # no working directory: the open that follows says so
    if length > limit:
        raise StoreOpenError(
            f"{path} is {length} bytes long as an absolute path with its links resolved, "
            f"and SQLite opens no database past {limit}: move it to a shorter path")


#: The runtime's tables and their columns, as its migrations make them.
_SHAPE: dict[str, tuple[str, ...]] | None = None


def _shape() -> dict[str, tuple[str, ...]]:
    """The tables and columns a migrated database has, read once from one made
    in memory by the same migrations, so the check cannot drift from them."""
    global _SHAPE
    if _SHAPE is None:
        conn = open_memory()
        try:
            _SHAPE = {table: tuple(str(r[1]) for r in conn.execute(
                          f"PRAGMA table_info({table})"))
                      for table in RUNTIME_TABLES}
        finally:
            conn.close()
    return _SHAPE


#: The tables the runtime's migrations create (``schema_migrations`` aside).
RUNTIME_TABLES = ("runs", "steps", "events", "approvals", "model_calls", "tool_specs")


def _folded(name: object) -> str:
    """A name as SQLite matches it: ASCII letters in any case are the same."""
    text = str(name)
    return text.lower() if text.isascii() else text


def _pk_is_not_the_rowid(conn: apsw.Connection, table: str) -> bool:
    """Whether ``table``'s primary key is kept in an index of its own: a key of
    several columns, ``INTEGER PRIMARY KEY DESC`` or a WITHOUT ROWID table,
    none of which is the rowid (an INTEGER PRIMARY KEY that is has no index)."""
    return any(str(r[3]) == "pk" for r in conn.execute(f"PRAGMA index_list({table})"))


def _events_seq_is_not_the_rowid(conn: apsw.Connection) -> bool:
    """Whether ``events.seq`` is not the table's rowid: not its one INTEGER PRIMARY
    KEY (no such column, no key at all, another type, or a key SQLite keeps in an index)."""
    columns = {_folded(r[1]): r for r in conn.execute("PRAGMA table_info(events)")}
    if not columns:
        return False  # no table at all: the caller says so, not "its seq"
    seq = columns.get("seq")
    return (seq is None or seq[5] != 1 or str(seq[2]).upper() != "INTEGER"
            or _pk_is_not_the_rowid(conn, "events"))


def refuse_foreign_shape(conn: apsw.Connection, path: str) -> None:
    """Refuse a file whose schema version is the runtime's but whose tables are
    not: a table rebuilt by another program (a column missing, ``events.seq``
    no longer the rowid that orders and chains the events, a table without the
    rowid the page reads order and cut by) would fail the
    reads deep inside, as a traceback, instead of here as one sentence."""
    # SQLite's names ignore case: a table rebuilt as "Events" is the events table.
    without_rowid = {_folded(r[1]) for r in conn.execute("PRAGMA main.table_list") if r[4]}
    for table, columns in _shape().items():
        found = {_folded(r[1]): r for r in conn.execute(f"PRAGMA table_info({table})")}
        missing = [c for c in columns if c not in found]
        if not found:
            detail = f"has no table {table}"
        elif missing:
            detail = f"has a table {table} without its column {missing[0]}"
        elif table == "events" and _events_seq_is_not_the_rowid(conn):
            detail = "has a table events whose seq is not its INTEGER PRIMARY KEY"
        elif table in without_rowid:
            detail = f"has a table {table} WITHOUT ROWID"
        elif "rowid" in found:  # the page reads would order and cut by its values
            detail = f"has a table {table} whose column rowid hides its rowid"
        else:
            continue
        raise _foreign_shape(path, detail)


def _foreign_shape(path: str, detail: str) -> StoreOpenError:
    return StoreOpenError(
        f"{path} {detail}, so it is not the agentrt schema its version says: another "
        "program changed it; open a backup, or a copy agentrt made")


def _stat(path: str, how: Callable[[str], os.stat_result]) -> os.stat_result:
    """``how(path)``, with a missing or unreadable path said in one sentence."""
    try:
        return how(path)
    except FileNotFoundError as exc:
        raise StoreOpenError(
            f"{path} does not exist; name an existing agentrt database file"
        ) from exc
    except OSError as exc:
        raise StoreOpenError(f"{path}: {exc.strerror}") from exc


def lstat_regular(path: str) -> None:
    """Refuse a symbolic link or anything else that is not a regular file."""
    st = _stat(path, os.lstat)
    if stat.S_ISLNK(st.st_mode):
        raise SymlinkError(path)
    if not stat.S_ISREG(st.st_mode):
        raise StoreOpenError(f"{path} is not a regular file; name the database file itself")


def close_quietly(conn: apsw.Connection | None) -> None:
    if conn is not None:
        with contextlib.suppress(apsw.Error):
            conn.close()


def _owner_fix(path: str, st: os.stat_result) -> str:
    """The fix for a file this user may not use as it is: its owner makes it 0600."""
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return (f"run agentrt as the user that owns it (uid {st.st_uid}), or have that user "
                f"chmod 600 {path}")
    return f"as its owner, chmod 600 {path}"


def _directory_of(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


def _on_read_only_fs(path: str) -> bool:
    """Whether the file system holding ``path`` is mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def _read_only_fs_sentence(path: str) -> str:
    return (f"{path} is on a read-only file system and this needs to write it: copy it "
            "to a writable one, or remount that one read-write")


def _read_only_file(path: str) -> str | None:
    """The sentence for a database this user cannot write, or a -wal or -shm beside
    it (writing the database writes them too), or None when it can write them all."""
    real = os.path.realpath(path)  # SQLite keeps them beside the file a link names
    for name in (path, real + "-wal", real + "-shm"):
        try:
            st = os.stat(name)
            if os.access(name, os.W_OK):
                continue
        except OSError:
            continue
        if _on_read_only_fs(name):
            return _read_only_fs_sentence(path)
        return (f"{name} is read-only to this user ({mode_string(st.st_mode)}, owner uid "
                f"{st.st_uid}) and this needs to write it: {_owner_fix(name, st)}")
    return None


def refuse_read_only(conn: apsw.Connection, path: str) -> None:
    """Refuse a database this user cannot write: SQLite opens it read-only without
    a word, and the first write would fail, after whatever came before it."""
    if conn.readonly("main"):
        raise StoreOpenError(_read_only_file(path) or f"{path} can only be opened read-only")


def restore_sidecar_write(path: str) -> bool:
    """Give back the owner's write bit to a -wal or -shm this user owns that lacks
    it, and say whether one changed. SQLite makes them with the database's mode: a
    read of a database its owner made 0400 leaves them 0400, and once the owner
    makes it writable again (chmod 600, the fix a writer gives) they would refuse
    every write. One that stays read-only is named by ``_read_only_file``."""
    if not _MODES_MEAN_OWNERSHIP:
        return False
    changed = False
    for name in (path + "-wal", path + "-shm"):
        try:
            st = os.lstat(name)
            if (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
                    and not st.st_mode & stat.S_IWUSR):
                os.chmod(name, 0o600)
                changed = True
        except OSError:
            continue  # gone (a last writer's close), or not ours to change: named later
    return changed


def _unopenable(path: str, *, write: bool) -> str | None:
    """Permission denied on the database (or a -wal/-shm beside it), said with the fix."""
    if write and os.path.exists(path) and _on_read_only_fs(path):
        return _read_only_fs_sentence(path)  # os.access says no, but chmod is not the fix
    for name, wanted in ((path, os.R_OK | (os.W_OK if write else 0)),
                         (path + "-wal", os.R_OK | os.W_OK), (path + "-shm", os.R_OK | os.W_OK)):
        try:
            st = os.stat(name)
        except OSError:
            continue
        if os.access(name, wanted):
            continue
        can = "read and write" if wanted & os.W_OK else "read"
        return (f"{name} cannot be opened: permission denied, this user may not {can} it "
                f"({mode_string(st.st_mode)}, owner uid {st.st_uid}); "
                f"{_owner_fix(name, st)}")
    return None


#: Descriptors an open of a WAL database takes: the file, its -wal and -shm.
_DESCRIPTORS_PER_OPEN = 3


def descriptors_exhausted(*, certain: bool = False) -> str | None:
    """The sentence for a process that may open too few files, or None when it
    seems not to be (``certain``: an EMFILE said so already).

    SQLite says only "unable to open database file" when it is out of
    descriptors; a ``ulimit -n`` set too low is worth naming with its fix.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    said = (f"this process may open too few files (ulimit -n {soft}): raise the limit "
            "(ulimit -n 1024) and try again")
    if certain:
        return said
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        used = len(os.listdir("/proc/self/fd")) - 1  # less the one listdir opened
    except OSError as exc:
        return said if exc.errno in (errno.EMFILE, errno.ENFILE) else None
    return said if used + _DESCRIPTORS_PER_OPEN > soft else None


def sqlite_failure(path: str, exc: apsw.Error, *, write: bool, system_errno: int = 0,
                   action: str = "") -> str | None:
    """One sentence for a SQLite error whose cause lies outside the file's content
    (permissions, a read-only file or directory, another process's lock, a full
    disk): what happened and the fix. None for the others, which are said as
    SQLite says them. ``system_errno`` is the failing connection's errno (it
    tells a full disk from a file size limit); ``action`` what to do once the
    cause is fixed ("try again").
    """
    if isinstance(exc, apsw.IOError) and _extended(exc) in _SHM_FAILED:
        name = os.path.basename(path)
        return (f"{path}: SQLite cannot make {name}-shm, the {_SHM_SIZE // 1024} KiB file "
                f"beside it that connections share ({exc}), so it cannot be opened: the file "
                "system holding it is full or this process's file size limit (ulimit -f) is "
                "lower; free space there or raise the limit, and try again")
    if isinstance(exc, WRITE_FAILED):
        failed = write_failed(path, exc, system_errno)
        if not write:  # a read: no transaction was rolled back
            return f"{path}: {failed.cause}; {failed.remedy} and {action or 'try again'}"
        return str(failed.retold(path, action or "try again"))
    if isinstance(exc, (apsw.BusyError, apsw.LockedError)):
        return (f"{path} is locked: another process holds its write lock and kept it past "
                f"the {BUSY_TIMEOUT_MS / 1000:g} s busy timeout; nothing was changed, try "
                "again when it has finished")
    if isinstance(exc, apsw.ReadOnlyError) and _extended(exc) == apsw.SQLITE_READONLY_ROLLBACK:
        # SQLite's own words ("attempt to write a readonly database") blame a
        # write that a read-only open never asked for.
        return (f"{path} has a hot rollback journal ({os.path.basename(path)}-journal) left "
                "by a writer that stopped mid-transaction, and a read-only open cannot roll "
                "it back: open it once for writing, as its owner (open_existing with "
                "read_only=False, or the consumer's open_store), then read it")
    if isinstance(exc, apsw.ReadOnlyError) and write:
        directory = _directory_of(path)
        if (_extended(exc) == apsw.SQLITE_READONLY_DIRECTORY
                or not os.access(directory, os.W_OK | os.X_OK)):
            name = os.path.basename(path)
            return (f"{path} is in a directory this user cannot write ({directory}): to "
                    f"write the database SQLite creates {name}-wal and {name}-shm (or "
                    f"{name}-journal) beside it; as the directory's owner, chmod u+w "
                    f"{directory}, or move the database to a directory this user can write")
        return _read_only_file(path)
    if isinstance(exc, (apsw.CantOpenError, apsw.PermissionsError, apsw.AuthError)):
        said = _unopenable(path, write=write)
        if said is None and isinstance(exc, apsw.CantOpenError):
            exhausted = descriptors_exhausted()
            said = f"{path} cannot be opened: {exhausted}" if exhausted else None
        return said
    return None


#: What to do once the writes that creating a database needs (its WAL switch and its
#: migrations, each one transaction) have room: until then no command can read it.
_OPEN_AGAIN = "open it again with open_store, which completes a database it began"


def _errno_of(conns: list[apsw.Connection]) -> int:
    """The errno of the last connection opened (the one that failed), 0 if none."""
    try:
        return int(conns[-1].system_errno) if conns else 0
    except apsw.Error:
        return 0


@contextlib.contextmanager
def _opening(path: str, conns: list[apsw.Connection], *, write: bool = True,
             action: str = "try again") -> Iterator[None]:
    """Close what was opened if opening fails, and word SQLite's errors."""
    try:
        yield
    except BaseException as exc:
        # Worded before the connections close: a count of open descriptors
        # must still see what the failed open holds.
        said = (sqlite_failure(path, exc, write=write, system_errno=_errno_of(conns),
                               action=action)
                if isinstance(exc, apsw.Error) else None)
        for conn in reversed(conns):
            close_quietly(conn)
        if isinstance(exc, apsw.NotADBError):
            raise StoreOpenError(
                f"{path} is not a SQLite database; name the agentrt database file"
            ) from exc
        if isinstance(exc, apsw.Error):
            raise StoreOpenError(said or f"{path}: {exc}") from exc
        raise


def _is_empty(conn: apsw.Connection) -> bool:
    """Whether the database holds no schema at all (a file created and never migrated)."""
    row = conn.execute("SELECT COUNT(*) FROM sqlite_schema").fetchone()
    return row is not None and row[0] == 0


def _not_agentrt(path: str, exc: apsw.Error) -> StoreOpenError:
    return StoreOpenError(
        f"{path} is not an agent-runtime database ({exc}); name the database file an "
        "agentrt consumer created"
    )


def open_memory() -> apsw.Connection:
    """One migrated in-memory connection: no file, no WAL, no mode rules."""
    conn = connect("file::memory:", write=True, create=True)
    with _opening(":memory:", [conn]):
        migrate(conn, ":memory:")
    return conn


def open_writer(path: str) -> tuple[apsw.Connection, apsw.Connection]:
    """``open_store``'s two connections: the store's and the lease heartbeat's.

    Nothing is written to a file that is refused: the checks (modes, trigger
    or view, a newer schema) come before the switch to WAL, the migrations
    and the tightening of modes.
    """
    refuse_directory_path(path, create=True)
    refuse_long_path(path)
    # SQLite opens the file a symbolic link names and keeps its -wal, -shm and
    # -journal beside that file: the rules apply there.
    real = os.path.realpath(path)
    secure_files(real, create=True, write=False)
    refuse_other_names(real)
    uri = sqlite_uri(path, {})
    conns: list[apsw.Connection] = []
    with _opening(path, conns, action=_OPEN_AGAIN):
        conns.append(connect(uri, write=True, create=True, path=path))
        conn = conns[0]
        refuse_unsafe_schema(conn, path)
        refuse_other_encoding(conn, path)
        version = refuse_newer(conn, path)
        if version == SCHEMA_VERSION:
            refuse_foreign_shape(conn, path)  # before anything is written
        if 0 < version < SCHEMA_VERSION:
            # Migration 6 chains the events, reading long values by seq as the rowid:
            # refused before it runs, it commits no hashes of other rows.
            if not list(conn.execute("PRAGMA table_info(events)")):
                raise _foreign_shape(path, "has no table events")
            if _events_seq_is_not_the_rowid(conn):
                raise _foreign_shape(
                    path, "has a table events whose seq is not its INTEGER PRIMARY KEY")
        clash = None
        if version < SCHEMA_VERSION:
            clash = migration_clash(conn, version)
            if clash is None:
                failed = rehearse(conn, version)
                clash = None if failed is None else f"fails its migrations ({failed})"
        if clash is not None:
            raise StoreOpenError(
                f"{path} {clash}, so it cannot be migrated to agentrt's schema: it is another "
                "program's database, or one another program changed; nothing was written: "
                "name a new file, or open a copy agentrt made")
        conn = _writable_sidecars(conns, path, real, uri)
        switch_to_wal(conn, path)
        migrate(conn, path)
        if 0 < version < SCHEMA_VERSION:
            # An older release's tables, as the migrations left them: another
            # program may have rebuilt one before (the next open would refuse it).
            refuse_foreign_shape(conn, path)
        conns.append(connect(uri, write=True))
        secure_files(real, create=False, write=True)  # the WAL files SQLite made too
    return conns[0], conns[1]


def open_reader(path: str, read_only: bool) -> tuple[apsw.Connection, apsw.Connection | None]:
    """``open_existing``'s connections; a writer also gets the lease connection."""
    refuse_directory_path(path, create=False)
    lstat_regular(path)
    refuse_long_path(path)
    secure_files(path, create=False, write=False)  # tightened below, once accepted
    if not read_only:
        refuse_other_names(path)
    params = {"mode": "ro"} if read_only else {"mode": "rw"}
    conns: list[apsw.Connection] = []
    with _opening(path, conns, write=not read_only):
        conns.append(connect(sqlite_uri(path, params), write=not read_only, path=path))
        try:
            refuse_unsafe_schema(conns[0], path)
        except (apsw.ReadOnlyError, apsw.CantOpenError, *WRITE_FAILED) as exc:
            if not (read_only and _cannot_make_shm(path, exc)):
                raise
            # A WAL database without its -shm in a directory this user cannot
            # write, or on a read-only file system: no writer can be live
            # either (it could not create the -shm), so the file is read as
            # immutable, unless its -wal holds frames: immutable, SQLite would
            # leave them unread, and with them the last commits.
            unread = _unread_wal(path)
            if unread:
                raise StoreOpenError(unread) from exc
            close_quietly(conns.pop())
            conns.append(connect(sqlite_uri(path, {"mode": "ro", "immutable": "1"}),
                                 write=False))
            refuse_unsafe_schema(conns[0], path)
        refuse_other_encoding(conns[0], path)
        try:
            version = current_version(conns[0])
        except apsw.SQLError as exc:
            if _is_empty(conns[0]):
                raise StoreOpenError(
                    f"{path} is an empty database: its tables were never created (an "
                    "open_store that stopped part-way, on a full disk, leaves one); open it "
                    "with the consumer's open_store, which creates them") from exc
            raise _not_agentrt(path, exc) from exc
        if version != SCHEMA_VERSION:
            raise _version_error(path, version)
        refuse_foreign_shape(conns[0], path)
        if not read_only:
            _writable_sidecars(conns, path, path, sqlite_uri(path, params))
            conns.append(connect(sqlite_uri(path, params), write=True))
            secure_files(path, create=False, write=True)
    return conns[0], (conns[1] if len(conns) > 1 else None)


def _writable_sidecars(conns: list[apsw.Connection], path: str, real: str,
                       uri: str) -> apsw.Connection:
    """Before a writer's first write to a file it accepted: make writable a -wal or
    -shm a read left read-only (the connection, which opened them read-only, is
    opened again), and refuse, naming it, one that stays so. The writer's
    connection, new or not."""
    if restore_sidecar_write(real):
        close_quietly(conns.pop())
        conns.append(connect(uri, write=True, path=path))
    said = _read_only_file(path)
    if said is not None:
        raise StoreOpenError(said)
    return conns[0]


def _cannot_make_shm(path: str, exc: apsw.Error) -> bool:
    """Whether a read-only open failed only because no -shm could be made
    (SQLite says "unable to open" when a -wal is there)."""
    if isinstance(exc, apsw.ReadOnlyError):
        return _extended(exc) == apsw.SQLITE_READONLY_DIRECTORY
    if isinstance(exc, WRITE_FAILED):  # a full disk: the -shm's 32 KiB could not be written
        return _shm_size(path) < _SHM_SIZE
    return not os.path.exists(path + "-shm") and (
        _on_read_only_fs(path) or not os.access(_directory_of(path), os.W_OK | os.X_OK))


#: The size of a -wal's header; anything past it is frames.
_WAL_HEADER = 32
#: The size of a -shm that SQLite has made (its first region).
_SHM_SIZE = 32768
#: SQLite's extended codes for a -shm it could not make.
_SHM_FAILED = frozenset((apsw.SQLITE_IOERR_SHMOPEN, apsw.SQLITE_IOERR_SHMSIZE,
                         apsw.SQLITE_IOERR_SHMMAP))


def _shm_size(path: str) -> int:
    try:
        return os.path.getsize(path + "-shm")
    except OSError:
        return 0


def _unread_wal(path: str) -> str | None:
    """The sentence for a -wal holding frames that no -shm can be made to read
    (see ``_cannot_make_shm``), or None when it holds none."""
    try:
        if os.path.getsize(path + "-wal") <= _WAL_HEADER:
            return None
    except OSError:
        return None
    name = os.path.basename(path)
    if _shm_size(path) < _SHM_SIZE and not (
            _on_read_only_fs(path) or not os.access(_directory_of(path), os.W_OK | os.X_OK)):
        return (f"{path}-wal may hold commits not yet in {name}, and SQLite reads them only "
                f"through {name}-shm, which the full file system holding it has no room "
                f"for: free {_SHM_SIZE // 1024} KiB there and try again")
    where = ("on a read-only file system" if _on_read_only_fs(path)
             else f"in {_directory_of(path)}, which this user cannot write")
    return (f"{path}-wal may hold commits not yet in {name}, and SQLite reads them only "
            f"through {name}-shm, which cannot be created {where}: copy {name} and "
            f"{name}-wal together to a directory this user can write and open the copy")


def _extended(exc: apsw.Error) -> int:
    code = getattr(exc, "extendedresult", None)
    return code if isinstance(code, int) else -1


def _version_error(path: str, version: int) -> SchemaVersionError:
    if version < 0:
        return unknown_version(path, version)
    if version > SCHEMA_VERSION:
        side = (f"the database is newer; open it with the agentrt build that migrated it "
                f"to version {version}")
    else:
        side = ("this build is newer; let the consumer that owns the database migrate it "
                "(open_store), then open it again")
    return SchemaVersionError(
        f"{path} is at version {version}, this build writes {SCHEMA_VERSION}: {side}",
        found=version,
        known=SCHEMA_VERSION,
    )

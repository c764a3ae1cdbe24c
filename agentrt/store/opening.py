"""How a database file is opened: the owner-only mode rules and hardened connections.

Anyone who can write the file can forge an approval (its hash holds no
secret), so the file is the operator's: created 0600, refused when group or
others can write it, and opened with SQLite's defensive mode on and
``trusted_schema`` off so a crafted file cannot run its author's SQL inside
the runtime's statements.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time

import apsw

from agentrt.errors import AgentrtError, InsecureModeError, SymlinkError, UnsafeSchemaError

__all__ = [
    "BUSY_TIMEOUT_MS",
    "StoreOpenError",
    "close_quietly",
    "connect",
    "lstat_regular",
    "refuse_unsafe_schema",
    "secure_files",
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
    if os.path.isabs(path):
        escaped = "file://" + escaped  # empty authority: a leading // stays a path
    else:
        escaped = "file:" + escaped
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"{escaped}?{query}" if query else escaped


def _check_one(path: str, st: os.stat_result, db_uid: int, sidecar: bool) -> None:
    if sidecar and not stat.S_ISREG(st.st_mode):
        raise InsecureModeError(path, st.st_mode, "which is not a regular file")
    if sidecar and st.st_uid != db_uid:
        raise InsecureModeError(path, st.st_mode, "owned by another user than the database")
    if st.st_mode & 0o022:
        raise InsecureModeError(path, st.st_mode, "writable by group or others")


def secure_files(path: str, *, create: bool, write: bool) -> None:
    """Apply the mode rules to the database file and its ``-wal``/``-shm`` sidecars.

    Creates a missing file 0600 when ``create``; refuses a file group or others
    can write, and a sidecar that is not a regular file or has another owner;
    a writer tightens files others can only read. A read-only open changes
    nothing. Skipped where file modes do not mean owner, group and others.
    """
    if not _MODES_MEAN_OWNERSHIP:
        return
    if create:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another creator won the race; the checks below still apply
        except OSError as exc:
            raise StoreOpenError(f"{path}: {exc.strerror}") from exc
        else:
            try:
                os.fchmod(fd, 0o600)  # whatever the umask
            finally:
                os.close(fd)
    try:
        db = os.stat(path)
    except OSError as exc:
        raise StoreOpenError(f"{path}: {exc.strerror}") from exc
    files: list[tuple[str, os.stat_result]] = [(path, db)]
    _check_one(path, db, db.st_uid, sidecar=False)
    for suffix in ("-wal", "-shm"):
        side = path + suffix
        try:
            st = os.lstat(side)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StoreOpenError(f"{side}: {exc.strerror}") from exc
        _check_one(side, st, db.st_uid, sidecar=True)
        files.append((side, st))
    if write:
        me = os.geteuid()
        for name, st in files:
            if st.st_uid == me and st.st_mode & 0o077:
                os.chmod(name, 0o600)


def connect(uri: str, *, write: bool, create: bool = False) -> apsw.Connection:
    """A connection with the runtime's pragmas: defensive, untrusted schema, busy wait.

    Writers also get ``synchronous=FULL``: in WAL mode NORMAL can lose the last
    commits on power loss, and the last commit may be the ``step.tool_started``
    of a tool that ran.
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
        conn.set_busy_timeout(BUSY_TIMEOUT_MS)
        conn.config(apsw.SQLITE_DBCONFIG_DEFENSIVE, 1)
        conn.config(apsw.SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0)
        conn.execute("PRAGMA trusted_schema=OFF")
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
    """Refuse a file holding a trigger or view: either would run its author's SQL."""
    row = conn.execute(
        "SELECT type, name FROM sqlite_schema WHERE type IN ('trigger','view') LIMIT 1"
    ).fetchone()
    if row is not None:
        kind, name = row
        raise UnsafeSchemaError(
            f'{path} has {kind} "{name}"; the runtime creates neither and will not run '
            "SQL a database's author put there: open a copy without it"
        )


def lstat_regular(path: str) -> None:
    """Refuse a symbolic link or anything else that is not a regular file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError as exc:
        raise StoreOpenError(
            f"{path} does not exist; name an existing agentrt database file"
        ) from exc
    except OSError as exc:
        raise StoreOpenError(f"{path}: {exc.strerror}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise SymlinkError(path)
    if not stat.S_ISREG(st.st_mode):
        raise StoreOpenError(f"{path} is not a regular file; name the database file itself")


def close_quietly(conn: apsw.Connection | None) -> None:
    if conn is not None:
        with contextlib.suppress(apsw.Error):
            conn.close()

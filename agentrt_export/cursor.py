"""Where a follower remembers how far it got: the seq of the last event its
sink accepted.

A restart resumes after that seq, so each event reaches the sink once across
stops that return, and at most one page is sent again after a hard kill.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agentrt.errors import AgentrtError, described

__all__ = ["Cursor", "CursorError", "CursorSeqError", "FileCursor", "MemoryCursor"]

#: The largest seq SQLite can hand out (a signed 64-bit rowid).
_MAX_SEQ = 2**63 - 1
#: More than this is not a cursor file; reading stops there (bounded memory).
_MAX_FILE_BYTES = 64
#: The files SQLite keeps beside a database: none of them may be the cursor.
_DATABASE_FILES = (("", "the database"), ("-wal", "the write-ahead log of the database"),
                   ("-shm", "the shared-memory index of the database"),
                   ("-journal", "the rollback journal of the database"))
_DIGITS = re.compile(rb"[0-9]+")
#: The extended attribute binding a cursor file to the database it follows:
#: ``<seq>:<chain hash of the event at seq>`` (see ``FileCursor.binding``).
BINDING_ATTRIBUTE = "user.agentrt.chain_hash"
_BINDING = re.compile(r"([0-9]{1,19}):([0-9a-f]{64})")
#: What a file system without user extended attributes (or a platform without
#: them) answers: the cursor then goes unbound, as the reference's always is.
_NO_XATTRS = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.EACCES,
              getattr(errno, "ENODATA", errno.ENOENT)}


class CursorError(AgentrtError):
    """A cursor could not be read or saved, or was given something that is not
    a position or a file name; the message names the file (if any) and the fix."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        Exception.__init__(self, f"export: {detail}")


class CursorSeqError(CursorError, ValueError):
    """A seq a cursor cannot hold (not an int, negative, past SQLite's largest).
    Also a ValueError, which ``FileCursor.save`` raised for a negative seq before."""


def _check_seq(seq: object, path: str = "", *, limit: int | None = None) -> int:
    """``seq`` if it is a position a cursor can hold: an int (not a bool) from 0
    (nothing delivered) up to ``limit``; a CursorSeqError naming it otherwise."""
    what = f"cursor file {path}" if path else "cursor"
    held = "a cursor holds the seq of the last event delivered (0: none yet)"
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise CursorSeqError(path, f"{what}: seq is {described(seq)}, not an int: {held}")
    if seq < 0:
        raise CursorSeqError(path, f"{what}: seq {seq} is negative: {held}")
    if limit is not None and seq > limit:
        raise CursorSeqError(path, f"{what}: seq {seq} is past any seq SQLite hands out "
                                   f"(at most {limit})")
    return seq


@runtime_checkable
class Cursor(Protocol):
    """Loads and saves the last delivered seq (0: nothing delivered yet)."""

    def load(self) -> int: ...

    def save(self, seq: int) -> None: ...


@dataclass
class MemoryCursor:
    """A cursor in memory: for a follower that starts over every time, or
    whose caller persists ``seq`` itself."""

    seq: int = 0

    def __post_init__(self) -> None:
        _check_seq(self.seq)

    def load(self) -> int:
        return self.seq

    def save(self, seq: int) -> None:
        self.seq = _check_seq(seq)


class FileCursor:
    """A cursor kept in a file as the decimal seq and a newline (``42\\n``).

    Saves are atomic and durable: a temporary file in the same directory is
    written, synced, made 0600 and renamed over the cursor, then the
    directory is synced so the rename survives a power cut. A crash leaves
    the old cursor or the new one, never a torn file. Loading while a
    follower saves is safe. ``check`` refuses, before a follower delivers
    anything, a path a save would fail on or that is not a cursor's to take.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        name = os.fspath(path) if isinstance(path, os.PathLike) else path
        if not isinstance(name, str):
            raise CursorError("", f"cursor file path is {described(name)}, not a str or "
                                  "os.PathLike naming the file that holds the cursor")
        if not name:
            raise CursorError("", "cursor file path is empty: name the file that holds the "
                                  "cursor, such as export.cursor")
        if "\x00" in name:
            raise CursorError(name, f"cursor file path {name!r} holds a NUL character, which "
                                    "no file name can: name the file that holds the cursor")
        self.path = name

    def __repr__(self) -> str:
        return f"FileCursor({self.path!r})"

    def load(self) -> int:
        """The saved seq; 0 when the file does not exist yet."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(_MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise CursorError(
                self.path, f"load cursor: cannot read {self.path}: {exc.strerror or exc}"
            ) from exc
        text = data.strip()
        if len(data) > _MAX_FILE_BYTES or _DIGITS.fullmatch(text) is None or int(text) > _MAX_SEQ:
            raise CursorError(
                self.path,
                f"load cursor: {self.path} does not hold a sequence number; name another "
                "cursor file, or remove it if it is a stale cursor, or restore it from a backup",
            )
        return int(text)

    def check(self, database: str | None = None) -> None:
        """Refuse a cursor that could not be saved, before anything is delivered.

        A save renames a temporary file into the cursor's directory, so the
        directory must exist and this user must be able to write it; the path,
        if it exists, must be a regular file, not a symbolic link (the rename
        would replace the link); and it must not be ``database``
        or one of the files SQLite keeps beside it (-wal, -shm, -journal), by
        name or as the same file under another name (a hard link). Raises
        CursorError naming the cursor file and the fix; opens no file.
        """
        path = self.path
        directory, name = os.path.split(path)
        directory = directory or "."
        if not name:
            raise CursorError(path, f"cursor file {path} names a directory; name a file in it "
                                    "to hold the cursor, such as "
                                    f"{os.path.join(path, 'export.cursor')}")
        try:
            dir_mode = os.stat(directory).st_mode
        except FileNotFoundError:
            raise CursorError(path, f"the directory of cursor file {path} does not exist: "
                                    f"create {directory}, or name a cursor file in an existing "
                                    "directory") from None
        except OSError as exc:
            raise CursorError(path, f"cannot reach the directory of cursor file {path}: "
                                    f"{exc.strerror or exc}; name a cursor file in a directory "
                                    "this user can write") from None
        if not stat.S_ISDIR(dir_mode):
            raise CursorError(path, f"cursor file {path} is not in a directory: {directory} is "
                                    "not one; name a cursor file in a directory")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise CursorError(path, f"cannot save cursor file {path}: this user cannot write its "
                                    f"directory {directory}; make the directory writable, or name "
                                    "a cursor file in a directory this user can write")
        try:
            st: os.stat_result | None = os.stat(path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise CursorError(path, f"cannot read cursor file {path}: {exc.strerror or exc}; "
                                    "name a cursor file this user can read") from None
        if database and database != ":memory:":
            what = _database_file(path, st, database)
            if what:
                raise CursorError(path, f"cursor file {path} is {what} {database}; the cursor "
                                        "needs a file of its own: name another one, such as "
                                        f"{database}.cursor")
        if os.path.islink(path):
            # A save renames its temporary file over the path: the link would
            # become a file of its own and the file it names would stay behind.
            raise CursorError(path, f"cursor file {path} is a symbolic link (to "
                                    f"{os.readlink(path)}), which a save would replace with a "
                                    "file of its own instead of writing where it points: name "
                                    f"the file itself, {os.path.realpath(path)}")
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise CursorError(path, f"cursor file {path} is not a regular file ({_kind(st)}); "
                                    "name a file that holds only the cursor (it is created on "
                                    "the first save)")

    def binding(self, seq: int) -> str | None:
        """The chain hash of the event at ``seq`` (the seq just loaded), as a
        follower saved it with that seq, or None: no file, a save without one,
        a seq written into the file by hand since (the attribute names the seq
        it was saved with), a file copied without its extended attributes, a
        file system or platform without them, or a cursor written by the
        reference. The file's content stays the reference's ``42\n``: the hash
        is kept in an extended attribute."""
        getxattr = getattr(os, "getxattr", None)
        if getxattr is None:
            return None
        try:
            value = getxattr(self.path, BINDING_ATTRIBUTE)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in _NO_XATTRS:
                return None
            raise CursorError(self.path, f"load cursor: cannot read {self.path}: "
                                         f"{exc.strerror or exc}") from exc
        found = _BINDING.fullmatch(value.decode("ascii", "replace"))
        if found is None or int(found.group(1)) != seq:
            return None
        return found.group(2)

    def save(self, seq: int, binding: str | None = None) -> None:
        """Replace the saved seq with ``seq``, atomically and durably; a seq that
        is not an int from 0 to 2**63-1 is refused (CursorError, also a
        ValueError) before the file is touched. ``binding``, the chain hash of
        the event at ``seq``, is kept with it where the file system allows
        (see :meth:`binding`); a save without one leaves the cursor unbound."""
        _check_seq(seq, self.path, limit=_MAX_SEQ)
        directory, name = os.path.split(self.path)
        directory = directory or "."
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
        except OSError as exc:
            raise self._save_error(exc) from exc
        try:
            try:
                data = b"%d\n" % seq
                while data:
                    data = data[os.write(fd, data) :]
                os.fchmod(fd, 0o600)  # mkstemp's 0600 may have lost bits to the umask
                if binding:
                    _bind(fd, f"{seq}:{binding}")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise self._save_error(exc) from exc
            raise
        try:
            _sync_directory(directory)
        except OSError as exc:
            raise self._save_error(exc) from exc

    def _save_error(self, exc: OSError) -> CursorError:
        return CursorError(
            self.path,
            f"save cursor: cannot write {self.path}: {exc.strerror or exc}; {self._held()}",
        )

    def _held(self) -> str:
        """What the file holds after a failed save, and what a restart then sends."""
        try:
            seq = self.load()
        except CursorError:
            return "the cursor file is unchanged"
        if seq:
            return f"it holds seq {seq}, so the next start sends the events after it again"
        return "no seq was saved before, so the next start sends every event again"


def _bind(fd: int, binding: str) -> None:
    """Set the binding on the temporary file, so it is renamed with its seq."""
    setxattr = getattr(os, "setxattr", None)  # Linux: takes the descriptor
    if setxattr is None:
        return
    try:
        setxattr(fd, BINDING_ATTRIBUTE, binding.encode("ascii"))
    except OSError as exc:
        if exc.errno not in _NO_XATTRS:
            raise


def _database_file(path: str, st: os.stat_result | None, database: str) -> str:
    """What of ``database``'s files ``path`` is ('' if none): the same name, or,
    for a file that exists, the same device and inode (a hard link)."""
    real = os.path.realpath(path)
    for suffix, what in _DATABASE_FILES:
        other = database + suffix
        if real == os.path.realpath(other):
            return what
        if st is not None:
            try:
                o = os.stat(other)
            except OSError:
                continue
            if (o.st_dev, o.st_ino) == (st.st_dev, st.st_ino):
                return what
    return ""


def _kind(st: os.stat_result) -> str:
    mode = st.st_mode
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "an unusual kind of file"


def _sync_directory(directory: str) -> None:
    """Make a rename in ``directory`` durable (the reference skipped this)."""
    if os.name == "nt":  # no directory handles to sync; NTFS journals renames
        return
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some file systems (certain network mounts) cannot sync a directory
        # and say EINVAL; the rename is then as durable as they make it.
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)

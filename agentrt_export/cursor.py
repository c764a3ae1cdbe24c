"""Where a follower remembers how far it got: the seq of the last event its
sink accepted.

A restart resumes after that seq, so each event reaches the sink once across
stops that return, and at most one page is sent again after a hard kill.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
import tempfile
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, runtime_checkable

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; a cursor file is not held there
    fcntl = None  # type: ignore[assignment]

from agentrt.errors import AgentrtError, described, shown_number

__all__ = ["ALL_RUNS", "Cursor", "CursorError", "CursorHeldError", "CursorSeqError",
           "FileCursor", "MemoryCursor", "scope_of"]

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
_HASH = re.compile(r"[0-9a-f]{64}")
#: The extended attribute naming the scope a cursor file's seq was saved under:
#: ``<seq>:<scope>``, the scope as :func:`scope_of` makes it. An attribute of its
#: own, beside the binding: a reader that knows only the binding (an older
#: agentrt_export) reads that as before, and one without a scope reads as today.
SCOPE_ATTRIBUTE = "user.agentrt.scope"
#: The scope of an export of every run; one run's is ``run:<id>``, or, for an id
#: longer than ``_MAX_SCOPE_ID`` bytes of UTF-8 (or not UTF-8), ``run-sha256:<hex>``.
ALL_RUNS = "all"
_SCOPE = re.compile(r"([0-9]{1,19}):(all|run:.+|run-sha256:[0-9a-f]{64})", re.DOTALL)
#: Longer run ids are kept as their hash: an attribute's value must fit beside
#: the binding in the file system's attribute space (one 4 KiB block on ext4).
_MAX_SCOPE_ID = 255
#: What a file system without user extended attributes (or a platform without
#: them) answers: the cursor then goes unbound, as the reference's always is.
_NO_XATTRS = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.EACCES,
              getattr(errno, "ENODATA", errno.ENOENT)}
#: What a lock file holds: nothing yet, or the pid of the process holding it.
_LOCK_CONTENT = re.compile(rb"(?:pid ([0-9]{1,10})\n?)?")
#: Tries to lock the lock file a holder removes as it lets go (see ``acquire``).
_LOCK_TRIES = 100


class CursorError(AgentrtError):
    """A cursor could not be read or saved, or was given something that is not
    a position or a file name; the message names the file (if any) and the fix."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        Exception.__init__(self, f"export: {detail}")


class CursorHeldError(CursorError):
    """Another exporter holds the cursor file (``pid``: its process, None when
    unknown): two followers on one cursor would each deliver every event and
    save over each other's position."""

    def __init__(self, path: str, pid: int | None, *, in_process: bool = False) -> None:
        self.pid = pid
        holder = "another exporter"
        if in_process:  # not told by the pid: another container's may equal ours
            holder = f"another follower in this process (pid {pid})"
        elif pid is not None:
            holder = f"another exporter (pid {pid})"
        super().__init__(path, f"cursor file {path} is held by {holder}, which delivers the "
                               "same events and saves its own position there: stop it, or "
                               "give this exporter a cursor file of its own (--cursor-file)")


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
        raise CursorSeqError(path, f"{what}: seq {shown_number(seq)} is negative: {held}")
    if limit is not None and seq > limit:
        raise CursorSeqError(path, f"{what}: seq {shown_number(seq)} is past any seq SQLite "
                                   "hands out "
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

    One exporter at a time follows with a cursor file: ``acquire`` (which
    ``Follower.follow`` and ``with FileCursor(path)`` call) holds it until
    ``close`` or the process's end, however it ends, and refuses it while
    another holds it. ``load`` and ``save`` take no hold, so tooling may read
    the position of a running follower.
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
        self._lock: int | None = None  # the locked lock file's descriptor while held

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
        try:
            name_max = os.pathconf(directory, "PC_NAME_MAX")
        except (OSError, ValueError):
            name_max = 255
        if len(os.fsencode(f".{name}.")) + 8 > name_max or len(os.fsencode(name)) + 5 > name_max:
            raise CursorError(path, f"cursor file name {name} is too long: a save writes "
                                    f".{name}.XXXXXXXX and the hold {name}.lock beside it, "
                                    f"longer than the {name_max} bytes a name may have in "
                                    f"{directory}; name a cursor file of at most "
                                    f"{name_max - 10} bytes")
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

    @property
    def lock_path(self) -> str:
        """The file whose lock holds the cursor file: beside it, as the cursor's own
        rename would drop a lock taken on the cursor file itself."""
        return self.path + ".lock"

    @property
    def held(self) -> bool:
        """Whether this object holds the cursor file (see :meth:`acquire`)."""
        return self._lock is not None

    def acquire(self) -> None:
        """Hold the cursor file for this process, or raise CursorHeldError naming
        the holder's pid; does nothing if this object holds it already.

        The hold is an advisory lock (flock) on :attr:`lock_path`, created 0600
        and never through a symbolic link, holding ``pid N``; the same file
        reached by another path (a relative one, a linked directory) is the
        same lock. The kernel lets go of it when the process ends, even by
        SIGKILL; a forked child does not inherit it. Refused with a CursorError,
        before any lock file is made, are the paths ``check`` refuses.
        """
        if self._lock is not None or fcntl is None:
            return
        self.check()
        lock = self.lock_path
        for _ in range(_LOCK_TRIES):
            fd = self._open_lock(lock)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                pid = _holder(fd)
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    mine = any(c._lock is not None and _same_file(c._lock, lock)
                               for c in list(_holding))
                    raise CursorHeldError(self.path, pid, in_process=mine) from None
                raise CursorError(self.path, f"cannot hold cursor file {self.path}: cannot lock "
                                             f"{lock}: {exc.strerror or exc}; name a cursor "
                                             "file on a local file system") from None
            if _same_file(fd, lock):
                break
            os.close(fd)  # its holder removed it as it let go: lock the one there now
        else:  # pragma: no cover - a lock file replaced a hundred times in a row
            raise CursorError(self.path, f"cannot hold cursor file {self.path}: {lock} keeps "
                                         "being replaced; stop whatever replaces it")
        with contextlib.suppress(OSError):  # the pid only names the holder to the refused
            os.ftruncate(fd, 0)
            os.pwrite(fd, b"pid %d\n" % os.getpid(), 0)
        self._lock = fd
        _holding.add(self)

    def close(self) -> None:
        """Let go of the hold (if any) and remove the lock file; the cursor can
        still be loaded, saved and acquired again."""
        fd, self._lock = self._lock, None
        if fd is None:
            return
        _holding.discard(self)
        # Removed while still locked: one that opened it meanwhile sees it gone
        # once it gets the lock, and takes the file a newcomer made instead. One
        # that cannot be removed is left behind, and taken over as a SIGKILL's is.
        try:
            with contextlib.suppress(OSError):
                if _same_file(fd, self.lock_path):
                    os.unlink(self.lock_path)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def following(self) -> Iterator[None]:
        """Held by ``Follower.follow`` while it follows with this object: the
        file is held (:meth:`acquire`) unless its caller holds it already, and
        that hold ends with the follow; a second follow on this same object (a
        thread restarted while the old one winds down, two followers under one
        ``with``) is refused as another exporter would be, instead of
        delivering every event again and letting go of the file early."""
        following = self.__dict__.setdefault("_following", threading.Lock())
        if not following.acquire(blocking=False):
            raise CursorHeldError(self.path, os.getpid(), in_process=True)
        try:
            took = self._lock is None
            self.acquire()
            try:
                yield
            finally:
                if took:
                    self.close()
        finally:
            following.release()

    def __enter__(self) -> FileCursor:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _open_lock(self, lock: str) -> int:
        """The lock file, opened (created 0600 if missing) without following a
        link or blocking on a pipe; refused unless it is a regular file that
        holds nothing or a pid, so no other file is ever locked or written."""
        flags = (os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                 | os.O_CLOEXEC)
        try:
            fd = os.open(lock, flags, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                problem = (f"its lock file {lock} is a symbolic link, which is never "
                           f"followed: remove {lock}, or name another cursor file")
            else:
                problem = (f"cannot open its lock file {lock}: {exc.strerror or exc}; name a "
                           "cursor file in a directory this user can write")
            raise CursorError(self.path, f"cannot hold cursor file {self.path}: {problem}"
                              ) from None
        st = os.fstat(fd)
        what = _kind(st) if not stat.S_ISREG(st.st_mode) else None
        if what is None and _LOCK_CONTENT.fullmatch(os.pread(fd, 32, 0)) is None:
            what = "a file holding something other than a pid"
        if what is not None:
            os.close(fd)
            raise CursorError(self.path, f"cannot hold cursor file {self.path}: its lock file "
                                         f"{lock} is {what}, not a lock file, and is left "
                                         "alone; move it away, or name another cursor file")
        return fd

    def binding(self, seq: int) -> str | None:
        """The chain hash of the event at ``seq`` (the seq just loaded), as a
        follower saved it with that seq, or None: no file, a save without one,
        a seq written into the file by hand since (the attribute names the seq
        it was saved with), a file copied without its extended attributes, a
        file system or platform without them, or a cursor written by the
        reference. The file's content stays the reference's ``42\n``: the hash
        is kept in an extended attribute."""
        found = _BINDING.fullmatch(self._attribute(BINDING_ATTRIBUTE).decode("ascii", "replace"))
        if found is None or int(found.group(1)) != seq:
            return None
        return found.group(2)

    def scope(self, seq: int) -> str | None:
        """The scope of the export that saved ``seq`` (the seq just loaded):
        ``ALL_RUNS`` or one run's (see :func:`scope_of`); None, as for
        :meth:`binding`, when none was saved with that seq. The seq stands after
        every event of that scope up to it, and no other: a wider export would
        skip the rest for good (``Follower`` refuses it)."""
        found = _SCOPE.fullmatch(self._attribute(SCOPE_ATTRIBUTE).decode("utf-8", "replace"))
        if found is None or int(found.group(1)) != seq:
            return None
        return found.group(2)

    def _attribute(self, name: str) -> bytes:
        """The cursor file's extended attribute ``name``; empty where it has none
        (no file, none set, a file system or platform without them)."""
        getxattr = getattr(os, "getxattr", None)
        if getxattr is None:
            return b""
        try:
            value: bytes = getxattr(self.path, name)
        except FileNotFoundError:
            return b""
        except OSError as exc:
            if exc.errno in _NO_XATTRS:
                return b""
            raise CursorError(self.path, f"load cursor: cannot read {self.path}: "
                                         f"{exc.strerror or exc}") from exc
        return value

    def save(self, seq: int, binding: str | None = None, scope: str | None = None) -> None:
        """Replace the saved seq with ``seq``, atomically and durably; a seq that
        is not an int from 0 to 2**63-1 is refused (CursorError, also a
        ValueError) before the file is touched. ``binding``, the chain hash of
        the event at ``seq``, and ``scope``, that of the export that delivered
        up to it (:func:`scope_of`), are kept with it where the file system
        allows (see :meth:`binding`, :meth:`scope`); a save without them leaves
        the cursor unbound and its scope unknown."""
        _check_seq(seq, self.path, limit=_MAX_SEQ)
        if scope is not None and (not isinstance(scope, str)
                                  or _SCOPE.fullmatch(f"{seq}:{scope}") is None):
            shown = repr(scope) if isinstance(scope, str) else described(scope)
            raise CursorError(self.path, f"cursor file {self.path}: scope {shown} is not an "
                                         "export's: pass scope_of(run_id), 'all' for every run "
                                         "or 'run:ID' for one")
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
                if binding and _HASH.fullmatch(binding):  # else unbound, as binding() reads it
                    _set_attribute(fd, BINDING_ATTRIBUTE, f"{seq}:{binding}".encode("ascii"))
                if scope:
                    _set_attribute(fd, SCOPE_ATTRIBUTE, f"{seq}:{scope}".encode())
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


#: Every FileCursor holding its file, let go of in a forked child (see below).
_holding: weakref.WeakSet[FileCursor] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child does not hold its parent's cursor files: it closes its copy
    of each lock (the parent's stays locked: flock belongs to the open file),
    so the hold still ends with the parent, and a child that follows must
    acquire the file, which is refused while the parent holds it."""
    for cursor in list(_holding):
        cursor.__dict__["_following"] = threading.Lock()  # a follow of the parent's thread
        fd, cursor._lock = cursor._lock, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    _holding.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _holder(fd: int) -> int | None:
    """The pid a lock file names (None: none yet, or unreadable)."""
    try:
        found = _LOCK_CONTENT.fullmatch(os.pread(fd, 32, 0))
    except OSError:
        return None
    return int(found.group(1)) if found and found.group(1) else None


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` (not followed) still names the file open as ``fd``."""
    try:
        there = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    here = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def scope_of(run_id: str) -> str:
    """The scope a cursor saved by an export of ``run_id`` ('': every run) holds."""
    if not run_id:
        return ALL_RUNS
    try:
        if len(run_id.encode()) <= _MAX_SCOPE_ID:
            return f"run:{run_id}"
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 to keep
        pass
    return "run-sha256:" + hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()


def _set_attribute(fd: int, name: str, value: bytes) -> None:
    """Set an attribute on the temporary file, so it is renamed with its seq."""
    setxattr = getattr(os, "setxattr", None)  # Linux: takes the descriptor
    if setxattr is None:
        return
    try:
        setxattr(fd, name, value)
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

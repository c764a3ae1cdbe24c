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
import tempfile
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agentrt.errors import AgentrtError

__all__ = ["Cursor", "CursorError", "FileCursor", "MemoryCursor"]

#: The largest seq SQLite can hand out (a signed 64-bit rowid).
_MAX_SEQ = 2**63 - 1
#: More than this is not a cursor file; reading stops there (bounded memory).
_MAX_FILE_BYTES = 64
_DIGITS = re.compile(rb"[0-9]+")


class CursorError(AgentrtError):
    """A cursor could not be read or saved; the message names the file and the fix."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        Exception.__init__(self, f"export: {detail}")


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

    def load(self) -> int:
        return self.seq

    def save(self, seq: int) -> None:
        self.seq = seq


class FileCursor:
    """A cursor kept in a file as the decimal seq and a newline (``42\\n``).

    Saves are atomic and durable: a temporary file in the same directory is
    written, synced, made 0600 and renamed over the cursor, then the
    directory is synced so the rename survives a power cut. A crash leaves
    the old cursor or the new one, never a torn file. Loading while a
    follower saves is safe.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

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
                f"load cursor: {self.path} does not hold a sequence number; "
                "delete it to start over or restore it from a backup",
            )
        return int(text)

    def save(self, seq: int) -> None:
        """Replace the saved seq with ``seq``, atomically and durably."""
        if not 0 <= seq <= _MAX_SEQ:
            raise ValueError(f"cursor seq {seq} is not a sequence number")
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
        where = exc.filename or self.path
        return CursorError(
            self.path,
            f"save cursor: {where}: {exc.strerror or exc}; the cursor still holds "
            "the previous seq, so the next start resends what came after it",
        )


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

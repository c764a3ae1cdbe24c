"""Errors raised by agentrt, all under one base class.

Each class keeps the reference runtime's sentinel text as its base message so
callers (and the operator command) can match on type and still show the same
sentence the reference shows. Specific details are appended after ": ".
"""

from __future__ import annotations

import stat
from datetime import datetime

__all__ = [
    "AgentrtError",
    "ApprovalChangedError",
    "ApprovalExpiredError",
    "ApprovalHashError",
    "EncodeError",
    "InsecureModeError",
    "LeaseLostError",
    "NOT_A_REGULAR_FILE",
    "NotFoundError",
    "NotPendingError",
    "RunLeasedError",
    "RunStateError",
    "SchemaVersionError",
    "SessionClosedError",
    "SymlinkError",
    "UnsafeSchemaError",
    "described",
    "exception_text",
    "raised_text",
]


#: The longest value :func:`described` quotes.
_MAX_SHOWN = 60


def exception_text(exc: BaseException) -> str:
    """What an exception from consumer code says, for the record: its ``str()``,
    or its type's name when that is empty, not a str, or raises. How a tool's,
    agent's or model's error prints must not be able to break the recording of
    the failure it stands for."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a __str__ that fails says nothing usable
        text = ""
    return text if isinstance(text, str) and text else type(exc).__name__


def raised_text(what: str, exc: BaseException) -> str:
    """``<what> raised <Type>: <text>``: how a failing call of consumer code is said."""
    return f"{what} raised {type(exc).__name__}: {exception_text(exc)}"


def shown_number(value: object) -> str:
    """``value`` as a sentence shows it: Python refuses to write an int of more
    than 4300 digits, and nobody reads one."""
    if isinstance(value, int) and value.bit_length() > 1024:
        return f"{'-' if value < 0 else ''}(a number of {value.bit_length()} bits)"
    return str(value)


def described(value: object) -> str:
    """``None``, ``an int (5)``, ``a str ('x')``, ``a dict``: a value's type, and
    the value itself when it is a short scalar, for a sentence about a wrong
    argument (a container's repr could be huge, or a secret)."""
    if value is None:
        return "None"
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    if isinstance(value, int) and value.bit_length() > 1024:  # repr refuses past 4300 digits
        return f"{article} {name} (of {value.bit_length()} bits)"
    if isinstance(value, (bool, int, float, str, bytes)):
        shown = repr(value)
        if len(shown) <= _MAX_SHOWN:
            return f"{article} {name} ({shown})"
        return f"{article} {name} ({shown[:_MAX_SHOWN]}...)"
    return f"{article} {name}"


class AgentrtError(Exception):
    """Base class of every error the runtime raises on purpose."""

    base = "agentrt: error"

    def __init__(self, detail: str = "") -> None:
        self.detail = detail
        super().__init__(f"{self.base}: {detail}" if detail else self.base)


class NotFoundError(AgentrtError):
    base = "agentrt: not found"


class RunStateError(AgentrtError):
    """A run or step is not in the state the operation requires."""

    base = "agentrt: run is not in the required state"


class RunLeasedError(RunStateError):
    """Another driver (or this one) holds the run's lease."""

    def __init__(self, run_id: str, owner: str, expires_at: datetime | None) -> None:
        self.run_id = run_id
        self.owner = owner
        self.expires_at = expires_at
        from agentrt.timefmt import format_time_nano

        until = ("with no expiry recorded" if expires_at is None
                 else f"until {format_time_nano(expires_at)}")
        self.detail = f"run {run_id} is leased by {owner or '(no owner)'} {until}"
        Exception.__init__(self, f"agentrt: {self.detail}")

    @classmethod
    def in_another_call(cls, run_id: str, owner: str, expires_at: datetime | None,
                        ) -> RunLeasedError:
        """This driver's own refusal: another of its calls is driving the run."""
        exc = cls(run_id, owner, expires_at)
        exc.detail = (f"run {run_id} is leased by {owner}: another call of this driver is "
                      "driving it; wait for that call to return")
        Exception.__init__(exc, f"agentrt: {exc.detail}")
        return exc


class LeaseLostError(RunStateError):
    """The loop no longer holds its run's lease (another driver took it over, or
    it expired): it stops before its next side effect. A ``RunStateError``, as
    the reference's lost lease wraps its run-state error."""

    base = "agentrt: run lease lost"


class NotPendingError(AgentrtError):
    base = "agentrt: approval is not pending"


class ApprovalExpiredError(NotPendingError):
    """An approval expired; it is also a NotPendingError, as in the reference."""


class ApprovalChangedError(AgentrtError):
    base = "agentrt: approval is not the one that was shown"


class ApprovalHashError(AgentrtError):
    base = "agentrt: approval hash does not match its recorded request"


class SchemaVersionError(AgentrtError):
    base = "agentrt: database schema version does not match this build"

    def __init__(self, detail: str = "", *, found: int = 0, known: int = 0) -> None:
        self.found = found
        self.known = known
        super().__init__(detail)


class UnsafeSchemaError(AgentrtError):
    base = "agentrt: database holds a trigger or view"


class SymlinkError(AgentrtError):
    def __init__(self, path: str) -> None:
        self.path = path
        self.detail = f"database path is a symbolic link: {path}; name the database file itself"
        Exception.__init__(self, f"agentrt: {self.detail}")


def mode_string(mode: int) -> str:
    """``mode`` as Go's ``FileMode.String()`` prints it, as the reference's messages
    do: the type and setuid, setgid, sticky letters ("Lrwxrwxrwx", "urwxr-xr-x";
    "-" for a regular file), then rwx."""
    kind = stat.S_IFMT(mode)
    letters = {  # in Go's order, "dalTLDpSugct?", for the flags its os.Stat sets
        "d": kind == stat.S_IFDIR,
        "L": kind == stat.S_IFLNK,
        "D": kind in (stat.S_IFBLK, stat.S_IFCHR),
        "p": kind == stat.S_IFIFO,
        "S": kind == stat.S_IFSOCK,
        "u": bool(mode & stat.S_ISUID),
        "g": bool(mode & stat.S_ISGID),
        "c": kind == stat.S_IFCHR,
        "t": bool(mode & stat.S_ISVTX),
    }
    head = "".join(letter for letter, on in letters.items() if on) or "-"
    return head + "".join(c if mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))


#: The reason :class:`InsecureModeError` gives a sidecar that is not a file.
NOT_A_REGULAR_FILE = "which is not a regular file"


class InsecureModeError(AgentrtError):
    """A database or WAL file others could write, or a sidecar we cannot trust."""

    def __init__(self, path: str, mode: int, reason: str) -> None:
        self.path = path
        self.mode = mode
        self.reason = reason
        if reason == NOT_A_REGULAR_FILE:
            # chmod would follow a link to the file it names; the fix is the name's.
            remove = f"rmdir {path}" if stat.S_ISDIR(mode) else f"rm {path}"
            fix = (f"SQLite makes it as a regular file of the database's owner, and a link "
                   f"or anything else there would take the database's writes elsewhere: "
                   f"remove it ({remove}) once no process has the database open")
        else:
            fix = (f"the runtime keeps its database readable and writable by its owner only: "
                   f"chmod 600 {path} and chown it to the user that runs the runtime")
        self.detail = f"{path} is {mode_string(mode)}, {reason}; {fix}"
        Exception.__init__(self, f"agentrt: {self.detail}")


class SessionClosedError(AgentrtError):
    base = "agentrt: session is closed"


class EncodeError(AgentrtError):
    """A value would not encode; the run is failed as internal_error."""

    base = "agentrt: cannot encode"

"""What the two commands share: running a click group with the project's exit codes.

Expected failures print one sentence, ``error: <what and the fix>``, and exit 1;
usage errors print ``usage: <what is wrong>`` first, then the command's usage
line and where its help is, and exit 2; nothing prints a traceback. A reader
that goes away (``| head``) ends the command quietly with 0; output that
cannot be written (a full disk, a closed stdout) is one sentence and 1.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
from typing import Any

import click

from agentrt.errors import SchemaVersionError
from agentrt.trace import sanitize

__all__ = ["OUTPUT_CLOSED", "Count", "run_click", "schema_sentence", "silence_stdout"]

#: The error a write to a closed standard output raises (``>&-``).
OUTPUT_CLOSED = "standard output is closed"
#: The environment variable every command reads before anything else (the
#: others are checked where they are used: $USER by a decision without
#: --by, OTEL_* by agentrt-export otel).
_TEXT_VARIABLES = ("AGENTRT_DB",)


class Count(click.IntRange):
    """A whole number option written in ASCII digits and nothing else: Python's
    ``int()`` would also take ``' 5'``, ``+5``, ``1_0`` or an Arabic-Indic
    ``٣`` (read as 3)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not (value.isascii() and value.isdigit()):
            self.fail(f"{sanitize(value)!r} is not a whole number in ASCII digits", param, ctx)
        return super().convert(value, param, ctx)


class _ClosedOutput(io.TextIOBase):
    """Stands in for a closed stdout (Python leaves ``sys.stdout`` None), so a
    write fails as an OSError, which the runner reports, not as an
    AttributeError."""

    def write(self, s: str) -> int:
        raise OSError(errno.EBADF, OUTPUT_CLOSED)

    def flush(self) -> None:
        return None

    @property
    def buffer(self) -> Any:
        return self

    def writable(self) -> bool:
        return True


def _show_usage_error(exc: click.UsageError) -> None:
    """The sentence first, where a person (or a test) looks for it, then the usage."""
    ctx = exc.ctx
    if isinstance(exc, click.exceptions.NoArgsIsHelpError) and ctx is not None:
        click.echo(ctx.get_help(), err=True)
        return
    click.echo(f"usage: {exc.format_message()}", err=True)
    if ctx is not None:
        click.echo(ctx.get_usage(), err=True)
        if ctx.command.get_help_option(ctx) is not None:
            longest = max(ctx.command.get_help_option_names(ctx), key=len)
            click.echo(f"Try '{ctx.command_path} {longest}' for help.", err=True)


def silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush of a closed
    pipe does not print an error after the command has ended quietly."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def schema_sentence(path: str, exc: SchemaVersionError) -> str:
    """Why a database of another schema version is refused, and what to do: the
    same sentence from both commands."""
    if exc.found > exc.known:
        return (
            f"{path} is at schema version {exc.found}, which is newer than this build of "
            f"agentrt (version {exc.known}): use the agentrt that ships with the consumer "
            "that migrated it; the consumer that owns the database runs its migrations, "
            "agentrt never does")
    return (
        f"this build of agentrt (schema version {exc.known}) is newer than {path}, which "
        f"is at version {exc.found}: let the consumer that owns the database migrate it "
        "with its own runtime, or use the agentrt of its version; agentrt never migrates")


def _not_utf8(argv: list[str]) -> str:
    """Why an argument or a variable the commands read cannot be used: it is
    not valid UTF-8 (Python holds such bytes as lone surrogates, which no
    database, path or record here can take); '' when all are."""
    for i, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = sanitize(arg.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
            return f"argument {i} ({shown[:80]}) is not valid UTF-8; give it in UTF-8"
    for name, value in os.environ.items():
        if name in _TEXT_VARIABLES:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return f"${name} is not valid UTF-8; set it in UTF-8"
    return ""


def _output_failed(exc: OSError) -> str:
    """The sentence for an OSError that reached the top: a file the command
    named carries its name; without one it was the output."""
    cause = exc.strerror or str(exc)
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        from agentrt.store.opening import descriptors_exhausted

        return f"{cause}: {descriptors_exhausted(certain=True)}"
    if exc.filename:
        return f"{sanitize(str(exc.filename))}: {cause}"
    return f"writing output: {cause}"


def run_click(group: click.Command, prog_name: str, argv: list[str] | None = None) -> int:
    """Run ``group`` and return its exit code: 0 ok, 1 failure, 2 usage."""
    if sys.stdout is None:
        sys.stdout = _ClosedOutput()
    args = list(sys.argv[1:] if argv is None else argv)
    problem = _not_utf8(args)
    if problem:
        _say(f"usage: {problem}")
        return 2
    try:
        rv = group.main(args=args, prog_name=prog_name, standalone_mode=False)
        sys.stdout.flush()  # a full disk shows here, not at the interpreter's exit
    except click.UsageError as exc:
        with contextlib.suppress(OSError):  # see _say
            _show_usage_error(exc)
        return 2
    except click.ClickException as exc:
        _say(f"error: {exc.format_message()}")
        return 1
    except click.exceptions.Abort:
        _say("error: aborted")
        return 1
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except BrokenPipeError:
        silence_stdout()
        return 0
    except OSError as exc:
        _say(f"error: {_output_failed(exc)}")
        silence_stdout()
        return 1
    return rv if isinstance(rv, int) else 0


def _say(line: str) -> None:
    """``line`` on stderr. A stderr that is gone (a terminal that hung up while
    the command asked at it) cannot take it: the exit code still says it."""
    with contextlib.suppress(OSError):
        click.echo(line, err=True)

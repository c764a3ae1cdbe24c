"""What the two commands share: running a click group with the project's exit codes.

Expected failures print one sentence, ``error: <what and the fix>``, and exit 1;
usage errors print ``usage: <what is wrong>`` first, then the command's usage
line and where its help is, and exit 2; nothing prints a traceback. A reader
that goes away (``| head``) ends the command quietly with 0.
"""

from __future__ import annotations

import contextlib
import os
import sys

import click

__all__ = ["run_click", "silence_stdout"]


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


def run_click(group: click.Command, prog_name: str, argv: list[str] | None = None) -> int:
    """Run ``group`` and return its exit code: 0 ok, 1 failure, 2 usage."""
    try:
        rv = group.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except click.UsageError as exc:
        _show_usage_error(exc)
        return 2
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        return 1
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        return 1
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except BrokenPipeError:
        silence_stdout()
        return 0
    return rv if isinstance(rv, int) else 0

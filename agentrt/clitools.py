"""What the two commands share: running a click group with the project's exit codes.

Expected failures print one sentence, ``error: <what and the fix>``, and exit 1;
usage errors print the usage and exit 2; nothing prints a traceback.
"""

from __future__ import annotations

import click

__all__ = ["run_click"]


def run_click(group: click.Command, prog_name: str, argv: list[str] | None = None) -> int:
    """Run ``group`` and return its exit code: 0 ok, 1 failure, 2 usage."""
    try:
        rv = group.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except click.UsageError as exc:
        exc.show()
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
        return 0
    return rv if isinstance(rv, int) else 0



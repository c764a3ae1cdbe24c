"""The ``agentrt-export`` command's entry: the stop signals are taken before the
imports.

Importing the command (apsw, click, orjson, the store, the SDK for ``otel``)
takes a fifth of a second or more; a Ctrl-C in that window was a Python
traceback, and a SIGTERM or SIGHUP killed the process. Here such a signal is
noted, and once :mod:`agentrt_export.cli` is loaded the command starts
stopped: it reads nothing, delivers nothing, saves nothing and exits 0, as a
stop set before ``follow()`` does. A signal ignored on the way in is left as
the command leaves it (``cli._stop_signals``).
"""

from __future__ import annotations

import signal


def main(argv: list[str] | None = None) -> None:
    early: list[int] = []

    def note(signum: int, frame: object) -> None:
        early.append(signum)

    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        number = getattr(signal, name, None)
        if number is not None and (name == "SIGTERM"
                                   or signal.getsignal(number) != signal.SIG_IGN):
            signal.signal(number, note)

    from agentrt_export import cli

    cli.main(argv, stopped=early)

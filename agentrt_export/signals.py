"""Stop a follower on SIGTERM and SIGINT without the deadlock a plain handler risks.

A Python signal handler runs in the main thread between two bytecodes. When
those bytecodes are inside ``stop.wait(...)`` (the follower's short waits),
the thread holds the event's internal lock, and a handler calling
``stop.set()`` waits forever for a lock its own thread holds. So the handler
here does nothing: the C-level handler writes the signal's number to a socket
(``signal.set_wakeup_fd``) the moment it lands, and a daemon thread reading
that socket sets the events, as any other thread may.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterable

__all__ = ["stop_on_signals"]

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_lock = threading.Lock()
#: Each call's signals and the event they set; one reader serves them all.
_watched: list[tuple[frozenset[int], threading.Event]] = []
_reader: threading.Thread | None = None
#: The socket the reader thread reads; the handler writes to it too.
_sender: socket.socket | None = None


def stop_on_signals(stop: threading.Event,
                    signals: Iterable[signal.Signals] = DEFAULT_SIGNALS) -> None:
    """Make each of ``signals`` set ``stop`` instead of ending the process.

    Call it from the main thread (Python installs handlers only there). Calls
    add up: each event is set by its own signals, through one socket and one
    thread. It takes over ``signal.set_wakeup_fd``. A signal ignored on the
    way in stays ignored: a shell's ``cmd &`` ignores SIGINT, so that a Ctrl-C
    for the job in the foreground leaves it alone, and ``nohup`` SIGHUP.
    """
    global _reader, _sender
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("stop_on_signals() must be called from the main thread, the only "
                         "one Python lets install signal handlers")
    wanted = frozenset(int(s) for s in signals if signal.getsignal(s) != signal.SIG_IGN)
    with _lock:
        _watched.append((wanted, stop))
        if _reader is None:
            receiver, sender = socket.socketpair()
            sender.setblocking(False)
            _sender = sender
            signal.set_wakeup_fd(sender.fileno(), warn_on_full_buffer=False)
            _reader = threading.Thread(target=_set_on_signal, args=(receiver, sender),
                                       name="agentrt-export signals", daemon=True)
            _reader.start()
    for number in wanted:
        signal.signal(number, _handled_by_the_thread)


def _handled_by_the_thread(signum: int, frame: object) -> None:
    """Replaces the default action (terminate); ``_set_on_signal`` does the work.

    The wakeup fd is process-wide, and asyncio's ``add_signal_handler`` takes it
    over and leaves it at -1 when its loop closes: the signal's number is also
    written here, so the stop still comes (twice is harmless)."""
    sender = _sender
    if sender is not None:
        with contextlib.suppress(OSError):
            sender.send(bytes([signum]))


def _set_on_signal(receiver: socket.socket, sender: socket.socket) -> None:
    # ``sender`` is kept referenced here: the wakeup fd must stay open.
    while True:
        try:
            numbers = receiver.recv(512)
        except OSError:
            return
        if not numbers:
            return
        with _lock:
            watched = list(_watched)
        for wanted, stop in watched:
            if wanted.intersection(numbers):
                stop.set()

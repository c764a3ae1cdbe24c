"""Databases of synthetic events for follower and exporter tests.

The events are appended through the store's own transaction helper, so seq
and the hash chain are exactly what the runtime writes; only the runs are
bare rows. Also runnable as a writer process:
``python tests/eventdb.py PATH RUNS EVENTS_PER_RUN [PAUSE_SECONDS]``.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from agentrt.store import Store, open_store

BASE_TIME = datetime(2026, 10, 1, 9, 0, 0, tzinfo=UTC)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def add_run(
    store: Store,
    run_id: str,
    events: int,
    payload: Callable[[int], bytes] | None = None,
) -> None:
    """One run row and ``events`` events in one transaction."""
    with store.tx() as tx:
        tx.execute(
            "INSERT INTO runs (id, goal, status, limits_json, created_at) "
            "VALUES (?, 'synthetic', 'RUNNING', '{}', '2026-10-01T09:00:00Z')",
            (run_id,),
        )
        for i in range(events):
            data = payload(i) if payload else b'{"i":%d,"text":"a < b & c"}' % i
            tx.append(run_id, f"{run_id}-s{i // 3}" if i % 3 else "",
                      BASE_TIME + timedelta(milliseconds=i), "step.decided", data)


def make_db(path: str, runs: int = 2, events_per_run: int = 5) -> Store:
    store = open_store(path)
    for r in range(runs):
        add_run(store, f"run-{r}", events_per_run)
    return store


def child_env() -> dict[str, str]:
    """The environment for a child process running this checkout's code."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


@contextmanager
def child_process(args: Sequence[str], env: dict[str, str] | None = None,
                  **popen: Any) -> Iterator[subprocess.Popen[bytes]]:
    """A child running this checkout's code, stdout and stderr piped (``popen``
    overrides, e.g. ``stdout=subprocess.DEVNULL`` or a ``preexec_fn``); killed and
    reaped on the way out if still running, so a failing test leaves none behind."""
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
    proc = subprocess.Popen(args, env=child_env() if env is None else env, cwd=REPO_ROOT,
                            **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _write_forever(path: str, runs: int, per_run: int, pause: float) -> None:
    store = open_store(path)
    start = int(time.time() * 1000)
    for r in range(runs):
        add_run(store, f"w{start}-{r}", per_run)
        print(r, flush=True)
        if pause:
            time.sleep(pause)
    store.close()


if __name__ == "__main__":
    _write_forever(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                   float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)


def read_terminal(leader: int, quiet_for: float | None = None) -> bytes:
    """What a pseudo-terminal's other side showed, read from its ``leader`` until
    the side closes (the process ended), or, with ``quiet_for``, until nothing
    came for that many seconds."""
    seen = b""
    while quiet_for is None or select.select([leader], [], [], quiet_for)[0]:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        seen += chunk
    return seen

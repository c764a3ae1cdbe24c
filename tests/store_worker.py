"""A second process for the store tests: ``python tests/store_worker.py <command> ...``.

Each command uses the store the way another program on the same host would,
and reports on stdout, one line per fact, so the test can interleave with it.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agentrt.store import open_existing, open_store

T0 = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)


def say(*words: object) -> None:
    print(*words, flush=True)


def wait_for(go: str) -> None:
    deadline = time.monotonic() + 30
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.001)


def insert_run(tx: object, run_id: str) -> None:
    tx.execute(  # type: ignore[attr-defined]
        "INSERT INTO runs (id, goal, status, limits_json, created_at) "
        "VALUES (?, 'g', 'RUNNING', '{}', '2026-10-01T09:00:00Z')",
        (run_id,),
    )


def cmd_open(path: str, go: str) -> None:
    """Open (create and migrate) the file at the go signal."""
    wait_for(go)
    with open_store(path) as store:
        (version,) = store.db().execute("SELECT MAX(version) FROM schema_migrations").fetchone()
        say("version", version)


def cmd_append(path: str, go: str, name: str, runs: str, events: str) -> None:
    """Append ``events`` events to each of ``runs`` runs, one transaction each."""
    with open_store(path) as store:
        wait_for(go)
        for r in range(int(runs)):
            run_id = f"{name}-r{r}"
            with store.tx() as tx:
                insert_run(tx, run_id)
            for e in range(int(events)):
                with store.tx() as tx:
                    tx.append(run_id, "", T0 + timedelta(seconds=e), "step.started",
                              {"worker": name, "run": run_id, "n": e})
                # A loop does some work between its writes; without a pause the
                # lock holder re-takes the lock while the others back off.
                time.sleep(0.001)
        say("done")


def cmd_writer(path: str) -> None:
    """A live writer: commits, reports, then keeps committing while stdin is open."""
    with open_store(path) as store:
        n = 0

        def write() -> None:
            nonlocal n
            with store.tx() as tx:
                insert_run(tx, f"w{n}")
                tx.append(f"w{n}", "", T0, "run.created", {"n": n})
            n += 1

        for _ in range(5):
            write()
        say("ready", n)
        for line in sys.stdin:
            if line.strip() == "more":
                for _ in range(5):
                    write()
                say("wrote", n)
        say("bye")


def cmd_hold(path: str, seconds: str) -> None:
    """Hold the write lock inside a transaction that inserts run 'held'."""
    with open_store(path) as store:
        with store.tx() as tx:
            insert_run(tx, "held")
            say("locked", time.monotonic())
            time.sleep(float(seconds))
            say("committing", time.monotonic())
        say("committed")


def _drop_file_capabilities() -> None:
    """As root, give up the capabilities that bypass file permissions.

    Root reads and writes any directory whatever its mode; without
    CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER it is held to the
    mode bits like any user, which is what the test needs.
    """
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    keep = ~((1 << 1) | (1 << 2) | (1 << 3)) & 0xFFFFFFFF
    data[0].effective &= keep
    data[0].permitted &= keep
    data[0].inheritable &= keep
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def cmd_read_unwritable(path: str) -> None:
    """Read the database read-only after proving its directory cannot be written."""
    _drop_file_capabilities()
    probe = Path(path).parent / "probe"
    try:
        probe.write_text("x")
    except PermissionError:
        say("directory unwritable")
    else:
        probe.unlink()
        say("directory WRITABLE")
        return
    with open_existing(path) as store:
        say("runs", json.dumps(sorted(r.id for r in store.list_runs())))
    say("files", json.dumps(sorted(os.listdir(Path(path).parent))))


COMMANDS = {
    "open": cmd_open,
    "append": cmd_append,
    "writer": cmd_writer,
    "hold": cmd_hold,
    "read-unwritable": cmd_read_unwritable,
}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])

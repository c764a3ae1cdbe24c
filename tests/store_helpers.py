"""Rows written by hand for the store tests, and the way tests start other processes.

The store tests write rows with plain SQL inside ``Store.tx`` (the driver's
writes live elsewhere), so each test states exactly what the table holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import apsw

from agentrt.store import Store, Tx
from agentrt.store.migrations import MIGRATIONS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKER = HERE / "store_worker.py"
T0 = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)


def child_env() -> dict[str, str]:
    """The environment for a child process: this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def worker(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    """Start ``tests/store_worker.py`` with these arguments, text pipes."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def insert_run(tx: Tx, run_id: str, *, status: str = "RUNNING", goal: str = "a goal",
               created: datetime = T0, limits: str = '{"max_steps":50}') -> None:
    tx.execute(
        "INSERT INTO runs (id, goal, status, limits_json, created_at, started_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (run_id, goal, status, limits, _fmt(created), _fmt(created)),
    )


def insert_step(tx: Tx, step_id: str, run_id: str, idx: int, *, status: str = "done",
                decision: str = '{"kind":"tool_call","tool":"echo","args":{"n":1}}',
                policy: str = '{"outcome":"allow"}',
                observation: str = '{"kind":"tool_result","content":{"ok":"yes"}}',
                started: datetime = T0) -> None:
    tx.execute(
        "INSERT INTO steps (id, run_id, idx, status, decision_json, policy_json, "
        "observation_json, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (step_id, run_id, idx, status, decision, policy, observation, _fmt(started)),
    )


REQUEST = (
    '{"run_id":"%s","step_id":"%s","spec":{"name":"push","description":"push it",'
    '"input_schema":{"type":"object"},"side_effect":"remote_mutation","timeout":30000000000},'
    '"args":{"n":7}}'
)


def insert_approval(tx: Tx, approval_id: str, run_id: str, step_id: str, *,
                    status: str = "pending", request: str | None = None,
                    created: datetime = T0) -> None:
    tx.execute(
        "INSERT INTO approvals (id, run_id, step_id, kind, capability_json, "
        "presentation_json, request_json, hash, status, created_at) "
        "VALUES (?, ?, ?, 'remote_mutation', '{}', '{}', ?, 'h', ?, ?)",
        (approval_id, run_id, step_id, request or REQUEST % (run_id, step_id), status,
         _fmt(created)),
    )


def _fmt(t: datetime) -> str:
    from agentrt.timefmt import format_time

    return format_time(t)


def fill(store: Store, runs: int = 2, events: int = 3) -> None:
    """``runs`` runs r0.. each with ``events`` events, appended run by run."""
    for r in range(runs):
        with store.tx() as tx:
            insert_run(tx, f"r{r}")
            for e in range(events):
                tx.append(f"r{r}", "", T0 + timedelta(seconds=e), "run.started",
                          {"n": e, "run": f"r{r}"})


def file_state(path: str | Path) -> tuple[str, int, int]:
    """(sha256, mtime_ns, mode) of a file: what a read-only open must not change."""
    data = Path(path).read_bytes()
    st = os.stat(path)
    return hashlib.sha256(data).hexdigest(), st.st_mtime_ns, stat.S_IMODE(st.st_mode)


def mode_of(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def raw(path: str | Path) -> apsw.Connection:
    """A plain read-write connection, for editing a file behind the store's back."""
    return apsw.Connection(str(path))


def build_old_database(path: str | Path, version: int) -> apsw.Connection:
    """A file shaped as an older release left it: migrations 1..version applied."""
    conn = raw(path)
    conn.execute(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    for number in range(1, version + 1):
        conn.execute(MIGRATIONS[number - 1])
        conn.execute("INSERT INTO schema_migrations VALUES (?, '2026-01-01T00:00:00Z')",
                     (number,))
    return conn


#: What root's file access rests on; without them root meets file modes as any user.
DROP_FILE_CAPS = ["--inh-caps=-all", "--bounding-set", "-dac_override,-dac_read_search,-fowner"]


def without_file_privileges() -> list[str]:
    """The command prefix that runs a child bound by file modes: none for a user;
    for root, setpriv dropping the capabilities that bypass them. Skips the test
    when root cannot drop them here."""
    import shutil

    import pytest

    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None or subprocess.run([setpriv, *DROP_FILE_CAPS, "true"],
                                         capture_output=True).returncode != 0:
        pytest.skip("root bypasses file modes and setpriv cannot drop that here")
    return [setpriv, *DROP_FILE_CAPS]


@contextlib.contextmanager
def tmpfs_mount(directory: str, size: str = "8m") -> Iterator[Callable[[], None]]:
    """A small tmpfs at ``directory``, and the call that remounts it read-only.

    Mounting needs root and a kernel that lets this process mount: the test is
    skipped where either is missing (an environment guard; CI runs as root)."""
    import pytest

    os.makedirs(directory, exist_ok=True)
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                              directory], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")

    def remount_read_only() -> None:
        subprocess.run(["mount", "-o", "remount,ro", directory], check=True)

    try:
        yield remount_read_only
    finally:
        subprocess.run(["umount", "-l", directory], check=False)


def fill_up(directory: str) -> None:
    """Fill the file system holding ``directory`` to the last byte."""
    with open(os.path.join(directory, "filler"), "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0")

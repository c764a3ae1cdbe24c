"""`python -m agentrt.demo demo.db` records a real scenario and prints it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from store_helpers import tmpfs_mount

from agentrt.store import open_existing

ROOT = Path(__file__).resolve().parent.parent


def run_demo(path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "agentrt.demo", str(path)], env=env,
                          cwd=str(ROOT), capture_output=True, text=True, timeout=60)


def test_the_demo_records_the_whole_scenario_and_prints_it(tmp_path):
    db = tmp_path / "demo.db"
    for _ in range(2):  # an old demo.db is replaced, not appended to
        done = run_demo(db)
        assert done.returncode == 0, done.stderr
    out = done.stdout
    # What the operator command and the JSON Lines exporter show, as typed.
    assert "$ agentrt --db" in out and "$ agentrt-export jsonl --db" in out
    assert "status  COMPLETED (goal_completed)" in out
    assert "invalid decision: arguments do not match schema" in out
    assert "denied: side effect destructive is deny by policy" in out
    assert "approval.decided" in out
    assert "intact: 31 event(s), seq 1 to 31" in out
    assert '{"seq":1,"run_id":' in out and "... 27 more record(s)" in out
    store = open_existing(str(db), read_only=True)
    (run,) = store.list_runs()
    types = [e.type for e in store.list_events(run.id)]
    for t in ("approval.requested", "approval.decided", "run.resumed", "step.failed"):
        assert t in types
    assert store.list_approvals(run.id)[0].decided_by == "demo-operator"


def test_the_demo_says_what_went_wrong_in_one_line(tmp_path):
    done = run_demo(tmp_path / "missing-dir" / "demo.db")
    assert done.returncode == 1
    assert done.stderr.startswith("demo: cannot record into ")
    assert "Traceback" not in done.stderr


def test_the_demo_on_a_full_disk_says_so_in_one_line(tmp_path):
    mount = str(tmp_path / "mnt")
    with tmpfs_mount(mount, size="140k"):  # room for the schema, not for the scenario
        done = run_demo(Path(mount) / "demo.db")
    assert done.returncode == 1
    assert done.stderr == (
        f"demo: {mount}/demo.db: the file system holding it is full, so the transaction was "
        "rolled back (the database is as it was before it); free space there and try again\n")

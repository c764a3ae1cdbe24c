"""A cursor file remembers the scope it was saved under (every run, or one run).

Its seq means "every event up to here that this export delivered": after an
export of one run, the other runs' events below it were never delivered, so
a wider export on the same file (every run, another run) is refused before it
delivers anything, instead of skipping them for good. The scope is kept as the
binding is, in an extended attribute, so the file's content stays ``42\\n``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from eventdb import BASE_TIME, REPO_ROOT, add_run, child_env, make_db

from agentrt.store import open_existing, open_store
from agentrt_export import CursorError, FileCursor, Follower, FollowError
from agentrt_export.cursor import BINDING_ATTRIBUTE, SCOPE_ATTRIBUTE


def export(db: str, cursor: Path | None, *args: str, command: str = "jsonl",
           ) -> subprocess.CompletedProcess[bytes]:
    """One ``agentrt-export`` process on ``cursor`` (None: none; otel: spans go nowhere)."""
    env = child_env()
    env.pop("AGENTRT_DB", None)
    if command == "otel":
        env["OTEL_TRACES_EXPORTER"] = "none"
    if cursor is not None:
        args = ("--cursor-file", str(cursor), *args)
    return subprocess.run([sys.executable, "-m", "agentrt_export.cli", command, "--db", db,
                           *args],
                          capture_output=True, env=env, cwd=REPO_ROOT, timeout=60)


def seqs(done: subprocess.CompletedProcess[bytes]) -> list[int]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["seq"] for line in done.stdout.splitlines()]


def state(cursor: Path) -> tuple[bytes, dict[str, bytes], int]:
    """The cursor file's content, extended attributes and inode: what a refusal keeps."""
    attributes = {name: os.getxattr(cursor, name) for name in os.listxattr(cursor)}
    return cursor.read_bytes(), attributes, cursor.stat().st_ino


def append(db: str, run_id: str, events: int) -> None:
    """More events of a run that exists already."""
    store = open_store(db)
    with store.tx() as tx:
        for i in range(events):
            tx.append(run_id, "", BASE_TIME + timedelta(seconds=1, milliseconds=i),
                      "step.decided", b'{"more":%d}' % i)
    store.close()


@pytest.fixture
def db(tmp_path) -> str:
    """run-0 holds seqs 1-3, run-1 seqs 4-6."""
    path = str(tmp_path / "runs.db")
    make_db(path, runs=2, events_per_run=3).close()
    return path


def refusal(done: subprocess.CompletedProcess[bytes]) -> str:
    """The one sentence of a refused export, checked to be just that."""
    assert done.returncode == 1, done.stderr
    assert done.stdout == b""
    assert b"Traceback" not in done.stderr
    assert done.stderr.startswith(b"error: ") and done.stderr.count(b"\n") == 1, done.stderr
    return done.stderr.decode()[len("error: "):-1]


@pytest.mark.parametrize("command", ["jsonl", "otel"])
def test_an_export_of_every_run_on_a_cursor_of_one_run_is_refused_in_one_sentence(
        db, tmp_path, command):
    cursor = tmp_path / "export.cursor"
    assert export(db, cursor, "--run", "run-1", command=command).returncode == 0
    before = state(cursor)
    assert before[0] == b"6\n"  # the reference's format, unchanged
    sentence = refusal(export(db, cursor, command=command))
    assert sentence == (
        f"export: cursor file {cursor} was saved by an export of run run-1 alone, so the "
        "events of other runs up to its seq 6 were not delivered through it and this export "
        "of every run would skip them for good: go on with --run run-1 and this cursor file, "
        "or give the export of every run a cursor file of its own (or --after-seq instead of "
        "one)")
    assert state(cursor) == before
    assert sorted(os.listdir(tmp_path)) == ["export.cursor", "runs.db", "runs.db-shm",
                                            "runs.db-wal"]  # no lock file left either


def test_an_export_of_another_run_on_a_cursor_of_one_run_is_refused(db, tmp_path):
    cursor = tmp_path / "export.cursor"
    assert seqs(export(db, cursor, "--run", "run-1")) == [4, 5, 6]
    before = state(cursor)
    sentence = refusal(export(db, cursor, "--run", "run-0"))
    assert sentence.startswith(f"export: cursor file {cursor} was saved by an export of run "
                               "run-1 alone, so the events of other runs up to its seq 6 "
                               "were not delivered through it and this export of run run-0 "
                               "would skip them for good: go on with --run run-1 and this "
                               "cursor file, or give the export of run run-0 a cursor file of "
                               "its own")
    assert state(cursor) == before


def test_an_export_of_one_run_continues_exactly_once_on_its_own_cursor(db, tmp_path):
    cursor = tmp_path / "export.cursor"
    assert seqs(export(db, cursor, "--run", "run-0")) == [1, 2, 3]
    append(db, "run-1", 2)  # 7, 8: another run's, not this export's
    append(db, "run-0", 3)  # 9, 10, 11
    assert seqs(export(db, cursor, "--run", "run-0")) == [9, 10, 11]
    assert seqs(export(db, cursor, "--run", "run-0")) == []
    assert cursor.read_bytes() == b"11\n"
    assert FileCursor(cursor).scope(11) == "run:run-0"


def test_an_export_of_one_run_on_a_cursor_of_every_run_goes_on_and_then_keeps_its_scope(
        db, tmp_path):
    # After it, events of other runs below the seq were not delivered (7, 8):
    # the save records run-0's scope, so an export of every run is refused
    # rather than skip them.
    cursor = tmp_path / "export.cursor"
    assert seqs(export(db, cursor)) == [1, 2, 3, 4, 5, 6]
    assert FileCursor(cursor).scope(6) == "all"
    append(db, "run-1", 2)
    append(db, "run-0", 1)
    assert seqs(export(db, cursor, "--run", "run-0")) == [9]
    assert FileCursor(cursor).scope(9) == "run:run-0"
    refusal(export(db, cursor))
    assert seqs(export(db, None, "--after-seq", "6")) == [7, 8, 9]


def test_an_export_of_one_run_that_delivers_nothing_leaves_a_cursor_of_every_run_as_it_is(
        db, tmp_path):
    cursor = tmp_path / "export.cursor"
    assert seqs(export(db, cursor)) == [1, 2, 3, 4, 5, 6]
    assert seqs(export(db, cursor, "--run", "run-0")) == []
    assert cursor.read_bytes() == b"6\n" and FileCursor(cursor).scope(6) == "all"
    append(db, "run-1", 1)
    assert seqs(export(db, cursor)) == [7]


def test_a_library_follower_is_refused_a_wider_scope_before_anything_is_delivered(
        db, tmp_path):
    cursor = FileCursor(tmp_path / "export.cursor")
    Follower(open_existing(db), run_id="run-0", cursor=cursor, once=True).follow(
        lambda event: None)
    got: list = []
    with pytest.raises(FollowError, match=re.escape(
            f"cursor file {cursor.path} was saved by an export of run run-0 alone")):
        Follower(open_existing(db), cursor=cursor, once=True).follow(got.append)
    assert got == [] and not cursor.held
    same = Follower(open_existing(db), run_id="run-0", cursor=cursor, once=True)
    same.follow(got.append)
    assert got == []  # caught up: nothing twice


def test_a_cursor_without_a_scope_is_taken_as_before_and_its_next_save_records_one(
        db, tmp_path):
    # Written by the reference (or by hand): no extended attributes at all.
    cursor = tmp_path / "export.cursor"
    cursor.write_bytes(b"3\n")
    assert seqs(export(db, cursor)) == [4, 5, 6]
    assert FileCursor(cursor).scope(6) == "all"
    # Saved by an older agentrt_export after `--run run-0`: bound, no scope.
    with open_existing(db) as store:
        FileCursor(cursor).save(3, store.event_hash(3))
    assert seqs(export(db, cursor)) == [4, 5, 6]  # as today: nothing tells it


def test_a_scope_is_kept_beside_the_binding_which_older_readers_read_as_before(db, tmp_path):
    cursor = tmp_path / "export.cursor"
    assert export(db, cursor, "--run", "run-0").returncode == 0
    with open_existing(db) as store:
        assert os.getxattr(cursor, BINDING_ATTRIBUTE) == b"3:" + store.event_hash(3).encode()
    assert os.getxattr(cursor, SCOPE_ATTRIBUTE) == b"3:run:run-0"
    with open(cursor, "r+") as f:
        f.write("2\n")  # a seq written by hand: its scope is no longer known
    assert FileCursor(cursor).scope(2) is None
    assert seqs(export(db, cursor)) == [3, 4, 5, 6]


def test_a_run_id_too_long_to_keep_is_kept_as_its_hash_and_still_refuses(tmp_path):
    db = str(tmp_path / "runs.db")
    long_id = "r" * 5000  # more than an ext4 attribute value holds
    store = open_store(db)
    add_run(store, long_id, 2)
    add_run(store, "other", 2)
    store.close()
    cursor = FileCursor(tmp_path / "export.cursor")
    got: list = []
    Follower(open_existing(db), run_id=long_id, cursor=cursor, once=True).follow(got.append)
    assert [e.seq for e in got] == [1, 2]
    assert cursor.scope(2) == "run-sha256:" + hashlib.sha256(long_id.encode()).hexdigest()
    with pytest.raises(FollowError, match="was saved by an export of the run whose id has the "
                                          "SHA-256 [0-9a-f]{64} .too long to keep. alone"):
        Follower(open_existing(db), cursor=cursor, once=True).follow(got.append)
    Follower(open_existing(db), run_id=long_id, cursor=cursor, once=True).follow(got.append)
    assert [e.seq for e in got] == [1, 2]


def test_a_save_with_a_scope_no_export_makes_is_refused_before_the_file_is_touched(tmp_path):
    cursor = FileCursor(tmp_path / "export.cursor")
    with pytest.raises(CursorError) as caught:
        cursor.save(3, scope="run-0")
    assert str(caught.value) == (f"export: cursor file {cursor.path}: scope 'run-0' is not an "
                                 "export's: pass scope_of(run_id), 'all' for every run or "
                                 "'run:ID' for one")
    assert not Path(cursor.path).exists()

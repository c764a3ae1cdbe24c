"""`agentrt-export jsonl` where it meets its environment, as an operator runs it.

A cursor file that is a symbolic link, a terminal for the progress line, a
pipe whose reader leaves while the follower waits, a terminal that hangs up,
and a database restored or copied over in place while it is followed: each
with real processes and real files.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import time

import apsw
import pytest
from eventdb import REPO_ROOT, add_run, child_env, child_process, make_db, read_terminal
from test_export_processes import one_error_line, wait_for_cursor

from agentrt.store import open_store

COMMAND = [sys.executable, "-m", "agentrt_export.cli", "jsonl"]


def run_cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    env = child_env()
    env.pop("AGENTRT_DB", None)
    return subprocess.run([*COMMAND, *args], capture_output=True, env=env, cwd=REPO_ROOT,
                          timeout=60)


def at_a_terminal(*args: str, stdout: object = subprocess.DEVNULL,
                  preexec_fn: object = None) -> tuple[int, bytes]:
    """Run the command with stderr on a pseudo-terminal: (exit code, what it showed)."""
    leader, follower_tty = pty.openpty()
    proc = subprocess.Popen([*COMMAND, *args], stdout=stdout, stderr=follower_tty,
                            env=child_env(), cwd=REPO_ROOT, preexec_fn=preexec_fn)
    os.close(follower_tty)
    try:
        seen = read_terminal(leader)
        return proc.wait(timeout=60), seen
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- the cursor file ----------------------------------------------------------


@pytest.mark.parametrize("target", ["a cursor file", "nothing"])
def test_a_cursor_file_that_is_a_symlink_is_refused_in_one_sentence(tmp_path, target):
    """A save renames a new file over the path: the link became a file of its
    own and the file it named kept the old seq, so an operator who linked the
    cursor onto a kept volume restarted from there every time."""
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    real = tmp_path / "kept" / "export.cursor"
    real.parent.mkdir()
    if target == "a cursor file":
        real.write_text("1\n")
    link = tmp_path / "export.cursor"
    link.symlink_to(real)
    sentence = one_error_line(run_cli("--db", db, "--cursor-file", str(link)))
    assert sentence == (f"export: cursor file {link} is a symbolic link (to {real}), which a "
                        "save would replace with a file of its own instead of writing where "
                        f"it points: name the file itself, {real}")
    assert link.is_symlink()
    assert (real.read_text() if real.exists() else None) == (
        "1\n" if target == "a cursor file" else None)


# -- the progress line at a terminal ------------------------------------------


def test_the_progress_line_ends_before_the_sentence_of_a_failure(tmp_path):
    """Output that fails while the backlog drains (here a file size limit):
    the error sentence starts a line of its own, not the end of the progress line."""
    import resource

    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=12_000).close()

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (400_000, 400_000))

    with open(tmp_path / "out.jsonl", "wb") as out:
        code, seen = at_a_terminal("--db", db, stdout=out, preexec_fn=limited)
    assert code == 1
    assert b"\rexported through seq 500 of 12000" in seen
    lines = seen.split(b"\r\n")
    error = [line for line in lines if b"error:" in line]
    assert len(error) == 1, seen
    assert error[0].startswith(b"error: writing events to standard output"), seen


def test_the_progress_line_of_a_run_that_ends_below_the_head_ends_its_line(tmp_path):
    """With ``--run``, the last page is short below the database's head; the
    line was left open and the shell's prompt was written after it."""
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=6_000).close()
    code, seen = at_a_terminal("--db", db, "--run", "run-0")
    assert code == 0
    assert seen.endswith(b"\rexported through seq 6000 of 12000\r\n"), seen[-200:]


def test_a_live_follow_draws_no_progress_past_the_backlog(tmp_path):
    """Once caught up, the line said each later page as ``seq 12001 of 12000``."""
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=12_000).close()
    cursor = tmp_path / "export.cursor"
    leader, follower_tty = pty.openpty()
    proc = subprocess.Popen([*COMMAND, "--db", db, "--cursor-file", str(cursor), "--follow"],
                            stdout=subprocess.DEVNULL, stderr=follower_tty, env=child_env(),
                            cwd=REPO_ROOT)
    os.close(follower_tty)
    try:
        wait_for_cursor(cursor, 12_000)
        with open_store(db) as writer:
            for i in range(3):
                add_run(writer, f"later-{i}", 1)
                wait_for_cursor(cursor, 12_001 + i)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        seen = read_terminal(leader, quiet_for=0.2)
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert seen.endswith(b"\rexported through seq 12000 of 12000\r\n"), seen[-200:]


# -- standard output ------------------------------------------------------------


@pytest.mark.parametrize("command", [COMMAND, [*COMMAND[:-1], "otel"]],
                         ids=["jsonl", "otel console"])
def test_a_follow_into_a_pipe_whose_reader_left_ends_quietly_while_nothing_is_committed(
        tmp_path, command):
    """``agentrt-export jsonl -f | head -n 1`` on an idle database: nothing is
    written, so no write fails, and the pipeline waited for the next commit.
    The same with ``otel`` printing spans (``OTEL_TRACES_EXPORTER=console``)."""
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=3).close()
    cursor = tmp_path / "export.cursor"
    read, write = os.pipe()
    env = {**child_env(), "OTEL_TRACES_EXPORTER": "console"}
    proc = subprocess.Popen([*command, "--db", db, "--cursor-file", str(cursor), "--follow"],
                            stdout=write, stderr=subprocess.PIPE, env=env, cwd=REPO_ROOT)
    os.close(write)
    try:
        deadline = time.monotonic() + 30
        while not (cursor.exists() and cursor.read_text() == "6\n"):  # caught up, idle
            assert time.monotonic() < deadline and proc.poll() is None, "never caught up"
            time.sleep(0.02)
        os.close(read)  # the reader goes away
        read = -1
        _, err = proc.communicate(timeout=10)
    finally:
        if read != -1:
            os.close(read)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, err) == (0, b"")
    assert cursor.read_text() == "6\n"


# -- signals ------------------------------------------------------------------


def test_a_hangup_stops_a_follower_cleanly_with_the_cursor_saved(tmp_path):
    """The terminal of an ssh session closed: SIGHUP ended the process where it
    stood (exit -1), a page perhaps written and not saved."""
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=3).close()
    cursor = tmp_path / "export.cursor"
    proc = subprocess.Popen([*COMMAND, "--db", db, "--cursor-file", str(cursor), "--follow"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(),
                            cwd=REPO_ROOT,  # as a terminal starts it, whatever started the suite
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        wait_for_cursor(cursor, 6)
        proc.send_signal(signal.SIGHUP)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, err) == (0, b"")
    assert [json.loads(line)["seq"] for line in out.splitlines()] == list(range(1, 7))


def test_a_hangup_ignored_on_the_way_in_stays_ignored(tmp_path):
    """``nohup agentrt-export ...``: the follower goes on through a hangup."""
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=3).close()
    cursor = tmp_path / "export.cursor"
    proc = subprocess.Popen([*COMMAND, "--db", db, "--cursor-file", str(cursor), "--follow"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env(),
                            cwd=REPO_ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        wait_for_cursor(cursor, 6)
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- the database changed in place while followed -----------------------------


def _restore_with_sqlite(backup: str, db: str) -> None:
    """What ``sqlite3 runs.db ".restore backup.db"`` does: the backup API writes
    the backup's pages into the live file, which keeps its inode."""
    dest, source = apsw.Connection(db), apsw.Connection(backup)
    try:
        with dest.backup("main", source, "main") as copy:
            copy.step(-1)
    finally:
        source.close()
        dest.close()


@pytest.mark.parametrize("how", ["sqlite3 .restore", "cp"])
def test_a_database_restored_in_place_while_followed_stops_before_any_of_its_events(
        tmp_path, how):
    """The file keeps its inode, so its identity does not tell. The restored
    history was shorter: its next commits took seqs already delivered, which
    the follower skipped silently, then went on with the ones past its cursor."""
    db, backup = str(tmp_path / "runs.db"), str(tmp_path / "backup.db")
    make_db(backup, runs=1, events_per_run=3).close()
    make_db(db, runs=3, events_per_run=5).close()
    cursor = tmp_path / "export.cursor"
    with child_process([*COMMAND, "--db", db, "--cursor-file", str(cursor), "--follow"]) as proc:
        wait_for_cursor(cursor, 15)
        inode = os.stat(db).st_ino
        if how == "cp":
            shutil.copyfile(backup, db)
        else:
            _restore_with_sqlite(backup, db)
        assert os.stat(db).st_ino == inode
        with open_store(db) as writer:
            for i in range(6):
                add_run(writer, f"after-the-restore-{i}", 3)
        out, err = proc.communicate(timeout=30)
    seqs = [json.loads(line)["seq"] for line in out.splitlines()]
    assert (seqs, proc.returncode) == (list(range(1, 16)), 1)
    assert cursor.read_text() == "15\n"
    cut = (f"error: export: {db} was cut back to before seq 15, the last event delivered, "
           "while it was followed: restored from a backup or copied over in place; nothing of "
           "the new history was delivered: start again to follow it, with a cursor that "
           "belongs to it\n")
    if how == "cp":
        # Bytes copied under a live reader, beside the old -wal: what it reads
        # first may be the old log over the new pages, or a malformed file.
        said = err.decode()
        assert said == cut or said.startswith((f"error: export: {db} was rewritten up to seq 15",
                                               f"error: reading {db}: ")), said
        assert said.count("\n") == 1
    else:
        assert err.decode() == cut


def test_a_database_rewritten_in_place_up_to_the_cursor_is_refused_while_followed(tmp_path):
    """A restore of another database as long as the one followed: the event at
    the cursor is there, with another chain hash."""
    db, other = str(tmp_path / "runs.db"), str(tmp_path / "other.db")
    make_db(db, runs=3, events_per_run=5).close()
    with open_store(other) as store:
        for r in range(4):
            add_run(store, f"other-{r}", 5)
    with child_process([*COMMAND, "--db", db, "--follow"]) as proc:
        assert proc.stdout is not None
        seqs = [json.loads(proc.stdout.readline())["seq"] for _ in range(15)]
        _restore_with_sqlite(other, db)
        out, err = proc.communicate(timeout=30)
    assert (seqs, out, proc.returncode) == (list(range(1, 16)), b"", 1)
    assert err.decode().startswith(
        f"error: export: {db} was rewritten up to seq 15, the last event delivered (its chain "
        "hash there changed), while it was followed")


def test_checkpoints_and_vacuum_while_followed_deliver_every_event_once(tmp_path):
    """What changes the file in place but not its history raises no alarm."""
    db = str(tmp_path / "runs.db")
    make_db(db, runs=2, events_per_run=5).close()
    cursor = tmp_path / "export.cursor"
    with child_process([*COMMAND, "--db", db, "--cursor-file", str(cursor), "--follow"]) as proc:
        wait_for_cursor(cursor, 10)
        with open_store(db) as writer:
            for i, change in enumerate(["PRAGMA wal_checkpoint(TRUNCATE)",
                                        "PRAGMA wal_checkpoint(RESTART)", "VACUUM"]):
                add_run(writer, f"later-{i}", 3)
                conn = apsw.Connection(db)
                try:
                    conn.execute(change).fetchall()
                finally:
                    conn.close()
                wait_for_cursor(cursor, 13 + 3 * i)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert (proc.returncode, err) == (0, b"")
    assert [json.loads(line)["seq"] for line in out.splitlines()] == list(range(1, 20))

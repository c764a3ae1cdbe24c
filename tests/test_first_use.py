"""What a new user meets first: the demo's output piped or failing, the demo
pointed at a file of their own, a trace observer given a stream it cannot write,
and the Makefile on a machine whose Python is too old."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import apsw
import pytest
from eventdb import REPO_ROOT, child_env

from agentrt import trace
from agentrt.events import Event
from agentrt.store import open_store


def _demo(path: str, **kw) -> subprocess.CompletedProcess[str]:
    kw.setdefault("capture_output", True)
    return subprocess.run([sys.executable, "-m", "agentrt.demo", path], env=child_env(),
                          text=True, timeout=120, **kw)


def _refused_and_left_as_it_was(path: str) -> str:
    """Run the demo at ``path``, which holds someone else's file: the demo must
    refuse it and change nothing; its stderr."""
    before = Path(path).read_bytes()
    done = _demo(path)
    assert done.returncode == 1
    assert Path(path).read_bytes() == before
    return done.stderr


def test_the_demo_into_a_pipe_closed_early_ends_without_a_traceback(tmp_path):
    done = subprocess.run(f"{sys.executable} -m agentrt.demo {tmp_path}/demo.db | head -n 3",
                          shell=True, env=child_env(), cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.count("\n") == 3
    assert done.stderr == ""


def test_the_demo_onto_a_full_stdout_says_so_in_one_sentence(tmp_path):
    with open("/dev/full", "w") as full:
        done = _demo(str(tmp_path / "demo.db"), stdout=full, stderr=subprocess.PIPE,
                     capture_output=False)
    assert done.returncode == 1
    assert done.stderr.startswith("demo: recorded in ") and done.stderr.count("\n") == 1
    assert "No space left on device" in done.stderr


def test_the_demo_does_not_delete_a_file_it_did_not_make(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert "is not an earlier demo's database" in _refused_and_left_as_it_was(str(notes))


def test_the_demo_does_not_delete_a_database_with_runs_of_its_own(tmp_path):
    db = str(tmp_path / "runs.db")
    program = (
        "from agentrt import Decision, Limits, open_store\n"
        "from agentrt.driver import DefaultPolicy, Driver\n"
        "from agentrt.testing import ScriptedAgent\n"
        f"s = open_store({db!r})\n"
        "Driver(s, ScriptedAgent([Decision.complete('{}')]), DefaultPolicy()).start("
        "'mine', Limits(max_steps=3, max_consecutive_tool_failures=3, loop_threshold=3))\n"
        "s.close()\n")
    subprocess.run([sys.executable, "-c", program], env=child_env(), check=True, timeout=60)
    _refused_and_left_as_it_was(db)


def test_the_demo_replaces_its_own_earlier_database(tmp_path):
    db = str(tmp_path / "demo.db")
    assert _demo(db).returncode == 0
    assert _demo(db).returncode == 0


@pytest.mark.parametrize("mode", ["r", "rb"])
def test_a_trace_observer_refuses_a_stream_opened_for_reading(tmp_path, mode):
    path = tmp_path / "trace.jsonl"
    path.write_bytes(b"")
    with open(path, mode) as stream, pytest.raises(ValueError, match="opened for reading only"):
        trace.jsonl(stream)


def test_make_refuses_a_python_older_than_3_11_in_one_sentence_and_makes_no_venv(tmp_path):
    """A .venv made by an old Python would be reused by every later make, even
    once python3.11 is installed."""
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\n"
                   'case "$1" in -V) echo "Python 3.10.13";; *) exit 1;; esac\n')
    old.chmod(0o755)
    work = tmp_path / "checkout"
    work.mkdir()
    (work / "agentrt").mkdir()
    # The install's prerequisites, as the Makefile names them: its C modules too.
    c_sources = [f"agentrt/{name}" for name in os.listdir(os.path.join(REPO_ROOT, "agentrt"))
                 if name.endswith(".c")]
    for name in ("Makefile", "pyproject.toml", "constraints.txt", "setup.py", *c_sources):
        shutil.copy(os.path.join(REPO_ROOT, name), work / name)
    done = subprocess.run(["make", "-s", "install", f"PYTHON={old}"], cwd=work,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert done.stderr.splitlines()[0] == (
        "make: agentrt needs Python 3.11 or newer; found: Python 3.10.13. Install python3.11, "
        "or pass PYTHON=/path/to/python3.11")
    assert not (work / ".venv").exists()


def test_the_demo_does_not_delete_a_database_with_tables_of_its_own_and_no_run(tmp_path):
    path = str(tmp_path / "app.db")
    with open_store(path) as store, store.db() as conn:
        conn.execute("CREATE TABLE invoices(id INTEGER PRIMARY KEY, amount INTEGER)")
    _refused_and_left_as_it_was(path)


def test_the_demo_replaces_its_own_database_an_older_agentrt_made(tmp_path):
    path = str(tmp_path / "demo.db")
    assert _demo(path).returncode == 0
    conn = apsw.Connection(path)  # as an agentrt one migration older left it
    conn.execute("DELETE FROM schema_migrations WHERE version = "
                 "(SELECT MAX(version) FROM schema_migrations)")
    conn.close()
    done = _demo(path)
    assert done.returncode == 0, done.stderr


class _ToLogging(io.TextIOBase):
    """The usual stream-to-logging adapter: write() only, writable() inherited (False)."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)


def test_a_trace_observer_takes_a_write_only_stream_class() -> None:
    sink = _ToLogging()
    trace.writer(sink)(Event(7, "r", "", "2026-09-25T14:03:04Z", "step.decided", b"{}"))
    assert "step.decided" in sink.text


def test_a_trace_observer_refuses_a_gzip_file_opened_for_reading(tmp_path):
    path = tmp_path / "trace.jsonl.gz"
    with gzip.open(path, "wb"):
        pass
    with gzip.open(path, "rb") as stream, pytest.raises(ValueError, match="for reading only"):
        trace.jsonl(stream)


@pytest.mark.parametrize("tool", ["ship", "deploy", None])
def test_the_demo_does_not_delete_a_database_whose_run_has_its_goal_but_tools_of_its_own(
        tmp_path, tool):
    """The docs use the demo's goal in their examples: a goal is no proof, nor is a
    tool named as one of the demo's (its spec is another), nor a run with no tool."""
    from datetime import timedelta

    from agentrt import Decision, Limits
    from agentrt.driver import DefaultPolicy, Driver, FuncTool, ToolResult
    from agentrt.testing import ScriptedAgent

    path = str(tmp_path / "runs.db")
    tools = [] if tool is None else [
        FuncTool(tool, lambda call: ToolResult(b"{}", "shipped"), side_effect="read_only",
                 timeout=timedelta(seconds=5), input_schema='{"type":"object"}')]
    with open_store(path) as store:
        calls = [Decision.tool_call(tool, "{}")] if tool else []
        agent = ScriptedAgent([*calls, Decision.complete("{}")])
        Driver(store, agent, DefaultPolicy(), tools).start(
            "deploy the service to staging",
            Limits(max_steps=10, max_consecutive_tool_failures=3, loop_threshold=3))
    assert "is not an earlier demo's database" in _refused_and_left_as_it_was(path)


def test_the_demo_does_not_delete_a_database_created_for_a_program_that_has_no_run_yet(tmp_path):
    path = str(tmp_path / "app.db")
    open_store(path).close()
    assert "is not an earlier demo's database" in _refused_and_left_as_it_was(path)


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_the_demo_prints_its_usage_for_help_and_records_nothing(tmp_path, flag):
    done = subprocess.run([sys.executable, "-m", "agentrt.demo", flag], cwd=tmp_path,
                          env=child_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert done.stdout.startswith("usage: python -m agentrt.demo [PATH]")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["--db"], ["a.db", "b.db"]])
def test_the_demo_refuses_an_option_or_a_second_path_as_usage_and_records_nothing(tmp_path, args):
    done = subprocess.run([sys.executable, "-m", "agentrt.demo", *args], cwd=tmp_path,
                          env=child_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "the demo takes one argument, the database path" in done.stderr
    assert done.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_the_demo_quotes_a_path_with_a_space_in_the_commands_it_shows(tmp_path):
    done = subprocess.run([sys.executable, "-m", "agentrt.demo", "my demo.db"], cwd=tmp_path,
                          env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "$ agentrt --db 'my demo.db' runs" in done.stdout
    assert "--db 'my demo.db' runs  (or: source" in done.stdout.strip().splitlines()[-1]


def _stopped_demo(program: str, stop: str, db: str) -> subprocess.CompletedProcess[str]:
    """Run a demo ``program`` that raises ``stop`` part-way, recording into ``db``."""
    return subprocess.run([sys.executable, "-c", program.replace("{stop}", stop), db],
                          env=child_env(), capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT)


# A demo stopped after its schema and before its run: a full disk at the run's
# insert (which the demo says in one sentence), or Ctrl-C there.
_DEMO_STOPPED_BEFORE_ITS_RUN = r"""
import sys, apsw
import agentrt.driver.driver as driver
def stop(*args, **kwargs):
    raise {stop}
driver.insert_run = stop
from agentrt.demo import main
sys.exit(main([sys.argv[1]]))
"""


@pytest.mark.parametrize("stop", ['apsw.FullError("database or disk is full")',
                                  "KeyboardInterrupt"])
def test_the_demo_replaces_the_database_of_a_demo_stopped_before_its_run(tmp_path, stop):
    db = str(tmp_path / "demo.db")
    first = _stopped_demo(_DEMO_STOPPED_BEFORE_ITS_RUN, stop, db)
    assert first.returncode != 0 and os.path.getsize(db) > 0  # its schema is there
    again = _demo(db)
    assert again.returncode == 0, again.stderr


def test_the_demo_refuses_a_file_of_someone_elses_in_one_plain_sentence(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert _refused_and_left_as_it_was(str(notes)) == (
        f"demo: {notes} exists and is not an earlier demo's database; name a new file "
        "(the demo replaces only its own)\n")


@pytest.mark.parametrize("case", ["missing-parent", "trailing-slash", "empty"])
def test_the_demo_says_a_path_it_cannot_record_into_as_the_store_says_it(tmp_path, case):
    path = {"missing-parent": str(tmp_path / "nodir" / "demo.db"),
            "trailing-slash": str(tmp_path / "newdir") + "/", "empty": ""}[case]
    done = _demo(path, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith(f"demo: cannot record into {path}: agentrt: open store: ")
    assert "[Errno" not in done.stderr and done.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_the_demos_database_is_owner_only_read_write_under_any_umask(tmp_path):
    done = subprocess.run(["sh", "-c", 'umask 0277 && exec "$0" -m agentrt.demo "$1"',
                           sys.executable, str(tmp_path / "demo.db")],
                          env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert os.stat(tmp_path / "demo.db").st_mode & 0o777 == 0o600


def test_the_demo_does_not_delete_a_new_file_another_program_marked_as_its_own(tmp_path):
    """A GeoPackage just created (its application_id and user_version set, no
    table yet) is no demo's, though it has no table."""
    path = tmp_path / "mine.gpkg"
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA application_id = 1196444487")  # 'GPKG'
    conn.execute("PRAGMA user_version = 10300")
    conn.close()
    _refused_and_left_as_it_was(str(path))


def test_the_demo_refuses_a_fifo_or_a_device_at_its_path(tmp_path):
    import stat

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done = _demo(str(fifo))  # a read of the FIFO would wait for a writer forever
    assert done.returncode == 1 and "is not an earlier demo's database" in done.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    if os.geteuid() == 0:  # a copy of /dev/null's node, which reads as an empty database
        node = tmp_path / "null"
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        done = _demo(str(node))
        assert done.returncode == 1 and stat.S_ISCHR(os.lstat(node).st_mode)


_DEMO_STOPPED_BEFORE_ITS_MARK = r"""
import sys, apsw
import agentrt.demo as demo
from agentrt.store import Store
def db(self):  # the schema is committed; the mark is the demo's first use of db()
    raise {stop}
Store.db = db
sys.exit(demo.main([sys.argv[1]]))
"""


@pytest.mark.parametrize("stop", ['apsw.FullError("database or disk is full")',
                                  "KeyboardInterrupt"])
def test_a_demo_stopped_between_its_schema_and_its_mark_leaves_no_file_the_next_refuses(
        tmp_path, stop):
    db = str(tmp_path / "demo.db")
    first = _stopped_demo(_DEMO_STOPPED_BEFORE_ITS_MARK, stop, db)
    assert first.returncode != 0
    assert not os.path.lexists(db)  # it made the file and had put nothing of anyone's in it
    again = _demo(db)
    assert again.returncode == 0, again.stderr


_DEMO_STOPPED_INSIDE_OPEN_STORE = r"""
import sys, apsw
import agentrt.store.opening as opening
real = opening.migrate
def migrate(conn, path):  # the schema is committed; open_store has not returned yet
    real(conn, path)
    raise {stop}
opening.migrate = migrate
import agentrt.demo as demo
sys.exit(demo.main([sys.argv[1]]))
"""


@pytest.mark.parametrize("stop", ['apsw.FullError("database or disk is full")',
                                  "KeyboardInterrupt"])
def test_a_demo_stopped_inside_open_store_leaves_no_file_the_next_refuses(tmp_path, stop):
    db = str(tmp_path / "demo.db")
    first = _stopped_demo(_DEMO_STOPPED_INSIDE_OPEN_STORE, stop, db)
    assert first.returncode != 0 and not os.path.lexists(db)
    again = _demo(db)
    assert again.returncode == 0, again.stderr

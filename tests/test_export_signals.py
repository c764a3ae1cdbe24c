"""SIGTERM ends a caught-up `agentrt-export jsonl --follow` at any moment, with exit 0.

A handler that set the stop event itself could deadlock: Python runs it in the
main thread between two bytecodes, and when those were inside ``stop.wait()``
(the follower's short polls after a change notification) the thread held the
event's lock, which ``set()`` then waited for forever. These tests send real
signals to real processes; the first makes that moment a likely one, the
second sends them at random moments to the unmodified command.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
from eventdb import REPO_ROOT, child_env, make_db
from stress import rounds

#: A deadlock never ends; a clean stop takes well under a second unloaded.
EXIT_WITHIN = 15

#: The exporter with a change waiter that sleeps by polling the stop event
#: back to back (the plain waiter and the short poll after a notification call
#: ``stop.wait`` too, with a timeout): its main thread is then nearly always
#: inside ``stop.wait``, the moment that deadlocked.
POLLING_CHILD = """
import sys
from agentrt_export import cli, follower, wake

class Polling(wake.ChangeWaiter):
    def wait(self, timeout, stop):
        for _ in range(10_000):
            if stop.wait(0):
                break
        return False

follower.open_waiter = lambda path: Polling()
cli.main(sys.argv[1:])
"""


def start(db: str, child: list[str]) -> subprocess.Popen[bytes]:
    if child[0] == "-c" and "cli.main" not in child[1]:  # a program of its own, run beside db
        cursor = os.path.join(os.path.dirname(db), "export.cursor")
        if os.path.exists(cursor):
            os.remove(cursor)  # each round delivers the three events again
        return subprocess.Popen([sys.executable, *child], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=child_env(),
                                cwd=os.path.dirname(db))
    return subprocess.Popen([sys.executable, *child, "jsonl", "--db", db, "--follow"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=child_env(), cwd=REPO_ROOT)


def notify(db: str) -> None:
    """A change notification that changes no data: the follower polls for a while."""
    open(db, "ab").close()  # noqa: SIM115 - closing a file opened for writing is the event


def stop_and_check(proc: subprocess.Popen[bytes], moment: str) -> None:
    """SIGTERM: exit 0 promptly, silently, with nothing more written."""
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=EXIT_WITHIN)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"SIGTERM {moment}: still running after {EXIT_WITHIN}s") from None
    assert (proc.returncode, out, err) == (0, b"", b""), moment


def run_rounds(tmp_path, child: list[str], n: int, moments: list[str]) -> None:
    """``n`` exporters, each caught up and then sent SIGTERM at a random moment."""
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    rng = random.Random(11)
    for i in range(n):
        proc = start(db, child)
        assert proc.stdout is not None
        try:
            first = [proc.stdout.readline() for _ in range(3)]
            assert [json.loads(line)["seq"] for line in first] == [1, 2, 3]
            moment = moments[i % len(moments)]
            if moment == "polling":
                time.sleep(0.1)  # the follower watches the directory by now (unless loaded)
                notify(db)
            delay = rng.uniform(0, 0.25)
            time.sleep(delay)
            stop_and_check(proc, f"round {i}, {moment}, {delay:.3f}s in")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_sigterm_stops_a_follower_whose_main_thread_is_inside_stop_wait(tmp_path):
    # Before the fix about every other round hung here (5 runs of 5 failed, by round 5).
    run_rounds(tmp_path, ["-c", POLLING_CHILD], rounds(10, 100), ["polling (forced)"])


@pytest.mark.slow
def test_sigterm_at_random_moments_stops_a_caught_up_follower_with_exit_0(tmp_path):
    # The command as shipped: asleep in select, or polling after a notification.
    run_rounds(tmp_path, ["-m", "agentrt_export.cli"], rounds(10, 400), ["asleep", "polling"])


def documented_program() -> str:
    """The "From Python" program of docs/exporting.md, as written there."""
    with open(os.path.join(REPO_ROOT, "docs", "exporting.md"), encoding="utf-8") as f:
        text = f.read()
    found = re.search(r"## From Python\n\n```python\n(.*?)```", text, re.S)
    assert found is not None
    return found.group(1)


def test_stop_on_signals_stops_the_documented_program_at_any_moment(tmp_path):
    # The program follows runs.db in its directory, its main thread kept inside
    # stop.wait() by the polling waiter; the documented handler must end it.
    polling = POLLING_CHILD.replace("cli.main(sys.argv[1:])\n", "")
    run_rounds(tmp_path, ["-c", polling + documented_program()], rounds(10, 100),
               ["polling (forced)"])


TWO_CALLS = """
import os, signal, threading
from agentrt_export import stop_on_signals

first, second = threading.Event(), threading.Event()
stop_on_signals(first)
stop_on_signals(second, [signal.SIGUSR1])
os.kill(os.getpid(), signal.SIGTERM)
assert first.wait(10) and not second.is_set()
os.kill(os.getpid(), signal.SIGUSR1)
assert second.wait(10)
readers = [t for t in threading.enumerate() if t.name == "agentrt-export signals"]
print(len(readers))
"""


def test_stop_on_signals_calls_add_up_on_one_reader_thread():
    done = subprocess.run([sys.executable, "-c", TWO_CALLS], capture_output=True,
                          env=child_env(), cwd=REPO_ROOT, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"1\n", b"")


# -- a stop signal while the command is still importing ---------------------------------

def _importing(pid: int) -> None:
    """Until the child has loaded apsw: its imports are under way, main() not yet."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                if "apsw" in maps.read():
                    return
        except OSError:
            pass
        time.sleep(0.001)
    raise AssertionError("the child never loaded apsw")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc/PID/maps (Linux)")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=lambda s: signal.Signals(s).name)
def test_a_stop_signal_while_the_command_imports_is_a_clean_stop(tmp_path, signum):
    """The console script's imports take a fifth of a second: a Ctrl-C there was a
    KeyboardInterrupt traceback, and a SIGTERM or SIGHUP killed the process. The
    command now starts stopped: nothing read, delivered or saved, exit 0."""
    command = os.path.join(os.path.dirname(sys.executable), "agentrt-export")
    assert os.path.exists(command), "the console script is installed with the package"
    db = str(tmp_path / "runs.db")
    make_db(db, runs=1, events_per_run=3).close()
    cursor = tmp_path / "export.cursor"
    proc = subprocess.Popen([command, "jsonl", "--db", db, "--cursor-file", str(cursor),
                             "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=child_env(), cwd=str(tmp_path))
    try:
        _importing(proc.pid)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, out, err) == (0, b"", b"")
    assert not cursor.exists()

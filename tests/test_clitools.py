"""What both commands share (``agentrt.clitools.run_click``), as real processes:
output that cannot be written, and input that is not UTF-8, are one sentence
and an exit code, never a traceback."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys

import pytest
from _cli_kit import Kit, child_env, snapshot

COMMANDS = {"agentrt": "agentrt.cli", "agentrt-export": "agentrt_export.cli"}


@pytest.fixture
def db(tmp_path):
    kit = Kit(str(tmp_path / "ops.db"))
    kit.completed()
    kit.close()
    return kit.path


def run(command: str, *args: str | bytes, stdout=subprocess.PIPE, close_stdout: bool = False,
        env: dict[str, str] | None = None, files: int | None = None) -> tuple[int, bytes]:
    """(exit code, stderr) of ``python -m <command> ARGS``; ``files``: its ulimit -n."""
    def preexec() -> None:
        if close_stdout:
            os.close(1)
        if files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

    done = subprocess.run([sys.executable, "-m", COMMANDS[command], *args], stdout=stdout,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          env=env or child_env(), preexec_fn=preexec, timeout=120)
    return done.returncode, done.stderr


def one_line(stderr: bytes) -> str:
    text = stderr.decode()
    assert "Traceback" not in text, text
    assert text.count("\n") == 1, text
    return text.strip()


@pytest.mark.parametrize("args", [("runs",), ("runs", "--json"), ("--help",)])
def test_agentrt_output_to_a_full_disk_is_one_sentence_and_exit_1(db, args):
    with open("/dev/full", "wb") as full:
        code, err = run("agentrt", "--db", db, *args, stdout=full)
    assert code == 1
    assert one_line(err) == "error: writing output: No space left on device"


@pytest.mark.parametrize(("command", "args", "said"), [
    ("agentrt", ("runs",), "error: writing output: standard output is closed"),
    ("agentrt", ("--help",), "error: writing output: standard output is closed"),
    ("agentrt-export", ("jsonl",), "error: writing events to standard output: standard "
                                   "output is closed; no cursor file was given, so nothing "
                                   "was saved"),
])
def test_a_closed_stdout_is_one_sentence_and_exit_1(db, command, args, said):
    code, err = run(command, *((*args, "--db", db) if command == "agentrt-export"
                               else ("--db", db, *args)), close_stdout=True)
    assert code == 1
    assert one_line(err) == said


@pytest.mark.parametrize("command", ["agentrt", "agentrt-export"])
def test_an_argument_that_is_not_utf8_is_a_usage_error_that_changes_nothing(db, command):
    before = snapshot(db)
    args = (("--db", db, "cancel", b"\xffrun") if command == "agentrt"
            else ("jsonl", "--db", db, "--run", b"\xffrun"))
    code, err = run(command, *args)
    assert code == 2
    assert one_line(err) == (f"usage: argument {len(args)} (\ufffdrun) is not valid UTF-8; "
                             "give it in UTF-8")
    assert snapshot(db) == before


def _env_with(name: bytes, value: bytes) -> dict[bytes, bytes]:
    env = {k.encode(): v.encode() for k, v in child_env().items()}
    env[name] = value
    return env


def test_a_database_variable_that_is_not_utf8_is_a_usage_error(db):
    done = subprocess.run([sys.executable, "-m", "agentrt.cli", "runs"],
                          capture_output=True, stdin=subprocess.DEVNULL,
                          env=_env_with(b"AGENTRT_DB", b"\xff.db"), timeout=120)
    assert done.returncode == 2
    assert one_line(done.stderr) == "usage: $AGENTRT_DB is not valid UTF-8; set it in UTF-8"


def test_user_that_is_not_utf8_matters_only_to_a_decision_without_by(db):
    env = _env_with(b"USER", b"\xff")
    listed = subprocess.run([sys.executable, "-m", "agentrt.cli", "--db", db, "runs"],
                            capture_output=True, stdin=subprocess.DEVNULL, env=env, timeout=120)
    assert listed.returncode == 0, listed.stderr
    before = snapshot(db)
    decided = subprocess.run([sys.executable, "-m", "agentrt.cli", "--db", db, "cancel", "r"],
                             capture_output=True, stdin=subprocess.DEVNULL, env=env,
                             timeout=120)
    assert decided.returncode == 2 and b"Traceback" not in decided.stderr
    assert decided.stderr.decode().splitlines()[0] == (
        "usage: $USER is not valid UTF-8: pass --by or set USER in UTF-8")
    assert snapshot(db) == before


def test_an_otel_variable_that_is_not_utf8_matters_only_to_the_otel_command(db):
    env = _env_with(b"OTEL_SERVICE_NAME", b"\xff")
    jsonl = subprocess.run([sys.executable, "-m", "agentrt_export.cli", "jsonl", "--db", db],
                           capture_output=True, stdin=subprocess.DEVNULL, env=env, timeout=120)
    assert jsonl.returncode == 0, jsonl.stderr
    env[b"OTEL_TRACES_EXPORTER"] = b"none"
    otel = subprocess.run([sys.executable, "-m", "agentrt_export.cli", "otel", "--db", db],
                          capture_output=True, stdin=subprocess.DEVNULL, env=env, timeout=120)
    assert otel.returncode == 2
    assert "otel: $OTEL_SERVICE_NAME is not valid UTF-8; set it in UTF-8" in otel.stderr.decode()


@pytest.mark.parametrize(("command", "args", "files"), [
    ("agentrt", ("cancel", "some-run", "--by", "op"), 6),
    ("agentrt", ("runs",), 5),
    ("agentrt-export", ("jsonl",), 5),
])
def test_too_few_file_descriptors_are_named_with_the_fix(db, command, args, files):
    """SQLite's own words are "unable to open database file"; a ulimit -n set too
    low is said as such."""
    before = snapshot(db)
    argv = (*args, "--db", db) if command == "agentrt-export" else ("--db", db, *args)
    code, err = run(command, *argv, files=files)
    assert code == 1
    assert (f"this process may open too few files (ulimit -n {files}): raise the limit "
            "(ulimit -n 1024) and try again") in one_line(err)
    assert snapshot(db) == before


def test_too_many_open_files_anywhere_else_is_said_with_the_limit_and_the_fix():
    """Where Python, not SQLite, runs out (an import, a file the command opens)."""
    from agentrt.clitools import _output_failed

    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    exc = OSError(errno.EMFILE, "Too many open files", "/some/module.py")
    assert _output_failed(exc) == (
        f"Too many open files: this process may open too few files (ulimit -n {limit}): "
        "raise the limit (ulimit -n 1024) and try again")

"""The ``[y/N]`` consent prompt at a real terminal: an answer that is not UTF-8,
and a stderr closed so that the prompt cannot be shown (review of the operator
command)."""

from __future__ import annotations

import os
import pty
import select
import sys
import time

import pytest
from _cli_kit import child_env, operator_db, snapshot

AGENTRT = os.path.join(os.path.dirname(sys.executable), "agentrt")


@pytest.fixture
def ops(tmp_path) -> dict[str, str]:
    return operator_db(str(tmp_path / "ops.db"))


def _read_all(fd: int, answer: bytes | None = None) -> bytes:
    """What the terminal shows until the child is done, typing ``answer`` at ``[y/N]``."""
    out, sent, deadline = b"", False, time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 5)
        if not ready:
            break
        try:
            data = os.read(fd, 4096)
        except OSError:  # the child closed its side: EIO
            break
        if not data:
            break
        out += data
        if answer is not None and not sent and b"[y/N]" in out:
            os.write(fd, answer)
            sent = True
    return out


@pytest.mark.parametrize("verb", ["approve", "reject"])
def test_an_answer_that_is_not_utf8_at_the_prompt_declines_and_does_not_blame_the_database(
        ops, verb):
    """A Latin-1 terminal typing 'é' (or a stray paste) at the prompt, where stdin
    decodes strictly (en_US.UTF-8; PYTHONIOENCODING=utf-8 stands in for it): the
    UnicodeDecodeError was caught as a damaged row, "ops.db holds a value that
    does not decode", sending the operator to look for damage that is not there.
    It is an answer that is not y or yes: declined, nothing decided."""
    env = child_env(PYTHONIOENCODING="utf-8", TZ="UTC")
    before = snapshot(ops["db"])
    pid, fd = pty.fork()
    if pid == 0:  # the child
        os.execve(AGENTRT, [AGENTRT, "--db", ops["db"], verb, ops["waiting"]], env)
    screen = _read_all(fd, b"\xe9\n").decode("utf-8", "replace")
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert snapshot(ops["db"]) == before
    assert os.waitstatus_to_exitcode(status) == 1, screen
    assert f"error: {verb}: declined at the prompt" in screen, screen
    assert "does not decode" not in screen and "Traceback" not in screen, screen


@pytest.mark.parametrize("verb", ["approve", "reject"])
def test_deciding_at_a_terminal_with_stderr_closed_is_the_usage_refusal_not_a_crash(
        ops, tmp_path, verb):
    """``agentrt approve RUN 2>&-`` at a terminal: the prompt goes to stderr,
    which Python holds as None when fd 2 is closed, and writing it raised an
    AttributeError (a traceback written nowhere, exit 1). A prompt that cannot
    be shown gets no consent: the refusal, exit 2, as for a terminal that hangs
    up at the prompt. Nothing is decided."""
    report = tmp_path / "report"
    wrapper = (
        "import os, sys, traceback\n"
        "os.close(2)\n"
        "sys.stderr = None\n"  # what Python gives a process started with fd 2 closed
        "from agentrt.cli import main\n"
        "try:\n"
        "    main(sys.argv[2:])\n"
        "except SystemExit as e:\n"
        "    open(sys.argv[1], 'w').write(f'exit {e.code}')\n"
        "except BaseException:\n"
        "    open(sys.argv[1], 'w').write(traceback.format_exc())\n"
    )
    before = snapshot(ops["db"])
    pid, fd = pty.fork()
    if pid == 0:  # the child
        os.execve(sys.executable, [sys.executable, "-c", wrapper, str(report), "--db",
                                   ops["db"], verb, ops["waiting"]], child_env())
    _read_all(fd)
    os.waitpid(pid, 0)
    os.close(fd)
    assert snapshot(ops["db"]) == before
    said = report.read_text()
    assert said == "exit 2", said

"""The examples in ``docs/operator.md``, run for real.

Every ```` ```console ```` block holds commands (``$ agentrt ...``) each followed by
what it printed, stdout and stderr interleaved as a terminal shows them. The
database is recorded by the real driver (fixed ids, a fake clock, times in
UTC); the blocks run in document order, so a decision made in one is seen by
the next. ``tests/test_operator_docs.py`` checks the document against this;
``python tests/operator_docs.py`` rewrites the outputs after a change.

A kept head in an example (``--head SEQ:HASH``) is filled with the hash the
database holds at that seq, so the example shows a match.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cli_kit import LIMITS, REPO_ROOT, Kit  # noqa: E402

from agentrt.cli import cli  # noqa: E402
from agentrt.clitools import run_click  # noqa: E402
from agentrt.records import Decision  # noqa: E402
from agentrt.store import open_existing  # noqa: E402
from agentrt.testing import FakeClock  # noqa: E402

DOC = os.path.join(REPO_ROOT, "docs", "operator.md")
DB_NAME = "ops.db"
_HEAD = re.compile(r"\b(\d+):[0-9a-f]{64}\b")


def build(directory: str) -> None:
    """The database the examples read: four runs, three of them waiting."""
    _record(Kit(os.path.join(directory, DB_NAME), seed="docs"))


def _record(kit: Kit) -> None:
    try:
        kit.driver([
            Decision.tool_call("read_file", b'{"path":"builds/2026-09-30.log"}'),
            Decision.complete(b'{"failed":3,"flaky":["test_upload","test_resume"]}'),
        ]).start("summarise yesterday's failed builds", LIMITS)
        kit.waiting("deploy the service to staging")
        kit.waiting("deploy the service to production", b'{"env":"production"}',
                    history=False)
        kit.waiting("redeploy staging after the config change", history=False)
    finally:
        kit.close()


@dataclass
class Command:
    line: str
    expected: list[str] = field(default_factory=list)


@dataclass
class Block:
    start: int  # index of the ```console line
    end: int  # index of the closing ```
    commands: list[Command]


def blocks(lines: list[str]) -> Iterator[Block]:
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```console":
            i += 1
            continue
        start = i
        i += 1
        commands: list[Command] = []
        while i < len(lines) and lines[i].strip() != "```":
            if lines[i].startswith("$ "):
                commands.append(Command(lines[i]))
            elif commands:
                commands[-1].expected.append(lines[i])
            i += 1
        yield Block(start, i, commands)
        i += 1


@contextlib.contextmanager
def _docs_world(directory: str) -> Iterator[None]:
    """Run in the docs directory, in UTC, with the operator's clock fixed."""
    from agentrt.driver import operator

    saved_cwd, saved_tz = os.getcwd(), os.environ.get("TZ")
    saved_now = operator.system_now
    operator.system_now = FakeClock(datetime(2026, 10, 1, 10, 0, tzinfo=UTC),
                                    step=timedelta(seconds=1))
    os.environ["TZ"] = "UTC"
    time.tzset()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        operator.system_now = saved_now
        if saved_tz is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = saved_tz
        time.tzset()


def _fill_heads(line: str, directory: str) -> str:
    def current(m: re.Match[str]) -> str:
        with open_existing(os.path.join(directory, DB_NAME)) as store:
            return f"{m.group(1)}:{store.event_hash(int(m.group(1)))}"

    return _HEAD.sub(current, line)


def run(line: str) -> list[str]:
    """What ``$ agentrt ...`` prints, as lines (stdout and stderr in the order written)."""
    args = shlex.split(line[2:])
    if args[0] != "agentrt":
        return []
    runner = CliRunner()
    env = {"AGENTRT_DB": DB_NAME, "USER": "alice", "COLUMNS": "100"}
    with runner.isolation(env=env) as streams:
        run_click(cli, "agentrt", args[1:])
        output = streams[2].getvalue().decode("utf-8")
    return output.splitlines()


def regenerate(text: str) -> str:
    """The document with every example's output (and kept heads) as the command prints them."""
    lines = text.split("\n")
    out: list[str] = []
    with tempfile.TemporaryDirectory() as directory:
        build(directory)
        with _docs_world(directory):
            at = 0
            for block in blocks(lines):
                out.extend(lines[at:block.start + 1])
                for command in block.commands:
                    line = _fill_heads(command.line, directory)
                    out.append(line)
                    out.extend(run(line))
                out.append(lines[block.end])
                at = block.end + 1
            out.extend(lines[at:])
    return "\n".join(out)


def main() -> int:
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    fresh = regenerate(text)
    if fresh != text:
        with open(DOC, "w", encoding="utf-8") as f:
            f.write(fresh)
        print(f"rewrote the examples in {DOC}")
    else:
        print(f"{DOC} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

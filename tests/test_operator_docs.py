"""docs/operator.md cannot drift: its examples are what the command prints, and every
command and option the command has is documented there."""

from __future__ import annotations

import difflib

import click
import operator_docs

from agentrt.cli import cli


def _doc() -> str:
    with open(operator_docs.DOC, encoding="utf-8") as f:
        return f.read()


def test_the_examples_in_the_operator_docs_are_what_the_command_prints():
    text = _doc()
    fresh = operator_docs.regenerate(text)
    diff = "\n".join(difflib.unified_diff(text.splitlines(), fresh.splitlines(),
                                          "docs/operator.md", "what agentrt prints",
                                          lineterm=""))
    assert fresh == text, f"run `python tests/operator_docs.py` to update:\n{diff}"


def test_the_examples_run_every_command_against_a_real_database():
    commands = [c.line for b in operator_docs.blocks(_doc().split("\n")) for c in b.commands]
    for name in cli.commands:
        if name != "help":
            assert any(line.startswith(f"$ agentrt {name}") for line in commands), name


def test_every_subcommand_and_option_is_documented():
    text = _doc()
    for name, command in cli.commands.items():
        if name == "help":
            continue
        assert f"## `agentrt {name}" in text, name
        for param in command.params:
            if isinstance(param, click.Option):
                for opt in param.opts:
                    if opt.startswith("--") and opt != "--help":
                        assert f"`{opt}" in text or f" {opt} " in text, (name, opt)

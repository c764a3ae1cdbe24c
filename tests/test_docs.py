"""The docs cannot drift from the tests: every test or test file they cite exists."""

from __future__ import annotations

import re

import pytest
from store_helpers import ROOT

DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def _test_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        names.update(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE))
    return names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_test_a_doc_cites_exists(doc):
    text = doc.read_text()
    known = _test_names()
    cited = set(re.findall(r"(?<![\w.])(test_\w+)(?![\w.*])", text))
    cited |= set(re.findall(r"::(test_\w+)", text))
    files = set(re.findall(r"\b(tests/\w+\.py|test_\w+\.py)\b", text))
    assert cited <= known, sorted(cited - known)
    for name in files:
        path = ROOT / name if name.startswith("tests/") else ROOT / "tests" / name
        assert path.exists(), name


def test_the_readme_program_runs_and_completes(tmp_path, monkeypatch, capsys):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"## In a program\n\n```python\n(.*?)```", text, re.S)
    assert code is not None
    monkeypatch.chdir(tmp_path)
    exec(compile(code.group(1), "README.md", "exec"), {})
    assert capsys.readouterr().out == "COMPLETED goal_completed\n"


def _defined_in(path_name: str) -> set[str]:
    path = ROOT / "tests" / path_name
    if not path.exists():
        return set()
    return set(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE))


def test_every_status_row_names_its_tests_in_the_file_it_cites():
    """In ``file.py::test_a, ::test_b; other.py::test_c`` each name is defined in
    the file it follows, not merely somewhere, so deleting the cited copy of a
    test that two files define shows up."""
    wrong = []
    for line in (ROOT / "docs" / "status.md").read_text().splitlines():
        if not line.startswith("|"):
            continue
        for segment in re.split(r"[;|]", line):
            current = ""
            for file, name in re.findall(r"(test_\w+\.py)?::(test_\w+)", segment):
                current = file or current
                if current and name not in _defined_in(current):
                    wrong.append(f"{current}::{name}")
    assert not wrong, wrong


@pytest.mark.parametrize("doc", [p for p in DOCS if p.name != "status.md"], ids=lambda p: p.name)
def test_every_test_a_doc_cites_after_a_file_is_defined_in_that_file(doc):
    """``file.py::test_a`` and a later ``::test_b`` name tests of the last file
    named before them, so a reader can run each id as written."""
    wrong = []
    current = ""
    for file, name in re.findall(r"(test_\w+\.py)?::(test_\w+)", doc.read_text()):
        current = file or current
        if current and name not in _defined_in(current):
            wrong.append(f"{current}::{name}")
    assert not wrong, wrong


def test_every_document_the_code_names_exists():
    """A docstring or message sending the reader to docs/X.md names a file that is
    there (one named a document merged into another long before)."""
    named = {}
    for package in ("agentrt", "agentrt_export", "agentrt_otel", "bench", "fixtures"):
        for path in (ROOT / package).rglob("*.py"):
            for doc in re.findall(r"\bdocs/[\w.-]+\.md\b", path.read_text()):
                named.setdefault(doc, path.relative_to(ROOT).as_posix())
    assert named
    missing = {doc: where for doc, where in named.items() if not (ROOT / doc).is_file()}
    assert not missing, missing

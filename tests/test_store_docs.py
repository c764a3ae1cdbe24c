"""The store's docs cannot drift from its tests: every test they cite exists."""

from __future__ import annotations

import re

from store_helpers import ROOT


def _test_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        names.update(re.findall(r"^def (test_\w+)", path.read_text(), re.MULTILINE))
    return names


def test_every_test_the_store_docs_cite_exists():
    known = _test_names()
    for doc in ("architecture.md", "security.md"):
        cited = set(re.findall(r"`(test_\w+)`", (ROOT / "docs" / doc).read_text()))
        assert cited, doc
        assert cited <= known, (doc, sorted(cited - known))

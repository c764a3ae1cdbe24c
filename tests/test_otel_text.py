"""Text cutting: byte-based, on a character boundary, with the exact marker."""

import hypothesis.strategies as st
from hypothesis import given

from agentrt_otel import DEFAULT_MAX_TEXT, truncate


def test_truncate_cuts_on_a_character_boundary() -> None:
    assert truncate("éééééééééé", 5) == "éé…[truncated: 20 bytes]"


def test_truncate_leaves_text_that_fits() -> None:
    assert truncate("abc", 3) == "abc"
    assert truncate("", 0) == ""
    assert truncate("é", 2) == "é"


def test_truncate_to_zero_keeps_only_the_marker() -> None:
    assert truncate("abc", 0) == "…[truncated: 3 bytes]"


def test_the_default_cap_is_1024_bytes() -> None:
    assert DEFAULT_MAX_TEXT == 1024
    cut = truncate("g" * 3000, DEFAULT_MAX_TEXT)
    assert cut == "g" * 1024 + "…[truncated: 3000 bytes]"


@given(st.text(), st.integers(min_value=0, max_value=64))
def test_a_cut_text_is_a_prefix_within_the_cap(text: str, cap: int) -> None:
    out = truncate(text, cap)
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= cap:
        assert out == text
    else:
        head, _, marker = out.partition("…[truncated: ")
        assert marker == f"{len(data)} bytes]"
        assert text.startswith(head)
        assert len(head.encode("utf-8", "surrogatepass")) <= cap
        assert cap - len(head.encode("utf-8", "surrogatepass")) < 4

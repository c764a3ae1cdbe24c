"""Deterministic ids: the reference's formulas, its pinned vectors, and validity."""

import hypothesis.strategies as st
from hypothesis import given

import agentrt_otel
from agentrt_otel import span_id, span_id_hex, trace_id, trace_id_hex


def test_trace_and_span_ids_match_the_reference_vectors() -> None:
    assert trace_id_hex("run-1") == "93afafd5ba988f2a2bebf175c7cde8d6"
    assert span_id_hex("run", "run-1") == "d925db6dbbd9dfb1"
    assert span_id_hex("step", "step-1") == "a814125d85e59b99"
    assert span_id_hex("step", "step-2") == "02240d837b60d1a6"
    assert trace_id_hex("") == "3a3b6ebefddfa7684b22a19f372865fa"
    assert span_id_hex("", "") == "ae50c3c4d991c624"


def test_ids_are_integers_the_sdk_takes() -> None:
    assert trace_id("run-1") == 0x93AFAFD5BA988F2A2BEBF175C7CDE8D6
    assert span_id("run", "run-1") == 0xD925DB6DBBD9DFB1


def test_different_runs_kinds_and_ids_give_different_ids() -> None:
    assert trace_id("run-1") != trace_id("run-2")
    assert span_id("run", "x") != span_id("step", "x")
    assert span_id("step", "a") != span_id("step", "b")
    # The separator keeps ("ab", "c") and ("a", "bc") apart.
    assert span_id("ab", "c") != span_id("a", "bc")


@given(st.text(), st.text())
def test_every_id_is_valid_for_opentelemetry(kind: str, name: str) -> None:
    assert 0 < trace_id(name) < 1 << 128
    assert 0 < span_id(kind, name) < 1 << 64


def test_public_names_are_sorted_and_importable() -> None:
    assert agentrt_otel.__all__ == sorted(agentrt_otel.__all__)
    for name in agentrt_otel.__all__:
        assert hasattr(agentrt_otel, name)

"""JSON at the runtime's boundaries, where it met input a review found (spec 4.2):
memory on a long text with many brackets, integers past 64 bits under a schema,
JSON in another encoding than UTF-8, the order of the checks, numbers past what
Python converts."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from eventdb import REPO_ROOT, child_env

from agentrt.canonical import check_json
from agentrt.driver.tools import check_args, compile_schema
from agentrt.gojson import is_valid

_PEAK = textwrap.dedent("""
    from agentrt.canonical import check_json
    def hwm():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
    data = (b'{"a":' + b'[' * 200 + b']' * 200 + b',"b":' + b'[' * 100 + b']' * 100
            + b',"s":"' + b'x' * 5_000_000 + b'"}')
    before = hwm()
    assert check_json(data) is None
    print((hwm() - before) // 1024)
""")


def test_a_long_text_beside_many_brackets_is_checked_in_memory_near_its_size():
    """More than 256 brackets send the check through the depth scan, whose string
    pattern once kept about 115 bytes of backtracking state per byte."""
    done = subprocess.run([sys.executable, "-c", _PEAK], capture_output=True, text=True,
                          env=child_env(), cwd=REPO_ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 60  # MB over the 5 MB input; 575 MB before


@pytest.mark.parametrize("schema", [
    b'{"type":"object","properties":{"n":{"type":"integer","maximum":18446744073709551616}}}',
    b'{"type":"object","properties":{"n":{"const":18446744073709551616}}}',
])
def test_an_integer_past_64_bits_is_checked_exactly_against_its_schema(schema):
    """orjson rounds it to a float, which compared equal to the bound."""
    validator = compile_schema(schema)
    assert check_args(validator, b'{"n":18446744073709551617}') is not None
    assert check_args(validator, b'{"n":18446744073709551616}') is None


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16", "utf-32"])
def test_json_in_another_encoding_than_utf8_is_not_json(encoding):
    data = '{"type":"object"}'.encode(encoding)
    assert not is_valid(data)
    with pytest.raises(ValueError, match="input schema is not valid JSON"):
        compile_schema(data)


@pytest.mark.parametrize(("data", "said"), [
    (b'{"a":"\\ud800","a":1}', "unpaired surrogate \\ud800"),
    (b'{"a":["x","\\udc00"],"a":1}', "unpaired surrogate \\udc00"),
])
def test_a_surrogate_in_an_overwritten_value_is_said_before_the_duplicate_key(data, said):
    assert check_json(data) == said


def test_a_schema_number_past_what_python_converts_is_said_as_such():
    with pytest.raises(ValueError, match=r"of 5000 digits, more than Python converts \(4300\)"):
        compile_schema(b'{"type":"object","properties":{"n":{"maximum":' + b"1" * 5000 + b'}}}')


_RECORD_PEAK = textwrap.dedent("""
    from agentrt.events import Event
    from agentrt.trace import jsonl_record
    def hwm():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
    # Code in a tool's arguments: whitespace and escaped quotes in one long string,
    # stored with Go's escapes, so the record must compact it piece by piece.
    line = b'print(\\\\"hello world\\\\") \\\\u003c\\\\u003e\\\\n'
    payload = b'{"args": {"content": "' + line * 400_000 + b'"}}'
    event = Event(1, "r", "s", "2026-10-01T09:00:00Z", "step.decided", payload)
    before = hwm()
    record = jsonl_record(event)
    assert record.count(b" ") == 800_000 and b'"args":{"content":' in record
    print((hwm() - before) // 1024)
""")


def test_a_long_string_with_escaped_quotes_is_compacted_for_a_record_in_memory_near_its_size():
    """The record's compaction split the payload with a backtracking string
    pattern: 234 MB of state over this 15 MB payload (a live trace of a tool
    call carrying code)."""
    done = subprocess.run([sys.executable, "-c", _RECORD_PEAK], capture_output=True, text=True,
                          env=child_env(), cwd=REPO_ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 100, done.stdout  # MB over the 15 MB input

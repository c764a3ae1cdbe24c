"""The edges a consumer application touches: trace observers given what a
program really passes them, and the testing helpers misused as people do."""

from __future__ import annotations

import io
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from eventdb import child_env, child_process

from agentrt import Decision, Limits, open_existing, open_store
from agentrt.driver import DefaultPolicy, Driver
from agentrt.events import Event
from agentrt.testing import FakeClock, ScriptedAgent, static_tool
from agentrt.trace import jsonl, jsonl_record, jsonl_with_err, writer, writer_with_err
from agentrt_export import Follower, JSONLSink

LIMITS = Limits(max_steps=10, max_consecutive_tool_failures=3, loop_threshold=3)
AT = datetime(2026, 9, 25, 14, 3, 4, 500000, tzinfo=UTC)
#: What an agent and a tool may well say: accents, a snowman, an emoji, a line
#: separator, an escaped NUL and lone surrogate, a number past a double.
UNUSUAL = '{"é":"☃ 😀 \u2028","nul":"\\u0000","lone":"\\ud800","big":1234567890123456789012345}'
#: The same without the lone surrogate, which a decision's arguments may not hold.
USABLE = UNUSUAL.replace(',"lone":"\\ud800"', "")

# -- the observers refuse what no line can be written to ------------------------------


@pytest.mark.parametrize("make", [jsonl, jsonl_with_err, writer, writer_with_err])
@pytest.mark.parametrize(("stream", "says"), [
    ("trace.jsonl", "it was given a str ('trace.jsonl'): open the file first"),
    (Path("trace.jsonl"), "it was given a PosixPath: open the file first"),
    (5, "needs a stream with write(), such as sys.stdout.buffer; it was given an int (5)"),
])
def test_an_observer_given_a_path_says_so_when_made(make: Any, stream: Any, says: str) -> None:
    # Write failures are swallowed so a run is never broken by its trace: a path
    # passed by mistake traced nothing, and said nothing.
    with pytest.raises(TypeError, match="agentrt: trace[.](jsonl|writer) needs a stream") as exc:
        make(stream)
    assert says in str(exc.value)


@pytest.mark.parametrize("make", [jsonl, writer])
def test_an_observer_given_a_closed_file_says_so_when_made(make: Any, tmp_path: Path) -> None:
    out = open(tmp_path / "t.jsonl", "wb")  # noqa: SIM115 - closed on purpose
    out.close()
    with pytest.raises(ValueError, match="was given a closed stream .*open for writing"):
        make(out)


CLOSED_STDERR = """\
import sys
from datetime import UTC, datetime
from agentrt.events import Event
from agentrt.trace import writer
assert sys.stderr is None
writer(sys.stderr)(Event(1, "r", "", datetime.now(UTC), "run.created", b"{}"))
print("traced nothing, and went on")
"""


def test_an_observer_on_a_stderr_the_caller_closed_lets_the_program_go_on() -> None:
    # Python makes a closed standard stream None: ``agentrt cancel RUN 2>&-``
    # traces to it, and must still cancel.
    closed = ["/bin/sh", "-c", 'exec "$0" -c "$1" 2>&-', sys.executable, CLOSED_STDERR]
    with child_process(closed) as proc:
        out, _ = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, b"traced nothing, and went on\n")


# -- a text stream that does not encode UTF-8 -----------------------------------------


def exported(db: str) -> bytes:
    """What ``agentrt-export jsonl`` writes for every event of ``db``."""
    out = io.BytesIO()
    store = open_existing(db, read_only=True)
    try:
        sink = JSONLSink(out)
        Follower(store, once=True).follow(sink)
        sink.flush()
    finally:
        store.close()
    return out.getvalue()


def unusual_run(db: str, observer: Any) -> None:
    tool = static_tool("read", content=UNUSUAL.encode(), summary="lu ☃ \u2028")
    agent = ScriptedAgent([Decision.tool_call("read", UNUSUAL), Decision.tool_call("read", USABLE),
                           Decision.complete(USABLE)])
    store = open_store(db)
    try:
        run = Driver(store, agent, DefaultPolicy(), [tool], observer=observer).start(
            "résumé ☃", LIMITS, run_id="run-é")
        assert run.status == "COMPLETED"
    finally:
        store.close()


def test_a_live_trace_to_a_latin1_text_file_is_the_exported_record_byte_for_byte(
        tmp_path: Path) -> None:
    db, path = str(tmp_path / "runs.db"), tmp_path / "trace.jsonl"
    with open(path, "w", encoding="latin-1") as out:
        out.write("# trace\n")  # the consumer's own text keeps its place
        observe, err = jsonl_with_err(out)
        unusual_run(db, observe)
        out.write("# end\n")
        assert err() is None
    assert path.read_bytes() == b"# trace\n" + exported(db) + b"# end\n"


def test_an_aligned_trace_to_an_ascii_text_stream_keeps_every_line(tmp_path: Path) -> None:
    raw = io.BytesIO()
    text = io.TextIOWrapper(raw, encoding="ascii", write_through=True)
    observe, err = writer_with_err(text)
    events = [Event(i, "r", "", AT, "step.decided", UNUSUAL.encode()) for i in range(1, 4)]
    for e in events:
        observe(e)
    assert err() is None
    lines = raw.getvalue().decode("utf-8").splitlines()
    assert len(lines) == 3 and all("☃ 😀 \\u{2028}" in line for line in lines)


TRACE_TO_STDOUT = f"""\
import sys
from agentrt import Decision, Limits, open_store
from agentrt.driver import DefaultPolicy, Driver
from agentrt.testing import ScriptedAgent, static_tool
from agentrt.trace import jsonl
unusual, usable = {UNUSUAL!r}, {USABLE!r}
tool = static_tool("read", content=unusual.encode(), summary="lu \\u2603 \\u2028")
agent = ScriptedAgent([Decision.tool_call("read", unusual), Decision.tool_call("read", usable),
                       Decision.complete(usable)])
run = Driver(open_store(sys.argv[1]), agent, DefaultPolicy(), [tool],
             observer=jsonl(sys.stdout)).start("r\\u00e9sum\\u00e9", Limits(10, 3, 3))
assert run.status == "COMPLETED"
"""


def test_a_live_trace_to_stdout_under_pythonioencoding_ascii_is_the_exported_record(
        tmp_path: Path) -> None:
    # jsonl(sys.stdout) stopped at the first non-ASCII character, silently.
    db = str(tmp_path / "runs.db")
    env = dict(child_env(), PYTHONIOENCODING="ascii")
    with child_process([sys.executable, "-c", TRACE_TO_STDOUT, db], env=env) as proc:
        out, errs = proc.communicate(timeout=60)
    assert proc.returncode == 0, errs.decode(errors="replace")
    want = exported(db)
    assert want.count(b"\n") == 14 and "☃".encode() in want
    assert out == want


def test_a_utf8_text_stream_is_still_written_as_text() -> None:
    text = io.StringIO()
    e = Event(1, "r", "", AT, "step.decided", UNUSUAL.encode())
    jsonl(text)(e)
    assert text.getvalue().encode() == jsonl_record(e)


# -- the testing helpers, misused -----------------------------------------------------


@pytest.mark.parametrize(("make", "says"), [
    (lambda: FakeClock(step=1.0), "FakeClock step is a float (1.0), not a timedelta"),
    (lambda: FakeClock(start="2026-10-01"), "FakeClock start is a str ('2026-10-01'), "
                                            "not a datetime"),
    (lambda: FakeClock().advance(5), "FakeClock.advance is an int (5), not a timedelta"),
    (lambda: FakeClock().set(0), "FakeClock.set is an int (0), not a datetime"),
])
def test_a_fake_clock_given_seconds_or_text_says_so_when_set(make: Any, says: str) -> None:
    # Else the first reading failed inside the driver with "unsupported operand".
    with pytest.raises(TypeError) as exc:
        make()
    assert str(exc.value) == says


def test_a_fake_clock_still_takes_a_datetime_and_a_timedelta() -> None:
    c = FakeClock(start=AT, step=timedelta(seconds=1))
    c.advance(timedelta(seconds=2))
    assert (c(), c.peek()) == (AT + timedelta(seconds=2), AT + timedelta(seconds=3))


def test_a_scripted_agent_given_one_decision_says_it_takes_a_list() -> None:
    with pytest.raises(TypeError, match="ScriptedAgent takes a list of decisions .* it was "
                                        "given a Decision"):
        ScriptedAgent(Decision.complete())  # type: ignore[arg-type]


@pytest.mark.parametrize(("entry", "detail"), [
    ('{"done":true}', "the script's entry for step 0 is a str ('{\"done\":true}'), not a "
                      "Decision, a function of the step input or an exception"),
    (None, "no decision scripted for step 0: its entry is None"),
])
def test_a_scripted_agents_unusable_entry_is_recorded_in_words(entry: Any, detail: str) -> None:
    # Recorded before as "'str' object is not callable".
    store = open_store(":memory:")
    run = Driver(store, ScriptedAgent([entry]), DefaultPolicy(), []).start("g", LIMITS)
    assert (run.status, run.reason, run.reason_detail) == ("FAILED", "agent_error", detail)


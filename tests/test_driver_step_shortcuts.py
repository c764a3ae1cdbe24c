"""The driver step's write shortcuts give what the general paths they stand for give.

Each pins one shortcut taken for a step's cost: the loop check compares the
arguments' content keys (hashing only a loop found), a tool's start checks
the lease in its step write (no read of the run while the expiry last read is
still the stored one), the tool start's payload written from the recorded
arguments, and one-row reads on the shared cursor.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hashing import noisy

from agentrt.canonical import check_and_forms, content_hash, content_key
from agentrt.driver import DefaultPolicy, Driver, FuncTool, StepInput, ToolResult
from agentrt.driver.jsonenc import encode
from agentrt.driver.limits import loop_streak
from agentrt.driver.stored import stored_raw
from agentrt.errors import AgentrtError
from agentrt.gojson import Raw
from agentrt.records import Decision, Limits, Observation, Step
from agentrt.store import open_store
from agentrt.store.writes import check_run, insert_step, update_step
from agentrt.timefmt import format_time


@settings(max_examples=400, deadline=None)
@given(noisy)
def test_the_loop_check_key_of_arguments_is_what_their_content_hash_hashes(data):
    problem, _, canonical = check_and_forms(data)
    if problem is not None:
        return
    # The loop keeps the canonical form made with the check (a step of this
    # session) or the content key of the stored arguments (a step read back).
    assert canonical == content_key(data) == content_key(stored_raw(data) or b"{}")
    assert hashlib.sha256(canonical).hexdigest() == content_hash(data)


def _tool_step(step_id: str, args: bytes) -> Step:
    return Step(step_id, "r", 0, "DONE", decision=Decision.tool_call("t", args),
                observation=Observation("tool_result", b"{}", "", content_hash(b"{}")))


def test_a_loop_is_reported_with_the_content_hash_of_its_arguments():
    # The same arguments in another key order: "a" keyed as this session keys
    # them, "b" from its stored arguments, as after a resume.
    steps = [_tool_step("a", b'{"x": 1, "y": 2}'), _tool_step("b", b'{"y":2,"x":1}')]
    keys = {"a": check_and_forms(b'{"x": 1, "y": 2}')[2]}
    n, sig = loop_streak(steps, 5, keys)
    assert n == 2
    assert sig == ("t", content_hash(b'{"y":2,"x":1}'), content_hash(b"{}"))


T0 = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)
EXPIRES = T0 + timedelta(seconds=30)


def _store(tmp_path, name: str, *, status: str = "RUNNING", owner: str = "me",
           expires: datetime = EXPIRES, step_status: str = "DECIDING"):
    store = open_store(str(tmp_path / f"{name}.db"))
    with store.tx() as tx:
        tx.execute("INSERT INTO runs (id, goal, status, limits_json, created_at, lease_owner, "
                   "lease_expires_at) VALUES ('r', 'g', ?, '{}', '', ?, ?)",
                   (status, owner, format_time(expires)))
        insert_step(tx, ("s", "r", 0, step_status, "", "", "", "", format_time(T0), "", "", ""))
    return store


_ROW = ("s", "r", 0, "EXECUTING", '{"kind":"tool_call"}', "", "", "", format_time(T0), "",
        "h", "p")


def _outcome(store, write) -> tuple[str, object]:
    try:
        with store.tx() as tx:
            write(tx)
    except AgentrtError as exc:
        said: str = f"{type(exc).__name__}: {exc}"
    else:
        said = ""
    rows = store.db().execute("SELECT * FROM steps").fetchall()
    store.close()
    return said, rows


def _general(tx, live_at):
    check_run(tx, "r", ("RUNNING",), owner="me", live_at=live_at)
    update_step(tx, _ROW, ("DECIDING",))


@pytest.mark.parametrize("case", [
    dict(),                                         # the expiry last read is stored
    dict(known=format_time(EXPIRES - timedelta(seconds=10))),  # renewed since
    dict(known=""),                                 # none read yet
    dict(live_at=EXPIRES),                          # expired by the start
    dict(known=format_time(EXPIRES), expires=T0),   # expired since it was read
    dict(owner="other"),                            # taken over
    dict(status="CANCELLED"),                       # cancelled
    dict(step_status="EXECUTING"),                  # the step moved on
])
def test_a_tool_start_writes_and_refuses_as_check_run_then_the_write_do(tmp_path, case):
    live_at = case.pop("live_at", T0 + timedelta(seconds=1))
    known = case.pop("known", format_time(EXPIRES))
    general = _outcome(_store(tmp_path, "general", **case), lambda tx: _general(tx, live_at))
    fast = _outcome(_store(tmp_path, "fast", **case), lambda tx: update_step(
        tx, _ROW, ("DECIDING",), running_for="me", live=(known, live_at)))
    assert fast == general


def test_one_row_reads_on_the_shared_cursor_give_what_a_cursor_of_their_own_gives(tmp_path):
    store = _store(tmp_path, "reads")
    sql = "SELECT status, lease_owner, lease_expires_at FROM runs WHERE id = ?"
    with store.tx() as tx:
        for run_id in ("r", "missing"):
            assert tx.only(sql, (run_id,)) == tx.one(sql, (run_id,))
    assert store.read_row(sql, ("r",)) == ("RUNNING", "me", format_time(EXPIRES))
    assert store.read_row(sql, ("missing",)) is None
    store.close()


_NAMES = st.text(max_size=8) | st.sampled_from(["noop", "a<b>&c", "\u2028\u00e9", "\ud800x"])


@settings(max_examples=400, deadline=None)
@given(noisy, _NAMES)
def test_a_tool_start_payload_is_what_encoding_the_arguments_as_raw_writes(data, name):
    if check_and_forms(data)[0] is not None or not data.strip():
        return  # the loop starts no tool with arguments that fail their check
    # The loop writes the recorded decision's arguments (stored_raw) as they are.
    fast = b'{"args":%b,"tool":%b}' % (stored_raw(data) or b"{}", encode(name))
    assert fast == encode({"args": Raw(data), "tool": name})


def test_a_tool_start_records_the_arguments_as_given_compacted_and_escaped(tmp_path):
    args = b' { "q" : "<a&b>" ,\n "n": [1, 2] } '
    store = open_store(str(tmp_path / "start.db"))
    driver = Driver(store, _OneCall(args), DefaultPolicy(), [FuncTool(
        "noop", lambda call: ToolResult(b"{}", "ok"), side_effect="read_only")])
    driver.start("g", Limits(max_steps=1, max_consecutive_tool_failures=3, loop_threshold=3))
    payloads = [e.payload for e in store.list_events_after("", 0, 100)
                if e.type == "step.tool_started"]
    assert payloads == [encode({"args": Raw(args), "tool": "noop"})]
    assert payloads[0] == b'{"args":{"q":"\\u003ca\\u0026b\\u003e","n":[1,2]},"tool":"noop"}'
    store.close()


class _OneCall:
    def __init__(self, args: bytes) -> None:
        self.args = args

    def decide(self, step: StepInput) -> Decision:
        return Decision.tool_call("noop", self.args)


def test_the_loop_check_keeps_the_arguments_of_recent_steps_only():
    # Its keys are each step's whole canonical arguments: a long run with large
    # arguments must not keep every step's.
    from _driver_kit import call, limits, make

    from agentrt.driver import loop as loop_mod

    seen: dict[str, dict[str, bytes]] = {}
    real = loop_mod.check_before_step

    def spy(run, steps, now, keys):
        seen["keys"] = keys
        return real(run, steps, now, keys)

    tool = FuncTool("w", lambda c: ToolResult(b"{}", "ok"), side_effect="read_only", timeout=5)
    script = [call("w", b'{"i":%d,"blob":"%s"}' % (i, b"x" * 20_000)) for i in range(60)]
    d, _, _, _ = make(None, script=[*script, Decision.complete()], tools=[tool])
    original = loop_mod.check_before_step
    loop_mod.check_before_step = spy
    try:
        run = d.start("g", limits(max_steps=70, loop_threshold=3), run_id="r")
    finally:
        loop_mod.check_before_step = original
    assert run.status == "COMPLETED"
    assert len(seen["keys"]) <= 2 * 3 + 16

"""Shared fixtures for the driver tests: the fixture tools, stores, and short readers."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from agentrt.driver import CancelledError, CancelToken, DefaultPolicy, Driver
from agentrt.records import Decision, Limits
from agentrt.store import Store, open_store
from agentrt.testing import FakeClock, MemoryObserver, ScriptedAgent, static_tool

SCHEMA_N = b'{"type":"object","properties":{"n":{"type":"integer"}},"additionalProperties":false}'


def limits(**kw: object) -> Limits:
    base = {"max_steps": 50, "max_consecutive_tool_failures": 3, "loop_threshold": 3}
    base.update(kw)
    return Limits(**base)  # type: ignore[arg-type]


def fixture_tools(calls: list | None = None) -> list:
    """The tools every export fixture uses: read, write, publish, wipe."""
    return [
        static_tool("read", "read_only", input_schema=SCHEMA_N, calls=calls),
        static_tool("write", "local_mutation", input_schema=SCHEMA_N, calls=calls),
        static_tool("publish", "remote_mutation", calls=calls),
        static_tool("wipe", "destructive", input_schema=b"true", calls=calls),
    ]


def ids(prefix: str = "id"):
    counter = itertools.count()
    return lambda: f"{prefix}{next(counter)}"


def call(tool: str, args: bytes | str | None = b"{}", **kw: object) -> Decision:
    return Decision.tool_call(tool, args, **kw)  # type: ignore[arg-type]


def make(store: Store | None = None, script: list | None = None, tools: list | None = None,
         **kw: object) -> tuple[Driver, Store, ScriptedAgent, MemoryObserver]:
    store = store if store is not None else open_store(":memory:")
    agent = ScriptedAgent(script or [])
    obs = MemoryObserver()
    kw.setdefault("policy", DefaultPolicy())
    policy = kw.pop("policy")
    d = Driver(store, agent, policy, tools if tools is not None else fixture_tools(),
               observer=kw.pop("observer", obs), **kw)  # type: ignore[arg-type]
    return d, store, agent, obs


def types(store: Store, run_id: str) -> list[str]:
    return [e.type for e in store.list_events(run_id)]


def clock(step: float = 1.0) -> FakeClock:
    return FakeClock(step=timedelta(seconds=step))


def stopped_while_deciding(run_id: str = "r") -> tuple[Driver, Store]:
    """A run whose caller cancelled its token while the agent decided the first
    step: left RUNNING, lease held, the step ``deciding``, as a driver that
    stopped there. Its next decision completes it."""
    token = CancelToken()

    def decide(step: object) -> Decision:
        token.cancel()
        raise RuntimeError("stopped")

    d, store, _, _ = make(script=[decide, Decision.complete()])
    with pytest.raises(CancelledError):
        d.start("g", limits(), run_id=run_id, cancel=token)
    return d, store

"""A driver process that ``test_driver_processes`` kills or cancels at random points.

    python tests/driver_worker.py DB RUN_ID LEDGER

It starts the run, or resumes it (waiting out a dead process's lease, and
granting, as the operator would, any pause for an interrupted side effect),
until the run has ended; then it prints the run's status and exits 0. Each
tool appends a line ``<tool> <step_id>`` to LEDGER before it returns, through
one ``write`` on an ``O_APPEND`` descriptor, so a kill leaves whole lines and
the ledger records every execution that happened, recorded or not.

The agent's script is a function of the step's index: a read-only ``look``,
a mutating ``write``, and a step that asks a model (which fails every other
attempt, so calls are retried) and then looks; from index ``STEPS`` on, it
completes. Tools and the model sleep a few milliseconds, so a random kill
lands inside a tool, between a tool's effect and its record, in a model call
or in a commit. A run an operator cancels ends the loop with its status
(``CANCELLED``), as any other ending does.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

from agentrt.driver import (
    DefaultPolicy,
    Driver,
    FuncTool,
    Message,
    ModelConfig,
    ModelRequest,
    ModelResponse,
    StepInput,
    ToolCall,
    ToolResult,
    TransientError,
    approve,
)
from agentrt.errors import LeaseLostError, NotFoundError, RunLeasedError
from agentrt.records import Decision, Limits, Usage
from agentrt.store import open_store

#: The index from which the agent completes the run.
STEPS = 12
LEASE_TTL = 0.5
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
#: A step a kill interrupted counts as a failed step (spec 1: every observation
#: but a tool result is a failure); the test kills a run up to 6 times.
LIMITS = Limits(max_steps=10 * STEPS, max_consecutive_tool_failures=10, loop_threshold=100)


def main(db: str, run_id: str, ledger: str) -> int:
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def tool(name: str, pause: float) -> FuncTool:
        def run(call: ToolCall) -> ToolResult:
            os.write(fd, f"{name} {call.step_id}\n".encode())
            time.sleep(pause)
            return ToolResult(b'{"ok":true}', f"{name} done")
        effect = "read_only" if name == "look" else "local_mutation"
        return FuncTool(name, run, side_effect=effect, timeout=5)

    model = FlakyModel()
    store = open_store(db)
    driver = Driver(store, Agent(), DefaultPolicy(), [tool("look", 0.002), tool("write", 0.005)],
                    model=ModelConfig(model, max_retries=3, backoff=timedelta(milliseconds=1)),
                    lease_owner="crash-worker", lease_ttl=LEASE_TTL)
    print("ready", flush=True)
    while True:
        try:
            run = store.get_run(run_id)
        except NotFoundError:
            run = driver.start("survive being killed", LIMITS, run_id=run_id)
        if run.status in TERMINAL:
            print(run.status, flush=True)
            if run.status != "COMPLETED":
                print(f"{run.reason}: {run.reason_detail}", file=sys.stderr)
            return 0
        for approval in store.list_approvals(run_id):
            if approval.status == "pending":
                approve(store, run_id, approval.id, "operator", "crash test: run it again")
        try:
            driver.resume(run_id)
        except RunLeasedError:  # the killed process's lease has not expired yet
            time.sleep(0.05)
        except LeaseLostError:  # a heartbeat starved on a loaded host: take it back
            continue


class Agent:
    def decide(self, step: StepInput) -> Decision:
        i = step.index
        if i >= STEPS:
            return Decision.complete(b'{"done":true}')
        if i % 3 == 1:
            return Decision.tool_call("write", b'{"n":%d}' % i)
        if i % 3 == 2 and step.model is not None:
            step.model.generate(ModelRequest(messages=[Message("user", f"step {i}")],
                                             max_output_tokens=16))
        return Decision.tool_call("look", b"{}")


class FlakyModel:
    """Answers after 3 ms; every other call fails as a 503 would."""

    def __init__(self) -> None:
        self.calls = 0

    def name(self) -> str:
        return "flaky-model"

    def generate(self, request: ModelRequest, cancel: object) -> ModelResponse:
        self.calls += 1
        time.sleep(0.003)
        if self.calls % 2:
            raise TransientError("503 try again")
        return ModelResponse(text="ok", usage=Usage(input_tokens=5, output_tokens=2))


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))

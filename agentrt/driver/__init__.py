"""The agent loop: agent decides, policy rules, a person approves, tools run.

Every transition commits in one transaction with the events that explain it.
See ``docs/architecture.md`` ("The loop") for the loop, approvals, interruption and
the lease, each claim beside the test that proves it.
"""

from agentrt.driver.agent import Agent, AgentFunc, StepInput
from agentrt.driver.cancel import CancelToken
from agentrt.driver.driver import Driver
from agentrt.driver.errors import (
    AbortRun,
    CancelledError,
    ConfigError,
    LimitError,
    ModelUnavailableError,
    ServedError,
    ToolError,
    TransientError,
    UnusableUsageError,
)
from agentrt.driver.model import (
    Message,
    Model,
    ModelCaller,
    ModelConfig,
    ModelRequest,
    ModelResponse,
    Price,
    ToolUse,
    cost_micros,
)
from agentrt.driver.operator import (
    Operator,
    approve,
    approve_shown,
    cancel,
    reject,
    reject_shown,
)
from agentrt.driver.policy import (
    DefaultPolicy,
    IdentifiedPolicy,
    Policy,
    PolicyFunc,
    RunView,
    SideEffectPolicy,
    need_approval,
)
from agentrt.driver.recovery import Reconcile, Reconciliation
from agentrt.driver.tools import FuncTool, Tool, ToolCall, ToolResult

__all__ = [
    "AbortRun",
    "Agent",
    "AgentFunc",
    "CancelToken",
    "CancelledError",
    "ConfigError",
    "DefaultPolicy",
    "Driver",
    "FuncTool",
    "IdentifiedPolicy",
    "LimitError",
    "Message",
    "Model",
    "ModelCaller",
    "ModelConfig",
    "ModelRequest",
    "ModelResponse",
    "ModelUnavailableError",
    "Operator",
    "Policy",
    "PolicyFunc",
    "Price",
    "Reconcile",
    "Reconciliation",
    "RunView",
    "ServedError",
    "SideEffectPolicy",
    "StepInput",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "ToolUse",
    "TransientError",
    "UnusableUsageError",
    "approve",
    "approve_shown",
    "cancel",
    "cost_micros",
    "need_approval",
    "reject",
    "reject_shown",
]

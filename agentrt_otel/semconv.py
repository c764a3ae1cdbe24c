"""Generic GenAI and OpenInference attributes, derived from our own.

Backends that know the OpenTelemetry GenAI semantic conventions (or
OpenInference, as Phoenix does) render agent, tool and model spans natively
when spans carry those keys. They are added beside the ``agentrt.*``
attributes when a span ends, computed only from the span's final attributes,
so they are the same whatever order or restart the attributes arrived through.

A *tool step* is a step whose decision was a tool call
(``agentrt.decision.kind = tool_call``) or whose tool ran
(``agentrt.tool.name`` is set). A step rebuilt after a restart replays its
``step.decided``, so it is classified the same way.
"""

from __future__ import annotations

from agentrt_otel.records import AttributeValue

__all__ = ["add_semantic_attributes"]

GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_CONVERSATION = "gen_ai.conversation.id"
GEN_AI_TOOL = "gen_ai.tool.name"
GEN_AI_MODEL = "gen_ai.request.model"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
OPENINFERENCE_KIND = "openinference.span.kind"


def _tool_name(attrs: dict[str, AttributeValue]) -> AttributeValue | None:
    name = attrs.get("agentrt.tool.name")
    if name:
        return name
    return attrs.get("agentrt.decision.tool") or None


def _conversation(attrs: dict[str, AttributeValue], run_id: str) -> None:
    attrs[GEN_AI_CONVERSATION] = run_id


def add_semantic_attributes(name: str, attrs: dict[str, AttributeValue], run_id: str) -> None:
    """Add the convention keys for a span called ``name`` to its ``attrs``."""
    if name == "agentrt.step":
        tool = attrs.get("agentrt.decision.kind") == "tool_call" or "agentrt.tool.name" in attrs
        if tool:
            attrs[GEN_AI_OPERATION] = "execute_tool"
            tool_name = _tool_name(attrs)
            if tool_name is not None:
                attrs[GEN_AI_TOOL] = tool_name
            _conversation(attrs, run_id)
            attrs[OPENINFERENCE_KIND] = "TOOL"
        else:
            attrs[OPENINFERENCE_KIND] = "CHAIN"
    elif name == "agentrt.model":
        attrs[GEN_AI_OPERATION] = "chat"
        model = attrs.get("agentrt.model.name")
        if model:
            attrs[GEN_AI_MODEL] = model
        for ours, theirs in (
            ("agentrt.model.input_tokens", GEN_AI_INPUT_TOKENS),
            ("agentrt.model.output_tokens", GEN_AI_OUTPUT_TOKENS),
        ):
            value = attrs.get(ours)
            if value is not None:
                attrs[theirs] = value
        _conversation(attrs, run_id)
        attrs[OPENINFERENCE_KIND] = "LLM"
    elif name == "agentrt.run":
        attrs[GEN_AI_OPERATION] = "invoke_agent"
        _conversation(attrs, run_id)
        attrs[OPENINFERENCE_KIND] = "AGENT"
    elif name == "agentrt.approval":
        attrs[OPENINFERENCE_KIND] = "GUARDRAIL"
    elif name == "agentrt.tool.late":
        attrs[GEN_AI_OPERATION] = "execute_tool"
        tool_name = attrs.get("agentrt.tool.name")
        if tool_name:
            attrs[GEN_AI_TOOL] = tool_name
        _conversation(attrs, run_id)
        attrs[OPENINFERENCE_KIND] = "TOOL"

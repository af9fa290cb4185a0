"""The tool-using agent loop: ask the model, run the tools it calls, repeat.

Every step is reported as a protocol event through ``emit`` as soon as it
happens, so the host can stream progress into the chat.  The loop stops
when the model answers without calling a tool, when it asks its chat a
question (``ask_user``: ``stop_reason="asked_user"``), or after
``limits.max_turns`` model calls (``stop_reason="max_turns"``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec

from . import envelopes
from .conversation import build_messages, build_system_prompt
from .protocol import (
    AssistantEvent,
    ContainerInput,
    Event,
    KnownEnvelope,
    ResultEvent,
    ThinkingEvent,
    ToolResultEvent,
    ToolUseEvent,
    Usage,
    envelope_to_dict,
)
from .providers.base import (
    ContentBlock,
    Provider,
    ProviderMessage,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from .text_stream import DeltaCoalescer
from .tools import ToolContext, ToolOutcome, disabled_tools, run_tool, tool_specs
from .workspace_notices import workspace_notices

log = logging.getLogger(__name__)

Emit = Callable[[Event], None]
MAX_TURNS_STOP_REASON = "max_turns"
# The run ended by asking its chat a question (``ask_user``).
ASKED_STOP_REASON = "asked_user"


def _emit_content(block: ContentBlock, emit: Emit) -> None:
    if isinstance(block, TextBlock) and block.text.strip():
        emit(AssistantEvent(text=block.text))
    elif isinstance(block, ThinkingBlock) and block.thinking.strip():
        emit(ThinkingEvent(text=block.thinking))
    elif isinstance(block, ToolUseBlock):
        emit(ToolUseEvent(id=block.id, name=block.name, input=block.input))


def envelope_for(call: ToolUseBlock, outcome: ToolOutcome) -> KnownEnvelope:
    """The tool's own envelope when it succeeded, else a generic TOOL_CALL one."""
    if outcome.envelope is not None and not outcome.is_error:
        return outcome.envelope
    return envelopes.tool_call(call.name, call.input, outcome.output, is_error=outcome.is_error)


def _run_tool_call(call: ToolUseBlock, ctx: ToolContext, emit: Emit) -> ToolResultBlock | None:
    """Run one call and emit its result; None for a question asked (``ask_user``): the
    question goes out instead, and its answer is the call's result, in a later run."""
    log.info("tool %s (%s)", call.name, call.id)
    outcome = run_tool(call.name, call.input, ctx)
    if outcome.question is not None:
        emit(msgspec.structs.replace(outcome.question, tool_use_id=call.id))
        return None
    emit(
        ToolResultEvent(
            tool_use_id=call.id,
            name=call.name,
            output=outcome.output,
            exit_code=outcome.exit_code,
            is_error=outcome.is_error,
            envelope=envelope_to_dict(envelope_for(call, outcome)),
        )
    )
    return ToolResultBlock(
        tool_use_id=call.id,
        content=outcome.output,
        is_error=outcome.is_error,
        exit_code=outcome.exit_code,
    )


def run_agent(inp: ContainerInput, provider: Provider, emit: Emit, *, workspace: Path) -> ResultEvent:
    """Run the conversation to its end; emit every event, the ``ResultEvent`` last.

    Provider failures propagate as :class:`agent_runner.errors.ProviderError`;
    tool failures do not (they become error tool results for the model).
    """
    system = build_system_prompt(inp, workspace, workspace_notices(workspace))
    messages = build_messages(inp.messages, workspace)
    ctx = ToolContext(
        workspace=workspace,
        limits=inp.limits,
        chat_jid=inp.chat_jid,
        send_targets=frozenset(inp.send_targets),
        emit=emit,
        disabled=disabled_tools(inp.tools),
        tasks=tuple(inp.tasks) if isinstance(inp.tasks, list) else (),
    )
    tools = tool_specs(ctx.disabled)

    usage = Usage()
    stop_reason: str | None = None
    turns = 0
    # Text as the model writes it, coalesced (text_stream.py); each turn's
    # complete blocks follow as AssistantEvents, and those are what is stored.
    deltas = DeltaCoalescer(emit)
    while turns < inp.limits.max_turns:
        response = provider.complete(system, messages, tools, on_text=deltas.sink(f"{turns + 1}."))
        deltas.flush()
        turns += 1
        usage = Usage(
            input_tokens=usage.input_tokens + response.usage.input_tokens,
            output_tokens=usage.output_tokens + response.usage.output_tokens,
            cache_read_input_tokens=usage.cache_read_input_tokens + response.usage.cache_read_input_tokens,
            cache_creation_input_tokens=usage.cache_creation_input_tokens + response.usage.cache_creation_input_tokens,
        )
        stop_reason = response.stop_reason
        for block in response.content:
            _emit_content(block, emit)
        messages.append(ProviderMessage("assistant", list(response.content)))

        calls = response.tool_uses()
        if not calls:
            break
        # Run the calls even on the last allowed turn: the model asked for
        # their side effects; it just will not see the results.
        ran = [_run_tool_call(c, ctx, emit) for c in calls]
        results: list[ToolResultBlock] = [r for r in ran if r is not None]
        messages.append(ProviderMessage("user", list(results)))
        if len(results) < len(ran):
            # A question was asked: the run ends; its answer comes in a later run.
            stop_reason = ASKED_STOP_REASON
            break
        if turns >= inp.limits.max_turns:
            log.warning("stopping after max_turns=%d with tool results pending", turns)
            stop_reason = MAX_TURNS_STOP_REASON

    result = ResultEvent(
        usage=usage,
        session_id=inp.session_id or str(uuid.uuid4()),
        stop_reason=stop_reason,
        num_turns=turns,
    )
    emit(result)
    return result

"""Types every tool shares: its context, its outcome, and small input helpers.

Kept apart from the registry (``tools/__init__``) so that tool modules can
import them without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..protocol import KnownEnvelope, Limits, QuestionEvent, TaskInfo
from ..providers.base import ToolSpec

# Exit codes for calls that never ran or failed, borrowed from shell conventions.
EXIT_FAILED = 1  # the call ran into the state of the files (not found, not unique, outside)
EXIT_BAD_INPUT = 2  # the input itself is wrong (missing field, wrong type, invalid regex)
EXIT_FAILED_TO_START = 126
EXIT_UNKNOWN_TOOL = 127


@dataclass
class RunState:
    """Mutable state that lives for one run and is shared by all tool calls."""

    # The latest list given to ``todo_write``: dicts with id, content, status.
    todos: list[dict[str, str]] = field(default_factory=list)
    # ``ask_user`` asked its question: one per run (the run ends with it).
    asked: bool = False


@dataclass(frozen=True)
class ToolContext:
    """What every tool may depend on, passed down from ``__main__``."""

    workspace: Path
    limits: Limits
    state: RunState = field(default_factory=RunState)
    # For send_message: this run's chat, the other chats it may post to, and
    # the event sink (None outside a run: the tool then refuses; send_file too).
    chat_jid: str = ""
    send_targets: frozenset[str] = frozenset()
    emit: Callable[[Any], None] | None = None
    # The optional tools (protocol.OPTIONAL_TOOLS) this run is not offered: refused like
    # an unknown tool (``tools.offered`` makes it from ContainerInput.tools).
    disabled: frozenset[str] = frozenset()
    # The scheduled tasks this run may manage, as the host gave them (list_tasks answers them).
    tasks: tuple[TaskInfo, ...] = ()


@dataclass(frozen=True)
class ToolOutcome:
    output: str
    exit_code: int
    # True when the call did not do what was asked (unknown tool, bad input,
    # spawn failure, a file tool's refusal).  A bash command that ran and
    # exited non-zero, or timed out (124, with a note in the output), is a
    # normal result the model reads like a shell user.
    is_error: bool = False
    # A structured envelope for the host (built by ``agent_runner.envelopes``);
    # None lets the loop fall back to a TOOL_CALL envelope.
    envelope: KnownEnvelope | None = None
    # ``ask_user``'s question (its ``tool_use_id`` filled in by the caller, which knows the
    # call): emitted instead of a result, and the run ends; the answer comes in a later run.
    question: QuestionEvent | None = None


ToolFn = Callable[[Mapping[str, Any], ToolContext], ToolOutcome]


@dataclass(frozen=True)
class Tool:
    spec: ToolSpec
    run: ToolFn


def bad_input(tool: str, problem: str) -> ToolOutcome:
    return ToolOutcome(f"{tool}: {problem}", EXIT_BAD_INPUT, True)


def failed(tool: str, problem: str) -> ToolOutcome:
    return ToolOutcome(f"{tool}: {problem}", EXIT_FAILED, True)


def str_arg(
    args: Mapping[str, Any], key: str, tool: str, *, required: bool = True, allow_empty: bool = False
) -> str | None | ToolOutcome:
    """``args[key]`` as a string; None when optional and absent; an error outcome otherwise."""
    value = args.get(key)
    if value is None:
        return bad_input(tool, f"input needs a string {key!r}") if required else None
    if not isinstance(value, str):
        return bad_input(tool, f"{key!r} must be a string, not {type(value).__name__}")
    if not allow_empty and not value.strip():
        return bad_input(tool, f"{key!r} must not be empty")
    return value


def int_arg(args: Mapping[str, Any], key: str, tool: str, default: int) -> int | ToolOutcome:
    """``args[key]`` as an integer >= 1, or ``default`` when absent."""
    value = args.get(key)
    if value is None:
        return default
    # bool is an int subclass, but ``true`` is never a meaningful count.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return bad_input(tool, f"{key!r} must be an integer >= 1, got {value!r}")
    return value


def cut_utf8(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` that fits in ``max_bytes`` of UTF-8."""
    encoded = text.encode("utf-8")
    if len(encoded) <= max_bytes:
        return text
    return encoded[:max_bytes].decode("utf-8", errors="ignore")

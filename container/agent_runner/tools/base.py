"""Types every tool shares: its context, its outcome, its arguments' decode.

Kept apart from the registry (``tools/__init__``) so that tool modules can
import them without importing each other.

A tool's arguments are a :class:`ToolArgs` Struct: the shape, the types and the bounds a
call must have, decoded once by :func:`decode_args` before the tool runs, so a tool's own
code starts from typed values and only checks what depends on the files or the run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar, get_args, get_type_hints

import msgspec
from msgspec import Meta

from ..protocol import KnownEnvelope, Limits, QuestionEvent, TaskInfo, literal_choices
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


def bad_input(tool: str, problem: str) -> ToolOutcome:
    return ToolOutcome(f"{tool}: {problem}", EXIT_BAD_INPUT, True)


def failed(tool: str, problem: str) -> ToolOutcome:
    return ToolOutcome(f"{tool}: {problem}", EXIT_FAILED, True)


class _NonBlank:
    """The mark of a string argument that must have words (see :data:`NonBlank`)."""


_NON_BLANK = _NonBlank()
# A string with something in it besides white space: a path, a command, a message.
# msgspec has no such bound, so :meth:`ToolArgs.__post_init__` checks the marked fields.
NonBlank = Annotated[str, _NON_BLANK]
# A count or a position: a whole number from 1 (``true`` is no count: msgspec refuses bools).
Count = Annotated[int, Meta(ge=1)]


class ToolArgs(msgspec.Struct):
    """A tool's arguments.  Unknown keys are ignored unless a tool's Struct forbids them."""

    def __post_init__(self) -> None:
        # A ValueError here becomes msgspec's ValidationError, with where it was.
        for name in _non_blank_fields(type(self)):
            value = getattr(self, name)
            if isinstance(value, str) and not value.strip():
                raise ValueError(f"{name!r} must not be empty")


def _marked(hint: Any) -> bool:
    return _NON_BLANK in getattr(hint, "__metadata__", ()) or any(_marked(arg) for arg in get_args(hint))


@cache
def _non_blank_fields(args_type: type[ToolArgs]) -> tuple[str, ...]:
    hints = get_type_hints(args_type, include_extras=True)
    return tuple(name for name in args_type.__struct_fields__ if _marked(hints[name]))


A = TypeVar("A", bound=ToolArgs)


@dataclass(frozen=True)
class Tool(Generic[A]):
    spec: ToolSpec
    args: type[A]
    run: Callable[[A, ToolContext], ToolOutcome]


def decode_args(tool: str, args: Mapping[str, Any], args_type: type[A]) -> A | ToolOutcome:
    """The model's arguments as ``args_type``, or the refusal it can read and correct."""
    # JSON null stands for an argument left out: models send it for optional ones.
    given = {key: value for key, value in args.items() if value is not None}
    try:
        return msgspec.convert(given, args_type)
    except msgspec.ValidationError as exc:
        return bad_input(tool, _explain(str(exc), args_type))


_WHERE = re.compile(r" - at `(?P<loc>\$[^`]*)`$")


def _explain(problem: str, args_type: type[ToolArgs]) -> str:
    """msgspec's message, with the allowed words added when a word is not one of them."""
    where = _WHERE.search(problem)
    if not problem.startswith("Invalid enum value") or where is None:
        return problem
    choices = literal_choices(args_type, where["loc"])
    return f"{problem}; expected one of {', '.join(map(str, choices))}" if choices else problem


def cut_utf8(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` that fits in ``max_bytes`` of UTF-8."""
    encoded = text.encode("utf-8")
    if len(encoded) <= max_bytes:
        return text
    return encoded[:max_bytes].decode("utf-8", errors="ignore")

"""The run's events: one JSON object per line the runner writes on stdout.

Each event's JSON carries its kind in ``"type"`` (the Struct's tag): what the model
says and does, what the agent asks of the host (messages, files, tasks, questions, edits,
reactions), and the run's end (:class:`ResultEvent` or :class:`ErrorEvent`).  A line
that does not parse as an event is reported by the host and skipped, never fatal.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import msgspec
from msgspec import Meta, field

from .base import ENCODER, JsonObject, Model
from .input import ContextMode, ScheduleKind

TaskAction = Literal["create", "update", "pause", "resume", "cancel"]


class Usage(Model):
    input_tokens: int = 0  # every prompt token, cache reads and writes included
    output_tokens: int = 0
    # The part of ``input_tokens`` read from or written to Anthropic's prompt
    # cache (priced apart: orchestrator/model/pricing.py); 0 when not reported.
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


class _Event(Model, tag_field="type"):
    # Each event's JSON carries its kind in "type" (the struct's tag).

    @property
    def type(self) -> str:
        return str(self.__struct_config__.tag)


class AssistantEvent(_Event, tag="assistant"):
    """Text the model says to the chat."""

    text: str


class TextDeltaEvent(_Event, tag="text_delta"):
    """Text of the answer being written, for people to watch (never stored).

    ``block`` names the text block within the run (the model call and the
    block's place in its answer, e.g. ``"3.0"``); ``text`` continues what
    the block's earlier deltas said.  The block's :class:`AssistantEvent`
    follows with the whole text, and that is what the host keeps.
    """

    block: str
    text: str


class ThinkingEvent(_Event, tag="thinking"):
    text: str


class ToolUseEvent(_Event, tag="tool_use"):
    id: str
    name: str
    input: JsonObject


class ToolResultEvent(_Event, tag="tool_result"):
    tool_use_id: str
    name: str
    output: str
    exit_code: int
    is_error: bool = False
    # A structured view of the call for the host to keep in the stored
    # message's metadata: an envelope (protocol/envelopes.py, built by ``agent_runner.envelopes``)
    # in its wire form (:func:`envelope_to_dict`).  A plain object on
    # purpose: the host validates it with :func:`envelope_from_dict` on its
    # own, so an envelope that is malformed, or of a newer type, costs the
    # envelope, never the tool result (a typed field would refuse the whole
    # line).  None from runners that predate envelopes.
    envelope: JsonObject | None = None


class SendMessageEvent(_Event, tag="send_message"):
    """The agent posts ``text`` into ``chat_jid`` during the run (its own chat,
    or, for the main group, any registered chat).  The host authorizes it."""

    chat_jid: str
    text: str


class SendFileEvent(_Event, tag="send_file"):
    """The agent hands its chat the workspace file at ``path`` (relative to the workspace),
    with an optional ``caption``.  The host reads the file by its hostile-folder rules (no
    link followed, a regular file, bounded), stores it and posts it as a FILE message."""

    path: Annotated[str, Meta(min_length=1, max_length=4096)]
    caption: str = ""


class TaskEvent(_Event, tag="task"):
    """The agent asks the host to create, change, pause, resume or cancel a scheduled task.
    The host decides (its group's tasks only, the main group's any group's; the schedule
    checked; the group's cap and the minimum interval) and says in the chat what it did."""

    action: TaskAction
    task_id: str | None = None  # update, pause, resume, cancel: the task (an id or its prefix)
    chat_jid: str | None = None  # create: the group it is for (None: the run's own)
    prompt: str | None = None
    kind: ScheduleKind | None = None
    spec: str | None = None
    context_mode: ContextMode | None = None


class QuestionEvent(_Event, tag="question"):
    """The agent asks its group (``ask_user``) and its run ends: the answer comes back as the
    result of the call ``tool_use_id`` (the built-in loop's next run), or as the next message
    (Claude Code).  The host checks the question and its options again (the limits above)."""

    tool_use_id: str
    question: str
    options: list[str]
    multiple: bool = False
    allow_other: bool = False


class EditEvent(_Event, tag="edit"):
    """The agent asks the host to change the words of one of its own earlier messages in this
    chat (``nth_last``: 1 for its latest), on every channel that shows it.  The host finds the
    message itself (the agent's own, in this group, not superseded) and says in the chat when
    it cannot."""

    text: str
    nth_last: int = 1


class ReactEvent(_Event, tag="react"):
    """The agent puts ``emoji`` (one of :data:`REACTIONS`) on a person's message of this chat
    (``nth_last``: 1 for the latest), on every channel that shows it.  The host finds the
    message itself and says in the chat when it cannot."""

    emoji: str
    nth_last: int = 1


class KeepEvent(_Event, tag="keep"):
    """The runner's own process that a warm container keeps between runs (the Claude Code CLI
    of the group's live session): its ``pid`` in the container and its ``started`` time (field
    22 of ``/proc/PID/stat``, clock ticks after boot).  The host's clean-up after the run spares
    it only if it is still that process (that pid, started then), and never under gVisor,
    where the agent can write to the runner's streams."""

    pid: Annotated[int, Meta(ge=2)]
    started: Annotated[int, Meta(ge=0)]


class ResultEvent(_Event, tag="result"):
    """Always the last event of a successful run."""

    usage: Usage = field(default_factory=Usage)
    session_id: str | None = None
    stop_reason: str | None = None
    num_turns: int = 0


class ErrorEvent(_Event, tag="error"):
    """The run failed inside the container; ``retryable`` marks transient causes."""

    message: str
    retryable: bool = False


Event = Union[
    AssistantEvent,
    TextDeltaEvent,
    ThinkingEvent,
    ToolUseEvent,
    ToolResultEvent,
    SendMessageEvent,
    SendFileEvent,
    TaskEvent,
    QuestionEvent,
    EditEvent,
    ReactEvent,
    KeepEvent,
    ResultEvent,
    ErrorEvent,
]
_EVENT_DECODER: msgspec.json.Decoder[Event] = msgspec.json.Decoder(Event)


def parse_event(line: str | bytes) -> Event:
    """Parse one stdout line; raises :data:`ProtocolError` on garbage."""
    return _EVENT_DECODER.decode(line)


def dump_event(event: Event) -> str:
    """Serialize one event as a single line (no trailing newline)."""
    return ENCODER.encode(event).decode()

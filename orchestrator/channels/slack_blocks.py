"""How a message looks on Slack: Block Kit, its text escaped, cut to Slack's sizes.

:func:`slack_posts` turns one :class:`~orchestrator.model.render.RenderedMessage`
into the ``chat.postMessage`` bodies that show it (one, or several for a long
message), each a notification ``text`` and its ``blocks``:

* an assistant's reply: its text as sections (the bot's own name is on the post);
* a person's message mirrored from another channel: ``*name*: text``;
* a CODE_EDIT: who edited what, then each file's unified diff in a code block;
* a TODO: a checklist (⬜ pending, 🔄 in progress, ✅ done and struck through);
* a tool call, a tool's result, the agent's tool use and thinking: context
  blocks (Slack's small grey print), so the work is visible but not the reply;
* host (🏠) and system (⚙️) messages: context blocks too, set apart from what
  people and the agent say;
* a question (an APPROVAL envelope: ``run/questions.py``): its text and an ``actions``
  block with a button per option, labelled with the option (within Slack's 75
  characters, which the host holds options to), its ``action_id``
  ``q:<question id>:<index>`` (``channels/question_buttons.py``; the clicks come back
  through ``channels/slack_clicks.py``).  A multiple choice's button picks one option; a
  context line says how to pick several.  The notification text is the message's words,
  the question with its numbered options, for a client that shows no blocks.

Everything drawn is hostile (the agent's output, a person's words from another
channel): ``&``, ``<`` and ``>`` are escaped in every piece of text sent
(:func:`escape`), so no text can become ``<!channel>``, ``<!here>``, a user
mention or a link whose label hides its target; posts never ask Slack to turn
plain ``@names`` into mentions (``link_names`` is left off).

Sizes: a section's (or a context element's) text is at most 3,000 characters
and a message at most 50 blocks; a long message is cut at line breaks where one
is near (never inside an escape), and a post carries at most
:data:`POST_CHARS` of text, so a 100 KB reply is a handful of posts, in order.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agent_runner.protocol import ApprovalPayload
from orchestrator.channels.question_buttons import approval_of, button_id
from orchestrator.core.errors import InvalidMessageMetadata
from orchestrator.core.jsontypes import JsonObject
from orchestrator.model.envelopes import (
    CODE_EDIT,
    TEXT,
    TODO,
    TOOL_CALL,
    CodeEditPayload,
    TodoPayload,
    ToolCallPayload,
    parse_message_metadata,
)
from orchestrator.model.render import RenderedMessage, render_code_edit, render_tool_call

SECTION_LIMIT = 3000  # Slack's limit on a section's text and a context element's
BLOCKS_PER_POST = 50  # Slack's limit on a message's blocks
POST_CHARS = 12_000  # our own: the text one post carries, so a long reply is several readable posts
FALLBACK_LIMIT = 3000  # the notification text (what a phone shows) is a summary, not the whole
_FENCE = "```"
CONTINUED = "(continued)"  # the notification text of a long message's later posts
TODO_MARKS = {"pending": "⬜", "in_progress": "🔄", "completed": "✅"}
LABEL_LIMIT = 75  # Slack's limit on a button's text
# A question's actions block's id: the clicked message's buttons are found (and taken off) by it.
QUESTION_BLOCK = "q:"

Kind = Literal["section", "context", "code"]


class SlackPost(BaseModel):
    """One ``chat.postMessage``'s content: the notification text and the blocks."""

    model_config = ConfigDict(frozen=True)

    text: str
    blocks: list[JsonObject]


def escape(text: str) -> str:
    """``text`` as literal Slack mrkdwn: the three characters Slack reads as markup escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def unescape(text: str) -> str:
    """What a person wrote, from the escaped text Slack sends (``&amp;`` last: ``&amp;lt;`` is ``&lt;``)."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def split_escaped(text: str, limit: int) -> list[str]:
    """Already-escaped ``text`` in pieces of at most ``limit`` characters, cut after a line
    break in the second half of a piece when there is one, never inside an ``&...;`` escape."""
    pieces: list[str] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + limit)
        if end < len(text):
            newline = text.rfind("\n", start, end)
            if newline != -1 and newline - start >= (end - start) // 2:
                end = newline + 1
            else:
                amp = text.rfind("&", max(start, end - 5), end)
                if amp > start and ";" not in text[amp:end]:
                    end = amp  # "&amp;" cut in two would show as "&am" and "p;"
        pieces.append(text[start:end])
        start = end
    return pieces


def _fenced(code: str) -> str:
    # A fence inside the code would end the block early: break it with a zero-width space.
    return code.replace(_FENCE, "`\u200b``")


def _pieces(kind: Kind, text: str) -> list[tuple[Kind, str]]:
    """The blocks' texts for ``text`` (raw, escaped here), each within Slack's limit."""
    if not text:
        return []
    if kind == "code":
        inner = SECTION_LIMIT - 2 * len(_FENCE) - 2
        return [("code", f"{_FENCE}\n{piece}\n{_FENCE}") for piece in split_escaped(escape(_fenced(text)), inner)]
    return [(kind, piece) for piece in split_escaped(escape(text), SECTION_LIMIT)]


def _block(kind: Kind, text: str) -> JsonObject:
    if kind == "context":
        return {"type": "context", "elements": [{"type": "mrkdwn", "text": text, "verbatim": True}]}
    return {"type": "section", "text": {"type": "mrkdwn", "text": text, "verbatim": True}}


def _checklist(payload: TodoPayload) -> str:
    lines = []
    for item in payload.todos:
        mark = TODO_MARKS.get(item.status, "⬜")
        lines.append(f"{mark} ~{item.content}~" if item.status == "completed" else f"{mark} {item.content}")
    return "\n".join(lines)


def _payload(metadata: JsonObject | None) -> tuple[str | None, Any]:
    try:
        parsed = parse_message_metadata(metadata)
    except InvalidMessageMetadata:
        return None, None  # a legacy row that no longer validates: its text is shown
    return parsed.message_type, parsed.payload


def _is_reply(rendered: RenderedMessage) -> bool:
    """The agent's words (drawn under the bot's own name): an assistant_text part, or a
    result_meta record stored as a reply.  That record may be stored either way, and its
    part does not say which (``render`` draws it by its stored type as well)."""
    part = rendered.part.kind
    return part == "assistant_text" or (part == "result_meta" and rendered.message_type == "assistant")


def message_pieces(rendered: RenderedMessage) -> list[tuple[Kind, str]]:
    """What the message is drawn as, by its part (see the module's doc)."""
    kind, payload = _payload(rendered.metadata)
    name = rendered.sender_name or rendered.sender
    reply, part = _is_reply(rendered), rendered.part.kind
    if kind == TOOL_CALL and isinstance(payload, ToolCallPayload) and (reply or part in ("thinking", "tool_use")):
        return _pieces("context", render_tool_call(payload))
    # Only people's and the agent's words are sections; all else (and any tool call) is small print.
    if not (reply or part == "user_text") or kind == TOOL_CALL:
        return _pieces("context", rendered.text)
    said_by = "" if reply else f"{name}: "
    if kind == CODE_EDIT and isinstance(payload, CodeEditPayload):
        files = ", ".join(edit.file_path for edit in payload.edits)
        return [*_pieces("section", f"{said_by}✏️ edited {files}"), *_pieces("code", render_code_edit(payload))]
    if kind == TODO and isinstance(payload, TodoPayload):
        return [*_pieces("section", f"{said_by}📋 to do"), *_pieces("section", _checklist(payload))]
    if reply:
        return _pieces("section", rendered.content)
    # A person's message from another channel, shown as the other channels show it.
    return _pieces("section", rendered.text)


def _fallback(rendered: RenderedMessage) -> str:
    kind, _ = _payload(rendered.metadata)
    plain_reply = _is_reply(rendered) and kind in (None, TEXT)
    # A reply's notification is its words: the bot's name is on the post already.
    text = escape(rendered.content if plain_reply else rendered.text)
    if len(text) <= FALLBACK_LIMIT:
        return text
    cut = split_escaped(text, FALLBACK_LIMIT - 1)[0]
    return cut + "…"


def _question_post(asked: ApprovalPayload, fallback: str) -> SlackPost:
    """A question: its text, a button per option (see the module's doc)."""
    blocks = [_block("section", piece) for piece in split_escaped(escape(asked.question), SECTION_LIMIT)]
    buttons = [
        {
            "type": "button",
            # plain_text: no markup to escape; Slack shows it as it is.
            "text": {"type": "plain_text", "text": option[:LABEL_LIMIT], "emoji": True},
            "action_id": button_id(asked.question_id, i),
            "value": str(i),
        }
        for i, option in enumerate(asked.options)
    ]
    blocks.append({"type": "actions", "block_id": QUESTION_BLOCK + asked.question_id, "elements": buttons})
    if asked.multiple:
        blocks.append(_block("context", "Several? Reply with their numbers, separated by commas."))
    return SlackPost(text=fallback, blocks=blocks)


def slack_posts(rendered: RenderedMessage) -> list[SlackPost]:
    """The posts that show ``rendered`` on Slack, in order (at least one)."""
    asked = approval_of(rendered.metadata)
    if asked is not None:
        return [_question_post(asked, _fallback(rendered) or " ")]
    pieces = message_pieces(rendered) or [("section", escape(rendered.text) or " ")]
    fallback = _fallback(rendered) or " "
    posts: list[SlackPost] = []
    blocks: list[JsonObject] = []
    size = 0
    for kind, text in pieces:
        if blocks and (len(blocks) >= BLOCKS_PER_POST or size + len(text) > POST_CHARS):
            posts.append(SlackPost(text=fallback, blocks=blocks))
            blocks, size = [], 0
            fallback = CONTINUED  # one notification's summary is enough
        blocks.append(_block(kind, text))
        size += len(text)
    posts.append(SlackPost(text=fallback, blocks=blocks))
    return posts

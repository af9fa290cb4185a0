"""The model's view of the one message store.

``format_messages_for_sdk`` is the list of typed messages a run hands to the
container.  Host messages, stored-only records and superseded messages never
appear in it; user messages may be expanded with their context blocks
(``expand``) while the stored text stays as typed.  What people see, the
display view, is what the store reads by default (superseded messages left
out; ``orchestrator.store.message_log``), and on text channels what
``orchestrator.model.render.displayed`` lets through.

Earlier runs' tool calls come back as the model made them: a stored
``tool_use`` record (kept for the record, not shown to people) joins the
view as an assistant message carrying the call (:class:`SdkToolUse`) when,
and only when, the view also holds the ``tool_result`` that answers it (same
run, same id, after it); that result then names the call (``tool_use_id``).
Everything else stays as before: a call whose result is not in the view
(cut off by the window, superseded, never answered) is left out, and a
result without its call (rows stored as ``command_output``, a call cut off)
is plain tool-result text.  A provider rejects an unmatched pair, so the
pairing is decided here, once, from the stored rows; the runner checks it
again (``agent_runner.conversation``).  Thinking stays out.

:func:`fit_budget` keeps a view within a token budget by dropping its oldest
whole turns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent_runner.protocol import SdkMessage, SdkToolUse
from orchestrator.model.envelopes import with_file_line
from orchestrator.model.messages import StoredMessage
from orchestrator.model.parts import RUN_ID_KEY as RUN_ID_KEY
from orchestrator.model.parts import ToolResult, ToolUse

REPLY_TO_KEY = "reply_to_seq"


def model_order(m: StoredMessage) -> tuple[int, int, int]:
    """Sort key of the model's view: by seq, except that a run's outputs sit
    right after the last input that run saw.

    A message that arrives while a run is answering gets a seq between the
    run's replies; the model must still see question, answer, next question.
    """
    reply_to = (m.metadata or {}).get(REPLY_TO_KEY)
    if isinstance(reply_to, int) and reply_to < m.seq:
        return (reply_to, 1, m.seq)
    return (m.seq, 0, m.seq)


# A call and its result pair by (run, call id): ids are unique within a run, not across
# runs (the offline model numbers its calls).
_Key = tuple[str | None, str | None]


def _call_of(m: StoredMessage) -> tuple[SdkToolUse, _Key] | None:
    """The tool call a stored ``tool_use`` record holds, if it is a well-formed one, and its key."""
    part = m.part
    if not isinstance(part, ToolUse) or part.call is None:
        return None
    return part.call, (part.run_id, part.call.id)


def counts_in_view(m: StoredMessage) -> bool:
    """Whether ``m`` may appear in the model's view (and so counts toward its window):
    what the model sees, and tool calls, which join it when their result does."""
    if m.superseded_at is not None:
        return False
    return m.visible_to_model or _call_of(m) is not None


def _matched(ordered: list[StoredMessage]) -> set[_Key]:
    """The (run, id) keys with exactly one call and, after it, exactly one result."""
    calls: Counter[_Key] = Counter()
    results: Counter[_Key] = Counter()
    first_call: dict[_Key, int] = {}
    last_result: dict[_Key, int] = {}
    for i, m in enumerate(ordered):
        if (found := _call_of(m)) is not None:
            key = found[1]
            calls[key] += 1
            first_call.setdefault(key, i)
        elif isinstance(part := m.part, ToolResult):
            key = (part.run_id, part.tool_use_id)
            results[key] += 1
            last_result[key] = i
    return {k for k, n in calls.items() if n == 1 and results[k] == 1 and first_call[k] < last_result[k]}


@dataclass(frozen=True)
class ViewItem:
    """One message of the view and the stored row it comes from."""

    source: StoredMessage
    message: SdkMessage


def _words(m: StoredMessage, expand: Callable[[StoredMessage], str] | None) -> str:
    """What the model reads of ``m``: its text (expanded, if ``expand``), then its files
    named on a line of their own (where they are is the run's notice: run/run_files.py)."""
    return with_file_line(expand(m) if expand is not None else m.content, m.metadata)


def model_view(
    messages: Iterable[StoredMessage], *, expand: Callable[[StoredMessage], str] | None = None
) -> list[ViewItem]:
    """:func:`format_messages_for_sdk`, each message with its stored row."""
    ordered = [m for m in sorted(messages, key=model_order) if counts_in_view(m)]
    matched = _matched(ordered)
    out: list[ViewItem] = []
    for m in ordered:
        part = m.part
        if isinstance(part, ToolUse):
            found = _call_of(m)
            if found is None or found[1] not in matched:
                continue
            out.append(
                ViewItem(
                    m,
                    SdkMessage(
                        role="assistant",
                        content=m.content,
                        sender_name=m.sender_name or None,
                        timestamp=m.timestamp,
                        tool_use=found[0],
                    ),
                )
            )
            continue
        message = SdkMessage(
            role=m.message_type,  # type: ignore[arg-type]  # host was filtered above
            content=_words(m, expand if part.kind == "user_text" else None),
            sender_name=m.sender_name or None,
            timestamp=m.timestamp,
        )
        if isinstance(part, ToolResult):
            # The model needs the exit code to know whether a command worked (as stored:
            # a recorded input rebuilds from history the same).
            message = message.replace(metadata={"exit_code": (m.metadata or {}).get("exit_code")})
            if part.tool_use_id is not None and (part.run_id, part.tool_use_id) in matched:
                message = message.replace(tool_use_id=part.tool_use_id)
        out.append(ViewItem(m, message))
    return out


def format_messages_for_sdk(
    messages: Iterable[StoredMessage], *, expand: Callable[[StoredMessage], str] | None = None
) -> list[SdkMessage]:
    """The model's view of ``messages``: in conversation order, host messages filtered out.

    ``expand`` gives a user message's text as the model should read it (with
    its context blocks); without it the stored content is used.
    """
    return [item.message for item in model_view(messages, expand=expand)]


def estimate_tokens(message: SdkMessage) -> int:
    """A cheap, deterministic guess at what ``message`` costs the model: its JSON
    bytes / 4 (as the gateway guesses a request it has no usage for).  On the
    high side for English and JSON, which is the side a budget wants."""
    return (len(message.to_json()) + 3) // 4


@dataclass(frozen=True)
class Fitted:
    """A view cut to a budget: what is kept, and how much of the oldest was left out."""

    messages: list[SdkMessage]
    dropped_messages: int = 0
    dropped_tokens: int = 0


def _turn_starts(items: list[ViewItem]) -> list[int]:
    """Where whole turns start: at each user or system message, and at 0.

    A turn (a question and everything that answered it, tool calls and their
    results included) is dropped whole, so a call never loses its result.
    """
    return [i for i, item in enumerate(items) if i == 0 or item.message.role in ("user", "system")]


def fit_budget(
    items: list[ViewItem],
    keep_seqs: set[int],
    budget: int,
    *,
    expand: Callable[[StoredMessage], str] | None = None,
) -> Fitted:
    """The view ``items`` within ``budget`` tokens (:func:`estimate_tokens`), oldest turns dropped first.

    The turn holding the first message whose seq is in ``keep_seqs`` (the
    run's batch) and everything after it are always kept, even over budget.
    ``expand`` (see :func:`model_view`) is applied to the user messages that
    are kept, newest turn first, and only to them: context blocks of turns
    the budget leaves out are never read (files) nor fetched (URLs).  What
    is left out is counted unexpanded.  Deterministic from the items, the
    expansions and the budget, so a recorded input rebuilds.
    """
    messages = [item.message for item in items]

    def cost(i: int) -> int:
        if expand is not None and messages[i].role == "user":
            messages[i] = messages[i].replace(content=_words(items[i].source, expand))
        return estimate_tokens(messages[i])

    first_kept = next((i for i, item in enumerate(items) if item.source.seq in keep_seqs), len(items))
    # Where the view may start: a turn boundary no later than the batch's turn.
    starts = [s for s in _turn_starts(items) if s <= first_kept] or [0]
    cut = starts[-1]
    total = sum(cost(i) for i in range(cut, len(items)))
    # Older turns, newest first, while they fit (every cost is >= 0, so the
    # first turn that does not fit is where the view starts).
    for start, end in reversed(list(zip(starts, starts[1:], strict=False))):
        turn = sum(cost(i) for i in range(start, end))
        if total + turn > budget:
            break
        total += turn
        cut = start
    return Fitted(
        messages=messages[cut:],
        dropped_messages=cut,
        dropped_tokens=sum(estimate_tokens(m) for m in messages[:cut]),
    )

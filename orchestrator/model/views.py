"""The model's view of the one message store.

``format_messages_for_sdk`` is the list of typed messages a run hands to the
container.  Host messages, stored-only records and superseded messages never
appear in it; user messages may be expanded with their context blocks
(``expand``) while the stored text stays as typed.  What people see, the
display view, is what the store reads by default (superseded messages left
out; ``orchestrator.store.message_log``), and on text channels what
``orchestrator.model.render.displayed`` lets through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from agent_runner.protocol import SdkMessage

from orchestrator.model.messages import StoredMessage

REPLY_TO_KEY = "reply_to_seq"
# Which run produced an output (regenerate finds the run to redo by it).
RUN_ID_KEY = "run_id"


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


def format_messages_for_sdk(
    messages: Iterable[StoredMessage], *, expand: Callable[[StoredMessage], str] | None = None
) -> list[SdkMessage]:
    """The model's view of ``messages``: in conversation order, host messages filtered out.

    ``expand`` gives a user message's text as the model should read it (with
    its context blocks); without it the stored content is used.
    """
    out: list[SdkMessage] = []
    for m in sorted(messages, key=model_order):
        if not m.visible_to_model or m.superseded_at is not None:
            continue
        metadata = None
        if m.message_type == "tool_result":
            # The model needs the exit code to know whether a command worked.
            metadata = {"exit_code": (m.metadata or {}).get("exit_code")}
        out.append(
            SdkMessage(
                role=m.message_type,  # type: ignore[arg-type]  # host was filtered above
                content=expand(m) if expand and m.message_type == "user" else m.content,
                sender_name=m.sender_name or None,
                timestamp=m.timestamp,
                metadata=metadata,
            )
        )
    return out

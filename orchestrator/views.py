"""Views computed from the one message store.

``format_messages_for_sdk`` is the model's view: the list of typed messages a
run hands to the container.  Host messages and stored-only records never
appear in it.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent_runner.protocol import SdkMessage

from .messages import StoredMessage

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


def format_messages_for_sdk(messages: Iterable[StoredMessage]) -> list[SdkMessage]:
    """The model's view of ``messages``: in conversation order, host messages filtered out."""
    out: list[SdkMessage] = []
    for m in sorted(messages, key=model_order):
        if not m.visible_to_model:
            continue
        metadata = None
        if m.message_type == "tool_result":
            # The model needs the exit code to know whether a command worked.
            metadata = {"exit_code": (m.metadata or {}).get("exit_code")}
        out.append(
            SdkMessage(
                role=m.message_type,  # type: ignore[arg-type]  # host was filtered above
                content=m.content,
                sender_name=m.sender_name or None,
                timestamp=m.timestamp,
                metadata=metadata,
            )
        )
    return out

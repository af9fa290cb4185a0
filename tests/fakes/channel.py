"""A channel that records what it is given (a real Channel implementation,
used where a test needs to see deliveries)."""

from __future__ import annotations

from orchestrator.messages import StoredMessage


class RecordingChannel:
    name = "recorder"

    def __init__(self) -> None:
        self.sent: list[StoredMessage] = []
        self.rendered: list[str] = []

    def connect(self) -> None:
        pass

    def disconnect(self) -> None:
        pass

    def owns(self, chat_jid: str) -> bool:
        return True

    def send(self, message: StoredMessage, rendered: str) -> None:
        self.sent.append(message)
        self.rendered.append(rendered)

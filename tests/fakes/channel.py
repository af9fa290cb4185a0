"""A channel that records what it is given (a real Channel implementation,
used where a test needs to see deliveries)."""

from __future__ import annotations

from orchestrator.channels import BaseChannel
from orchestrator.messages import StoredMessage


class RecordingChannel(BaseChannel):
    name = "recorder"

    def __init__(self) -> None:
        self.sent: list[StoredMessage] = []
        self.rendered: list[str] = []

    def send(self, message: StoredMessage, rendered: str) -> None:
        self.sent.append(message)
        self.rendered.append(rendered)

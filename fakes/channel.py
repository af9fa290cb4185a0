"""Channels for tests (real Channel implementations).

* ``RecordingChannel`` keeps what it is given, in memory (thread-safe);
  ``fail_times`` makes its first sends raise.
* ``FileChannel`` appends each rendered message as a JSON line to
  ``<data dir>/channels/<name>.jsonl``, so a test can read what a worker
  *process* sent; ``plugin`` is its ``ORCHESTRATOR_CHANNEL_PLUGINS`` entry
  (``fakes.channel:plugin``): channels ``mirror-a``, ``mirror-b`` and
  ``flaky`` (fails its first two sends, counted in a file, so across
  processes too).
"""

from __future__ import annotations

import fcntl
import json
import threading
from pathlib import Path

from orchestrator.channels.base import BaseChannel
from orchestrator.core.settings import Settings
from orchestrator.model.render import RenderedMessage
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database


class ChannelDown(RuntimeError):
    pass


class RecordingChannel(BaseChannel):
    def __init__(self, name: str = "recorder", *, fail_times: int = 0) -> None:
        self.name = name
        self.fail_times = fail_times
        self.calls = 0
        self.sent: list[RenderedMessage] = []
        self.addresses: list[str] = []
        self._lock = threading.Lock()

    @property
    def rendered(self) -> list[str]:
        return [m.text for m in self.sent]

    def send(self, address: str, rendered: RenderedMessage) -> None:
        with self._lock:
            self.calls += 1
            if self.calls <= self.fail_times:
                raise ChannelDown(f"{self.name} is down (call {self.calls})")
            self.sent.append(rendered)
            self.addresses.append(address)


def attach_recorder(db: Database, *chat_jids: str, name: str = "recorder") -> RecordingChannel:
    """A recording channel attached to ``chat_jids`` (which must be registered groups)."""
    for jid in chat_jids:
        attach_channel(db, jid, name)
    return RecordingChannel(name)


class FileChannel(BaseChannel):
    def __init__(self, name: str, folder: Path, *, fail_times: int = 0) -> None:
        self.name = name
        self.path = folder / f"{name}.jsonl"
        self._counter = folder / f"{name}.calls"
        self.fail_times = fail_times
        folder.mkdir(parents=True, exist_ok=True)

    def send(self, address: str, rendered: RenderedMessage) -> None:
        with open(self._counter, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)  # prefork children share the count
            fh.seek(0)
            calls = len(fh.read()) + 1
            fh.write(".")
        if calls <= self.fail_times:
            raise ChannelDown(f"{self.name} is down (call {calls})")
        with open(self.path, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.write(json.dumps({"address": address, **rendered.model_dump()}, ensure_ascii=False) + "\n")


def read_file_channel(settings: Settings, name: str) -> list[dict]:
    path = settings.data_dir / "channels" / f"{name}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plugin(settings: Settings) -> list[FileChannel]:
    folder = settings.data_dir / "channels"
    return [
        FileChannel("mirror-a", folder),
        FileChannel("mirror-b", folder),
        FileChannel("flaky", folder, fail_times=2),
    ]

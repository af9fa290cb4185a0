"""What every channel adapter starts from.

A channel has a ``name`` (the registry's key and what a group's attachment
names), may ``connect()``/``disconnect()``, says which addresses it
``owns()``, and ``send()``\\s one :class:`~orchestrator.model.render.RenderedMessage`
to one address, raising on failure and returning its own ids of what it posted
(the port is :class:`orchestrator.run.outbound.Channel`).  ``edit()`` shows a
changed message where those posts are (by default: retracted and sent again)
and ``retract()`` takes them back.  Which channels show a group's
messages is data (``orchestrator/store/attachments.py``); delivery itself
(recorded per message and channel, retried, never twice) is the ledger in
``orchestrator/store/deliveries.py`` worked by
``orchestrator/run/outbound.py``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from agent_runner.protocol import Reaction
from orchestrator.core.errors import ChannelError
from orchestrator.core.settings import Settings
from orchestrator.core.terminal import for_log
from orchestrator.model.render import RenderedMessage
from orchestrator.store.db import Database

# What a sent id of a file's post starts with (a Slack file id, the Telegram message that
# carries a file), beside the ids of the posts of a message's words.
FILE_POST = "file:"


class BaseChannel:
    """Defaults for a channel that needs no connection and can reach any address."""

    name = "base"
    # Whether a send cut short by a deliverer's death is sent again (at least once)
    # rather than given up (at most once): only for a channel whose receiver can tell
    # a resend by its delivery id (``RenderedMessage.delivery_id``; the webhook's header).
    resend_after_crash = False

    def connect(self) -> None:
        pass

    def disconnect(self) -> None:
        pass

    def owns(self, address: str) -> bool:
        return True

    def send(self, address: str, rendered: RenderedMessage) -> list[str] | None:
        raise NotImplementedError

    def edit(self, address: str, posted: list[str], rendered: RenderedMessage) -> list[str]:
        """Show ``rendered`` instead of the posts ``posted``; the ids of its posts now.  A channel
        that cannot change a post in place takes it back and sends the message again."""
        self.retract(address, posted, rendered)
        return self.send(address, rendered) or []

    def react(self, address: str, posted: list[str], rendered: RenderedMessage, reaction: Reaction) -> bool:
        """Put ``reaction`` on the message shown as ``posted``; False: this channel cannot show
        it (the change ends there, with the reason).  A channel without reactions shows none."""
        return False

    def origin_post(self, address: str, message_id: str) -> str | None:
        """This channel's own id of the post a person's message ``message_id`` came from at
        ``address`` (its inbound id names it), or None."""
        return None

    def retract(self, address: str, posted: list[str], rendered: RenderedMessage) -> None:
        """Take back the posts ``posted`` (of the message ``rendered`` shows)."""
        raise ChannelError(f"the {self.name} channel cannot take back what it posted")


class MadeSteps:
    """The posts a call made before it failed, by the call's key (an edit's delivery id, the
    same on every attempt): a retry in this process resumes after them instead of posting
    them twice."""

    def __init__(self) -> None:
        self._made: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def so_far(self, key: str) -> list[str]:
        with self._lock:
            return list(self._made.get(key, []))

    def keep(self, key: str, made: list[str]) -> None:
        with self._lock:
            self._made[key] = list(made)

    def done(self, key: str) -> None:
        with self._lock:
            self._made.pop(key, None)


def file_posts(posted: list[str]) -> tuple[list[str], list[str]]:
    """``posted`` split into the posts of a message's words and those of its files (marked
    :data:`FILE_POST`, the mark taken off): an edit changes the words only."""
    words = [p for p in posted if not p.startswith(FILE_POST)]
    files = [p.removeprefix(FILE_POST) for p in posted if p.startswith(FILE_POST)]
    return words, files


def post_named(message_id: str, prefix: str) -> str | None:
    """The channel's post id an inbound message id ``<prefix><post id>`` names (None: it is
    not of that form: another conversation's, or another channel's)."""
    post = message_id[len(prefix) :] if message_id.startswith(prefix) else ""
    return post or None


class LogChannel(BaseChannel):
    """Writes each message to the log (the worker's console), as one line: its newlines,
    carriage returns and control characters shown as escapes (``core/terminal.py``), so
    a message can neither drive the terminal showing the log nor forge a line of it."""

    name = "log"

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger("orchestrator.channel.log")

    def send(self, address: str, rendered: RenderedMessage) -> list[str]:
        self._log.info("[%s #%d] %s", for_log(address), rendered.seq, for_log(rendered.text))
        return []  # nothing to name: a change is a line of its own

    def react(self, address: str, posted: list[str], rendered: RenderedMessage, reaction: Reaction) -> bool:
        self._log.info("[%s #%d reaction] %s", for_log(address), rendered.seq, reaction.emoji)
        return True

    def edit(self, address: str, posted: list[str], rendered: RenderedMessage) -> list[str]:
        self._log.info("[%s #%d edited] %s", for_log(address), rendered.seq, for_log(rendered.text))
        return []

    def retract(self, address: str, posted: list[str], rendered: RenderedMessage) -> None:
        self._log.info("[%s #%d retracted]", for_log(address), rendered.seq)


class InboundDoor:
    """What a channel's inbound side (an HTTP route's, or a socket's) takes a message in
    with: the store, the settings, the signals that wake the group and the deliverer,
    and the longest message it stores."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        *,
        signal: Callable[[str], object],
        signal_delivery: Callable[[str], object] | None,
        max_chars: int,
    ) -> None:
        self.db, self.settings = db, settings
        self.signal, self.signal_delivery = signal, signal_delivery
        self.max_chars = max_chars
        self._open()

    def _open(self) -> None:
        """What a channel's door sets up from the settings, once its fields are set."""

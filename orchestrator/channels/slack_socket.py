"""Slack messages in over Socket Mode: no public URL needed (``orchestrator slack socket``).

slack_sdk's built-in ``SocketModeClient`` asks ``apps.connections.open`` (with
the app-level token, ``ORCHESTRATOR_SLACK_APP_TOKEN``, scope
``connections:write``) for a websocket URL, connects, and reconnects by itself
when Slack asks (``disconnect``) or the connection drops.  Each ``events_api``
envelope carries the same ``event_callback`` document the Events API POSTs; it
goes to :class:`~orchestrator.channels.slack_inbound.SlackInbound` and is
acknowledged (``{"envelope_id": ...}``) only once it is stored or known to
store nothing: an envelope whose storing failed (the database away) is left
unacknowledged, and Slack sends it again (the message's id makes the second
one a duplicate if the first was stored after all).  A document that is no
event callback is acknowledged and logged: sending it again would not mend it.
An ``interactive`` envelope (a click on a question's button) is acknowledged
once taken (``orchestrator/channels/slack_clicks.py``); one whose taking failed
is acknowledged too and logged: Slack does not send a click again, and a click
the clicker sees go unanswered is made again.  Other envelope types (slash
commands) are acknowledged and ignored.

Run one per app: Slack spreads the envelopes over an app's open connections,
so several would each see a share (harmless: ids dedupe), not a copy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from orchestrator.channels.slack import SlackWeb
from orchestrator.channels.slack_clicks import take_interaction
from orchestrator.channels.slack_inbound import SlackInbound
from orchestrator.core.errors import ChannelError
from orchestrator.core.settings import Settings
from orchestrator.store.db import Database

log = logging.getLogger(__name__)


class SlackSocket:
    """One Socket Mode connection, its envelopes stored (see the module's doc)."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        *,
        signal: Callable[[str], object] | None = None,
        signal_delivery: Callable[[str], object] | None = None,
        web: SlackWeb | None = None,
    ) -> None:
        if not settings.slack.app_token:
            raise ChannelError(
                "set ORCHESTRATOR_SLACK_APP_TOKEN (an app-level token with connections:write) to use Socket Mode"
            )
        app_web = SlackWeb(settings, token=settings.slack.app_token)  # checks that slack_sdk is installed
        if web is None and settings.slack.bot_token:
            web = SlackWeb(settings)
        self.inbound = SlackInbound(db, settings, signal=signal, signal_delivery=signal_delivery, web=web)
        from slack_sdk.socket_mode.builtin import SocketModeClient

        self.client = SocketModeClient(
            app_token=settings.slack.app_token, web_client=app_web.client, auto_reconnect_enabled=True, logger=log
        )
        self.client.socket_mode_request_listeners.append(self._on_request)
        self.taken = 0  # envelopes stored or skipped and acknowledged (tests and the log read it)
        self.failed = 0  # envelopes left unacknowledged for Slack to send again

    def _on_request(self, client: Any, request: Any) -> None:
        from slack_sdk.socket_mode.response import SocketModeResponse

        if request.type == "events_api":
            try:
                self.inbound.take(request.payload)
            except ValidationError as exc:
                log.warning(
                    "slack: envelope %s is no event callback (%s); acknowledged and dropped",
                    request.envelope_id,
                    exc.errors()[0]["msg"],
                )
            except Exception:  # not acknowledged: Slack sends it again
                self.failed += 1
                log.exception("slack: envelope %s not stored; Slack will send it again", request.envelope_id)
                return
        elif request.type == "interactive":
            try:
                take_interaction(self.inbound, request.payload)
            except Exception:  # logged; the clicker clicks again
                log.exception("slack: the click of envelope %s was not taken", request.envelope_id)
        client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))
        self.taken += 1

    def connect(self) -> None:
        try:
            self.client.connect()
        except ChannelError:
            raise
        except Exception as exc:  # apps.connections.open refused, the socket unreachable
            raise ChannelError(f"slack: Socket Mode could not connect: {type(exc).__name__}: {exc}") from exc

    def is_connected(self) -> bool:
        return bool(self.client.is_connected())

    def run(self, stop: threading.Event) -> None:
        """Connected until ``stop`` is set (the client reconnects by itself meanwhile)."""
        self.connect()
        stop.wait()

    def close(self) -> None:
        self.client.close()

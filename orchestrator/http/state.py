"""What the API's routes share, made once by ``create_app`` and kept on the app's ``state``.

The routes are plain functions of their topic modules (``orchestrator/http/routes/``),
not closures over ``create_app``'s locals: what they need (the installation's root, its
database and settings, the signals, the posts' write batches, the channels' inbound
takers) they read from the request's app with :func:`api_state`, which costs no
dependency resolution (the hot path's routes resolve as few as they can:
docs/performance.md, "The HTTP path").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import Response

from orchestrator.channels.slack_inbound import SlackEvents
from orchestrator.channels.webhook import InboundWebhook
from orchestrator.core.settings import Settings
from orchestrator.http.write_batches import WriteBatches
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage
from orchestrator.store.db import Database


@dataclass(frozen=True, slots=True)
class ApiState:
    """One app's shared parts (see the module's doc)."""

    root: Orchestrator
    settings: Settings
    db: Database
    signal: Callable[[str], object]
    signal_delivery: Callable[[str], object] | None
    # POST /api/messages' group commit (orchestrator/http/routes/messages.py).
    posts: WriteBatches[IncomingMessage, Response]
    webhook: InboundWebhook
    slack: SlackEvents
    # Read by every /api request's checks (orchestrator/http/auth.py): worked out once.
    api_token: bytes = field(init=False)
    install_id: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "api_token", self.settings.api.token.encode())
        object.__setattr__(self, "install_id", self.settings.install_id)


def keep_state(api: FastAPI, state: ApiState) -> None:
    """Make ``state`` what :func:`api_state` finds for ``api``'s requests."""
    api.state.api = state


def api_state(request: Request) -> ApiState:
    """The shared parts of the app serving ``request``."""
    state: ApiState = request.app.state.api
    return state

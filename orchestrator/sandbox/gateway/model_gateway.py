"""The model gateway of one run (:class:`ModelGateway`): the server, the rules, the upstream
and the run's tally put together, as its config says.

Every resource the sandbox can make the host spend is bounded: connections (one thread
each, at most ``max_connections``; more are closed at once), time (``read_timeout_s`` on
every read, idle keep-alive included), request size (a valid ``Content-Length`` up to
``max_request_bytes``, no chunked bodies), and money: one request upstream at a time, so
the budget check before a request sees what every earlier one cost, and a request's output
cap must fit what is left of the run's budget.  The query string is never passed on.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from agent_runner.protocol import Usage

from .config import GatewayConfig
from .metering import Account
from .refusal import Refusal
from .rules import Request, hold_before_body, prepare
from .server import ROUTE_REFUSED, GatewayServer, Handler, content_length, read_body, send_error_answer
from .upstream import UpstreamClient

if TYPE_CHECKING:
    from orchestrator.core.settings import Settings


class ModelGateway:
    """Forward the config's route from a unix socket at ``socket_path`` to its upstream, with
    the key added, every request held to the rules (``rules.py``) and every answer counted.

    The tally starts at ``spent`` (what earlier attempts of the run used), so the token
    budget holds per run, not per attempt.  A context manager: serving from ``__enter__``
    to ``__exit__``, the socket removed then.
    """

    def __init__(self, socket_path: Path, config: GatewayConfig, *, spent: Usage | None = None) -> None:
        self.socket_path = socket_path
        self.config = config
        self.account = Account(spent)
        # One request at a time, from reading its body to its answer's last
        # byte: the budget check sees every earlier request's cost, and at
        # most one body is in memory.
        self._one_at_a_time = threading.Lock()
        self._upstream = UpstreamClient(config.base_url, config.api_key, config.auth, config.timeout_s)
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        self._server = GatewayServer(
            socket_path, self, max_connections=config.max_connections, read_timeout_s=config.read_timeout_s
        )
        self._thread = threading.Thread(target=self._server.serve, name="model-gateway", daemon=True)

    @classmethod
    def for_provider(
        cls,
        socket_path: Path,
        settings: Settings,
        provider: str,
        *,
        spent: Usage | None = None,
        model: str | None = None,
        max_tokens: int | None = None,
        server_tools: frozenset[str] = frozenset(),
        search_domains: tuple[str, ...] = (),
    ) -> ModelGateway:
        """The gateway for ``provider`` as ``settings`` configure it (:meth:`GatewayConfig.for_provider`),
        counting from ``spent``: what earlier attempts of the same run used."""
        config = GatewayConfig.for_provider(
            settings,
            provider,
            model=model,
            max_tokens=max_tokens,
            server_tools=server_tools,
            search_domains=search_domains,
        )
        return cls(socket_path, config, spent=spent)

    # -- the run's tally -------------------------------------------------------------------------

    @property
    def usage(self) -> Usage:
        """The run's tokens so far (``spent`` included)."""
        return self.account.usage

    @property
    def input_tokens(self) -> int:
        return self.account.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.account.output_tokens

    @property
    def requests(self) -> int:
        """Requests sent upstream."""
        return self.account.requests

    @property
    def refused(self) -> int:
        """Requests the gateway answered itself, with an error."""
        return self.account.refused

    @property
    def budget_refusals(self) -> int:
        """Requests refused because the token budget was spent or would be."""
        return self.account.budget_refusals

    @property
    def dropped(self) -> int:
        """Connections closed at once because ``max_connections`` were open."""
        return self._server.dropped

    # -- serving ---------------------------------------------------------------------------------

    def __enter__(self) -> ModelGateway:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.stop()
            self._thread.join()
        self._server.server_close()  # also unlinks the socket
        # A request still being answered is cut; one waiting on the upstream
        # gets a moment to be counted.
        self._server.end_connections(wait_s=2.0)
        self._upstream.close()

    def refuse(self, h: Handler, status: int, kind: str, message: str) -> None:
        """Answer ``h`` with an error of the gateway's own, counted."""
        self.account.count_refusal()
        send_error_answer(h, status, kind, message)

    def post(self, h: Handler) -> None:
        """A request of the sandbox: held to the rules, then forwarded."""
        # The query string is never passed on (the CLI sends ?beta=true: not a refusal).
        path = h.path.split("?", 1)[0]
        if path not in self.config.paths:
            self.refuse(h, 403, "forbidden", ROUTE_REFUSED)
            return
        try:
            length = content_length(h, self.config.max_request_bytes)
            if not self._one_at_a_time.acquire(timeout=self.config.timeout_s):
                raise Refusal(503, "overloaded_error", "the gateway serves one request at a time; try again")
        except Refusal as r:
            self.refuse(h, r.status, r.kind, r.message)
            return
        try:
            request = Request(path, h.headers, self.config, self.account)
            try:
                hold_before_body(request)
                request.body = read_body(h, length, self.config.read_timeout_s)
                # The rules that read the body, the headers' among them, hold once it is read:
                # a client that is still sending it would meet a closed connection instead of
                # the refusal.
                body = prepare(request)
            except Refusal as r:
                self.refuse(h, r.status, r.kind, r.message)
                return
            self._upstream.forward(h, path, request.forwarded, body, self.account)
        finally:
            self._one_at_a_time.release()

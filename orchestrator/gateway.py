"""The model gateway: the sandbox's only way out, and it holds the secret.

For each run that uses a real model, the worker serves an HTTP endpoint on a
unix socket inside the run's private folder, which is mounted into the
container.  The container talks to the model API through it; the gateway
adds the API key, forwards only the model API's route, and counts tokens.
The container never sees the key: not in its environment, files or
arguments.

Two upstreams (:meth:`ModelGateway.for_provider`): Anthropic (``POST /v1/messages``, key
in ``x-api-key``) and an OpenAI-compatible server (``POST
/v1/chat/completions``, key as ``Authorization: Bearer``, none when no key
is configured, as for a local Ollama).  Token counts are read from either
usage shape.
"""

from __future__ import annotations

import json
import logging
import os
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import httpx

if TYPE_CHECKING:
    from .settings import Settings

log = logging.getLogger(__name__)

# Hop-by-hop and secret-bearing headers are never passed through from the sandbox.
_DROP_HEADERS = {"host", "content-length", "connection", "x-api-key", "authorization", "transfer-encoding"}


# sockaddr_un.sun_path holds 108 bytes on Linux; a NUL-terminated path must fit.
_MAX_UNIX_PATH = 107

ANTHROPIC_PATHS = frozenset({"/v1/messages"})
OPENAI_PATHS = frozenset({"/v1/chat/completions"})
Auth = Literal["x-api-key", "bearer"]


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # The run folder lives under the data dir, whose path can be longer
        # than a unix socket address allows.  On Linux, bind through the
        # folder's /proc/self/fd entry instead: same socket file, short name.
        path = os.fsencode(self.server_address)
        if len(path) <= _MAX_UNIX_PATH or not os.path.isdir("/proc/self/fd"):
            super().server_bind()
            return
        fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.socket.bind(f"/proc/self/fd/{fd}/".encode() + os.path.basename(path))
        finally:
            os.close(fd)


class ModelGateway:
    """Forward ``allowed_paths`` from a unix socket to ``upstream`` with the key added.

    ``auth`` says how: ``x-api-key`` (Anthropic; always sent) or ``bearer``
    (``Authorization: Bearer <key>``, left out when the key is empty).
    """

    def __init__(
        self,
        socket_path: Path,
        *,
        upstream: str,
        api_key: str,
        allowed_paths: frozenset[str] = ANTHROPIC_PATHS,
        auth: Auth = "x-api-key",
        timeout_s: float = 600.0,
        token_budget: int = 0,
    ) -> None:
        self.socket_path = socket_path
        self.upstream = upstream.rstrip("/")
        self.allowed_paths = allowed_paths
        self.input_tokens = 0
        self.output_tokens = 0
        self.requests = 0
        self.refused = 0
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=timeout_s)
        self._api_key = api_key
        self._auth = auth
        # Input + output tokens one run may spend (0: no limit).  Checked
        # before each request: the one that crosses it completes, the next
        # is refused, so a run cannot overspend by more than one answer.
        self.token_budget = token_budget
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def address_string(self) -> str:  # unix sockets have no peer address
                return "sandbox"

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug("gateway: " + fmt, *args)

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                gateway._handle(self)

            def do_GET(self) -> None:  # noqa: N802
                gateway._refuse(self)

            do_PUT = do_DELETE = do_PATCH = do_GET  # noqa: N815

        socket_path.parent.mkdir(parents=True, exist_ok=True)
        if socket_path.exists():
            socket_path.unlink()
        self._server = _UnixHTTPServer(str(socket_path), Handler)
        # The sandbox runs as another uid; it may connect, nobody else is in
        # the run's private folder.
        os.chmod(socket_path, 0o666)
        self._thread = threading.Thread(target=self._server.serve_forever, name="model-gateway", daemon=True)

    @classmethod
    def for_provider(cls, socket_path: Path, settings: Settings, provider: str) -> ModelGateway:
        """The gateway for ``provider`` ("anthropic" or "openai") as ``settings`` configure it."""
        if provider == "openai":
            return cls(
                socket_path, upstream=settings.openai_base_url, api_key=settings.openai_api_key,
                allowed_paths=OPENAI_PATHS, auth="bearer", token_budget=settings.run_token_budget,
            )
        if provider == "anthropic":
            return cls(socket_path, upstream=settings.anthropic_base_url, api_key=settings.anthropic_api_key,
                       token_budget=settings.run_token_budget)
        raise ValueError(f"no model gateway for provider {provider!r}")

    def __enter__(self) -> ModelGateway:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass

    # -- request handling -----------------------------------------------------------

    def _refuse(self, h: BaseHTTPRequestHandler, kind: str = "forbidden",
                message: str = "route not allowed by the gateway") -> None:
        with self._lock:
            self.refused += 1
        body = json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
        h.send_response(403)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(body)))
        # The refused request's body is left unread: close the connection, or
        # a keep-alive client's next request would be parsed from it.
        h.send_header("connection", "close")
        h.close_connection = True
        h.end_headers()
        h.wfile.write(body)

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?", 1)[0]
        if path not in self.allowed_paths:
            self._refuse(h)
            return
        with self._lock:
            spent = self.input_tokens + self.output_tokens
        if self.token_budget and spent >= self.token_budget:
            # 403, not 429: a provider must not retry this.
            self._refuse(h, "budget_exceeded",
                         f"this run used {spent} tokens; its budget is {self.token_budget} (ORCHESTRATOR_RUN_TOKEN_BUDGET)")
            return
        length = int(h.headers.get("content-length") or 0)
        body = h.rfile.read(length) if length else b""
        headers = {k: v for k, v in h.headers.items() if k.lower() not in _DROP_HEADERS}
        if self._auth == "bearer":
            if self._api_key:
                headers["authorization"] = f"Bearer {self._api_key}"
        else:
            headers["x-api-key"] = self._api_key
        try:
            resp = self._client.post(self.upstream + h.path, content=body, headers=headers)
            status, content, ctype = resp.status_code, resp.content, resp.headers.get("content-type", "application/json")
            retry_after = resp.headers.get("retry-after")
        except httpx.HTTPError as exc:
            status, ctype, retry_after = 502, "application/json", None
            content = json.dumps({"type": "error", "error": {"type": "api_error", "message": f"gateway: upstream unreachable: {exc}"}}).encode()
        with self._lock:
            self.requests += 1
            if status == 200:
                self._count(content)
        h.send_response(status)
        h.send_header("content-type", ctype)
        h.send_header("content-length", str(len(content)))
        if retry_after:
            h.send_header("retry-after", retry_after)
        h.end_headers()
        h.wfile.write(content)

    def _count(self, content: bytes) -> None:
        try:
            usage = json.loads(content).get("usage") or {}
            # Anthropic: input_tokens/output_tokens; OpenAI: prompt_tokens/completion_tokens.
            tokens_in = int(usage.get("input_tokens") or usage.get("prompt_tokens") or 0)
            tokens_out = int(usage.get("output_tokens") or usage.get("completion_tokens") or 0)
        except (ValueError, TypeError, AttributeError):
            return
        self.input_tokens += tokens_in
        self.output_tokens += tokens_out


"""A webhook receiver on loopback, as a careful one is written: every POST kept (its
headers and body), the timestamped signature checked (``verify_delivery``: a 401 when it
does not hold), and :meth:`WebhookReceiver.taken` acting on each delivery id once, as a
deduplicating receiver does.  ``fail`` makes its first answers 500s; :meth:`hold` keeps
the answers to the posts that come in (kept, unanswered) until :meth:`release`, a receiver
slow to answer while its sender is cut off."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from orchestrator.channels.webhook import (
    DELIVERY_HEADER,
    TIMESTAMP_HEADER,
    TIMESTAMPED_SIGNATURE_HEADER,
    verify_delivery,
)


@dataclass
class Received:
    delivery_id: str | None
    body: bytes
    signed: bool  # the timestamped signature checked out, within the window
    status: int

    @property
    def doc(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    secret: str
    fail: int = 0
    posts: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._answering = threading.Event()
        self._answering.set()
        self._holding: Callable[[Received], bool] = lambda post: False
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's naming
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                signed = verify_delivery(
                    receiver.secret,
                    body,
                    self.headers.get(TIMESTAMP_HEADER),
                    self.headers.get(TIMESTAMPED_SIGNATURE_HEADER),
                    now=time.time(),
                )
                with receiver._lock:
                    status = 500 if len(receiver.posts) < receiver.fail else 200 if signed else 401
                    post = Received(self.headers.get(DELIVERY_HEADER), body, signed, status)
                    receiver.posts.append(post)
                if receiver._holding(post):
                    receiver._answering.wait(120)
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def hold(self, when: Callable[[Received], bool]) -> None:
        """Keep the posts from now on that ``when`` picks unanswered (kept, the sender's call
        waiting) until :meth:`release`."""
        self._answering.clear()
        self._holding = when

    def release(self) -> None:
        self._holding = lambda post: False
        self._answering.set()

    def taken(self) -> list[Received]:
        """The accepted posts, each delivery id once (what a deduplicating receiver acts on)."""
        seen: set[str | None] = set()
        out = []
        with self._lock:
            for p in self.posts:
                if p.status == 200 and p.delivery_id not in seen:
                    seen.add(p.delivery_id)
                    out.append(p)
        return out

    def events(self) -> list[str]:
        return [p.doc["event"] for p in self.taken()]

    def __enter__(self) -> WebhookReceiver:
        # Named "fake-..." and joined on exit: tests/conftest.py fails a run that leaves one running.
        self._thread = threading.Thread(
            target=self.server.serve_forever, args=(0.05,), daemon=True, name="fake-webhook-receiver"
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()

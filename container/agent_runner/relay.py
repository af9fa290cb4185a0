"""A loopback TCP listener that relays every connection to a host's unix socket.

Clients take an HTTP address, not a unix socket: the Claude Code CLI's
``ANTHROPIC_BASE_URL`` (to the model gateway), and curl, pip, git and the
rest's ``HTTP_PROXY`` (to the egress proxy: ``egress.py``).  The container
has no network but does have its own loopback, so the runner listens on
``127.0.0.1`` (an ephemeral port, inside the container's own network
namespace: nothing outside can reach it) and pumps bytes both ways to the
host's socket.  Nothing is parsed here: the host is the one that must not
trust what the container sends.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

CHUNK = 64 * 1024


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until ``src`` ends, then half-close ``dst``."""
    try:
        while chunk := src.recv(CHUNK):
            dst.sendall(chunk)
    except OSError:
        pass  # either side went away: the other pump sees it too
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class UnixRelay:
    """``127.0.0.1:<port>`` -> ``socket_path``; a thread pair per connection."""

    def __init__(self, socket_path: str, *, connect: Callable[[str], socket.socket] | None = None) -> None:
        self.socket_path = socket_path
        self._connect = connect or self._unix
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="host-relay", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @staticmethod
    def _unix(path: str) -> socket.socket:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(path)
        return upstream

    def __enter__(self) -> UnixRelay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        try:
            self._listener.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = self._connect(self.socket_path)
        except OSError as exc:
            log.error("relay: cannot reach %s: %s", self.socket_path, exc)
            client.close()
            return
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        client.close()
        upstream.close()


_KEPT: dict[str, UnixRelay] = {}
_KEPT_LOCK = threading.Lock()


def kept_relay(socket_path: str) -> UnixRelay:
    """The process's one relay to ``socket_path``, started at its first use and kept for the
    process's life: a warm container's runs (and a kept Claude Code CLI, started with the
    relay's address) see the same address run after run.  Only plumbing: the host's socket
    decides, per run, whether it answers and what it lets through."""
    with _KEPT_LOCK:
        relay = _KEPT.get(socket_path)
        if relay is None:
            relay = _KEPT[socket_path] = UnixRelay(socket_path).__enter__()
        return relay

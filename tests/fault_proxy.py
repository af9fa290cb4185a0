"""A TCP proxy on loopback whose connections can be cut and healed: a network partition
between one process and a service (its database, its broker), for the fault trials.

Every connection to :attr:`FaultProxy.port` is relayed to the target.  :meth:`cut` stops
every byte both ways, on the connections open and on new ones (accepted, then silent): a
partition as a cable pulled or a firewall dropping packets looks to the client, whose calls
hang until their own timeouts, while the server keeps its end open.  :meth:`heal` lets the
held bytes through and relays again.  Loopback only, as the tests' network rule asks.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class FaultProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._closing = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def __enter__(self) -> FaultProxy:
        threading.Thread(target=self._accept, name=f"fault-proxy-{self.port}", daemon=True).start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._closing = True
        self._open.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()

    def url(self, url: str) -> str:
        """``url`` (a database's or a broker's) with its host and port replaced by this proxy's."""
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(url)
        auth = parts.netloc.rpartition("@")[0]
        return urlunsplit(parts._replace(netloc=f"{auth + '@' if auth else ''}127.0.0.1:{self.port}"))

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(client)
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        # A connection made while cut reaches nothing until healed (the server never sees it).
        self._open.wait()
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        with self._lock:
            self._sockets.append(upstream)
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self._open.wait()
                data = src.recv(65536)
                if not data:
                    break
                self._open.wait()  # cut meanwhile: the bytes are held, as a dropped link holds them
                if self._closing:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

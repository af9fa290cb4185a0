"""The gateway's HTTP server: a unix socket in a host-only folder, one thread a connection,
and the writing and reading of HTTP that every answer and request goes through.

:class:`GatewayServer` binds the socket through a descriptor of its folder (never following
a symlink), caps the connections open at once (more are closed at once, in the accepting
thread), and stops at once when asked (no poll).  :class:`Handler`, one per connection,
hands each request to the server's :class:`Sink` (the ``ModelGateway``): a ``POST`` to
answer, anything else to refuse.  Every read of a connection waits at most
``read_timeout_s`` (the request line, headers, body, and the wait for a keep-alive's next
request), and a body is read only with one valid ``Content-Length`` within the limit.

Why ``http.server`` and not an ASGI server: measured with ``bench.gateway``
(docs/performance.md, "The model gateway: http.server or ASGI"), uvicorn cost more per run
(a slower close, or an event loop made per run), more memory kept per worker and ~2 ms
more per request, and held two of the bounds only through its protocol's internals.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import socket
import socketserver
import stat
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Protocol

from orchestrator.core.errors import GatewayError

from .refusal import Refusal

log = logging.getLogger(__name__)

# sockaddr_un.sun_path holds 108 bytes on Linux; a NUL-terminated path must fit.
_MAX_UNIX_PATH = 107
# The answer to a request the gateway forwards nowhere: any method but POST, any other path.
ROUTE_REFUSED = "route not allowed by the gateway"


class Sink(Protocol):
    """What the server hands each request to."""

    def post(self, h: Handler) -> None:
        """Answer a POST."""

    def refuse(self, h: Handler, status: int, kind: str, message: str) -> None:
        """Answer with an error of the gateway's own."""


class Handler(BaseHTTPRequestHandler):
    """One connection: its requests, one after another (keep-alive), handed to the sink."""

    protocol_version = "HTTP/1.1"
    server: GatewayServer

    def setup(self) -> None:
        super().setup()
        # Set on the connection before the first read: the request line,
        # headers, body and the wait for a keep-alive's next request.
        self.connection.settimeout(self.server.read_timeout_s)

    def address_string(self) -> str:  # unix sockets have no peer address
        return "sandbox"

    def log_message(self, fmt: str, *args: object) -> None:
        log.debug("gateway: " + fmt, *args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # http.server's own refusals (bad request line, too many or too
        # long headers, unknown method) as JSON errors too.
        self.server.sink.refuse(self, code, "invalid_request_error", message or explain or "bad request")

    def do_POST(self) -> None:  # http.server's naming
        self.server.sink.post(self)

    def do_GET(self) -> None:
        self.server.sink.refuse(self, 403, "forbidden", ROUTE_REFUSED)

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET  # noqa: N815


def chmod_socket(dir_fd: int, name: bytes, mode: int) -> None:
    """chmod the socket ``name`` in ``dir_fd``; never through a symlink, never anything but a socket
    (the egress proxy binds its socket so too)."""
    if not hasattr(os, "O_PATH"):  # not Linux: lchmod semantics where the platform has them
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISSOCK(st.st_mode):
            raise GatewayError(f"{name!r} is not the gateway's socket")
        os.chmod(name, mode, dir_fd=dir_fd, follow_symlinks=False)
        return
    # O_PATH|O_NOFOLLOW opens a symlink itself instead of its target; the
    # fstat then refuses it, and the chmod goes to the inode we checked.
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise GatewayError(f"{name!r} was replaced before its mode was set; refusing to chmod it")
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


class GatewayServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The socket at ``path``, serving :class:`Handler` connections for ``sink``, at most
    ``max_connections`` at once, each read waiting at most ``read_timeout_s``."""

    daemon_threads = True
    # close() ends the connections itself and waits a bounded time.
    block_on_close = False
    # A burst of connects is accepted (and, over the cap, closed) at once
    # instead of making the sandbox's connects wait on the backlog.
    request_queue_size = 128

    def __init__(self, path: Path, sink: Sink, *, max_connections: int, read_timeout_s: float) -> None:
        self.sink = sink
        self.read_timeout_s = read_timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self._open: dict[socket.socket, threading.Thread] = {}
        self._open_lock = threading.Lock()
        self.dropped = 0
        self._dir_fd = -1
        self._path = os.fsencode(path)
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()  # close-on-exec
        try:
            super().__init__(str(path), Handler)
        except BaseException:
            os.close(self._wake_r)
            os.close(self._wake_w)
            raise

    def serve(self) -> None:
        """Accept connections until :meth:`stop`, which wakes the wait at once.

        ``serve_forever`` would poll for its shutdown instead, and every
        run's close would wait for the next poll (50 ms on average with
        its 0.1 s).
        """
        with selectors.DefaultSelector() as selector:
            selector.register(self, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping:
                for key, _ in selector.select():
                    if key.fileobj is self and not self._stopping:
                        # socketserver's own accept-and-dispatch step; typeshed leaves private methods out.
                        self._handle_request_noblock()  # type: ignore[attr-defined]

    def stop(self) -> None:
        """End :meth:`serve` (from another thread); accept nothing more."""
        self._stopping = True
        os.write(self._wake_w, b"\0")

    def server_bind(self) -> None:
        # Every step goes through a descriptor of the folder, and none follows
        # a symlink: defence in depth, should the sandbox ever be able to
        # write the folder (it is a host-only folder, mounted read-only).
        path = self._path
        folder, name = os.path.dirname(path) or b".", os.path.basename(path)
        self._dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.unlink(name, dir_fd=self._dir_fd)  # a leftover entry, a symlink itself, never its target
        except FileNotFoundError:
            pass
        # The folder's path can be longer than a unix socket address allows:
        # bind through its /proc/self/fd entry instead (same folder, short name).
        bind_to = path
        if os.path.isdir("/proc/self/fd"):
            bind_to = f"/proc/self/fd/{self._dir_fd}/".encode() + name
        if len(bind_to) > _MAX_UNIX_PATH:
            raise GatewayError(f"the gateway socket's path is too long: {self.server_address}")
        try:
            self.socket.bind(bind_to)
        except OSError as exc:
            raise GatewayError(f"cannot bind the gateway socket {self.server_address}: {exc}") from exc
        # The sandbox runs as another uid; it may connect, nobody else is in
        # the run's private folder.
        chmod_socket(self._dir_fd, name, 0o666)

    def server_close(self) -> None:
        super().server_close()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        if self._dir_fd >= 0:
            try:
                os.unlink(os.path.basename(self._path), dir_fd=self._dir_fd)
            except OSError:
                pass  # gone already, or replaced by something that is not ours to remove
            os.close(self._dir_fd)
            self._dir_fd = -1

    def process_request(self, request: Any, client_address: Any) -> None:
        # Over the cap: closed now, in the accepting thread, without a thread
        # of its own (the container's pids limit does not bound host threads).
        if not self._slots.acquire(blocking=False):
            self.dropped += 1
            if self.dropped == 1:
                log.warning("model gateway: more than its connection limit open at once; closing the extra ones")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open[request] = threading.current_thread()
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open.pop(request, None)
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A sandbox that hangs up or misbehaves is not the host's error.
        log.debug("model gateway: a connection ended with an error", exc_info=True)

    def end_connections(self, wait_s: float) -> None:
        """Shut every open connection down (their reads end at once) and wait up to ``wait_s`` for their threads."""
        with self._open_lock:
            open_now = list(self._open.items())
        for conn, _ in open_now:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + wait_s
        for _, thread in open_now:
            thread.join(max(0.0, deadline - time.monotonic()))


# -- answers ------------------------------------------------------------------------------------


def send_error_answer(h: BaseHTTPRequestHandler, status: int, kind: str, message: str) -> None:
    """An error of the gateway's own, as the model APIs shape theirs; the connection closes."""
    body = json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
    # The request's body is left unread: close the connection, or a
    # keep-alive client's next request would be parsed from it.
    h.close_connection = True
    try:
        h.send_response(status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(body)))
        h.send_header("connection", "close")
        h.end_headers()
        h.wfile.write(body)
    except OSError:
        pass  # the sandbox hung up


def send_answer(h: BaseHTTPRequestHandler, status: int, ctype: str, content: bytes, retry_after: str | None) -> None:
    """A whole answer (the upstream's, or the gateway's 502)."""
    try:
        h.send_response(status)
        h.send_header("content-type", ctype)
        h.send_header("content-length", str(len(content)))
        if retry_after:
            h.send_header("retry-after", retry_after)
        h.end_headers()
        h.wfile.write(content)
    except OSError:
        h.close_connection = True


def relay_stream(
    h: BaseHTTPRequestHandler,
    ctype: str,
    chunks: Iterable[bytes],
    seen: Callable[[bytes], None],
    ended: Callable[[], None],
) -> None:
    """Pass an event stream on as it arrives (chunked), each chunk ``seen`` on the way, and
    ``ended`` called before the last byte goes out (a client that has read it all sees it counted)."""
    chunked = h.request_version == "HTTP/1.1"
    try:
        h.send_response(200)
        h.send_header("content-type", ctype)
        h.send_header("cache-control", "no-cache")
        if chunked:
            h.send_header("transfer-encoding", "chunked")
        else:  # HTTP/1.0: the end of the stream is the end of the connection
            h.close_connection = True
        h.end_headers()
        for chunk in chunks:
            if not chunk:
                continue
            seen(chunk)
            h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
        ended()
        if chunked:
            h.wfile.write(b"0\r\n\r\n")
    except OSError:
        # The sandbox hung up: stop reading (the upstream stops generating);
        # the caller charges what arrived.
        h.close_connection = True


# -- requests -----------------------------------------------------------------------------------


def content_length(h: BaseHTTPRequestHandler, max_request_bytes: int) -> int:
    """The request's one valid ``Content-Length``, at most ``max_request_bytes`` (no chunked bodies)."""
    if h.headers.get("transfer-encoding") is not None:
        raise Refusal(411, "invalid_request_error", "the gateway takes no chunked bodies: send Content-Length")
    values = h.headers.get_all("content-length") or []
    if not values:
        raise Refusal(411, "invalid_request_error", "Content-Length is required")
    value = values[0].strip()
    if len(values) > 1 or not (value.isascii() and value.isdigit()):
        raise Refusal(400, "invalid_request_error", "Content-Length must be one non-negative number")
    if len(value) > 19 or int(value) > max_request_bytes:
        raise Refusal(413, "request_too_large", f"the request is over the gateway's limit of {max_request_bytes} bytes")
    return int(value)


def read_body(h: BaseHTTPRequestHandler, length: int, read_timeout_s: float) -> bytes:
    """``length`` bytes of body: each read waits at most ``read_timeout_s``, and the whole body gets that long too."""
    deadline = time.monotonic() + read_timeout_s
    chunks: list[bytes] = []
    left = length
    try:
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError
            chunk = h.rfile.read1(min(left, 1 << 20))
            if not chunk:
                raise Refusal(400, "invalid_request_error", "the body ended before its Content-Length")
            chunks.append(chunk)
            left -= len(chunk)
    except TimeoutError:
        raise Refusal(408, "request_timeout", "the body did not arrive in time") from None
    return b"".join(chunks)

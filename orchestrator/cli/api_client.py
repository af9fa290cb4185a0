"""A small JSON client of the installation's HTTP API, on the standard library.

For the CLI's thin commands: ``orchestrator send`` must store a message
within half a second of CPU, which an HTTP client library's import alone
would take a good part of (httpx: about 0.25 s here).  One connection per
call; the API is on loopback or a LAN and a CLI makes a handful of calls.

Files go both ways streamed, a chunk at a time: :meth:`ApiClient.upload` sends
``multipart/form-data`` with a part named ``file`` per file (its length worked out
beforehand, so no chunked encoding), :meth:`ApiClient.download` writes a response's
bytes to the caller as they arrive.
"""

from __future__ import annotations

import http.client
import json
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from orchestrator.cli.local_files import LocalFile
from orchestrator.core.errors import ApiRefused, ApiUnreachable
from orchestrator.http.endpoint import CLIENT_HEADER, INSTALL_HEADER, Endpoint

CHUNK_BYTES = 1 << 16


# A file to upload: the name to send, an open file at its start, and its size.
Upload = LocalFile


def _part_head(boundary: str, name: str) -> bytes:
    # The name as a quoted string (RFC 7578): backslash and quote escaped, no line breaks
    # (they would end the header); in UTF-8, as browsers send it.  The server makes it safe.
    quoted = name.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "_").replace("\n", "_")
    return (
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{quoted}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode("utf-8", "surrogateescape")


def multipart_body(files: Sequence[Upload], boundary: str) -> tuple[int, Iterator[bytes]]:
    """The length and the chunks of a ``multipart/form-data`` body with a ``file`` part per
    file; each file is read a chunk at a time, and must hold the size it was given."""
    heads = [_part_head(boundary, f.name) for f in files]
    tail = f"--{boundary}--\r\n".encode()
    length = sum(len(h) + f.size + 2 for h, f in zip(heads, files, strict=True)) + len(tail)

    def chunks() -> Iterator[bytes]:
        for head, f in zip(heads, files, strict=True):
            yield head
            left = f.size
            while left > 0:
                chunk = f.file.read(min(left, CHUNK_BYTES))
                if not chunk:
                    raise OSError(f"{f.name}: the file shrank while it was sent")
                left -= len(chunk)
                yield chunk
            yield b"\r\n"
        yield tail

    return length, chunks()


class ApiClient:
    def __init__(self, endpoint: Endpoint, *, timeout_s: float = 30.0) -> None:
        parts = urlsplit(endpoint.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ApiUnreachable(f"not an http(s) URL: {endpoint.url!r}")
        self.endpoint = endpoint
        self._parts = parts
        self._timeout_s = timeout_s
        # CLIENT_HEADER: what an API without a token asks of a change (no web page of another site sends it).
        self._headers = {"Accept": "application/json", CLIENT_HEADER: "cli"}
        if endpoint.token:
            self._headers["Authorization"] = f"Bearer {endpoint.token}"
        if endpoint.install_id is not None:
            self._headers[INSTALL_HEADER] = endpoint.install_id

    def get(self, path: str, **query: Any) -> Any:
        params = {k: v for k, v in query.items() if v is not None}
        return self._call("GET", path + ("?" + urlencode(params) if params else ""), None)

    def post(self, path: str, body: Any) -> Any:
        return self._call("POST", path, body)

    def upload(self, path: str, files: Sequence[Upload]) -> Any:
        """POST ``files`` as ``multipart/form-data`` (a ``file`` part each), streamed; the JSON answer."""
        boundary = f"orchestrator-{secrets.token_hex(16)}"
        length, chunks = multipart_body(files, boundary)
        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", "Content-Length": str(length)}
        conn, response = self._request("POST", path, chunks, headers)
        try:
            return self._answer(response, self._read(response))
        finally:
            conn.close()

    def download(self, path: str, write: Callable[[bytes], object]) -> int:
        """GET ``path`` and hand its body to ``write`` a chunk at a time; the bytes written."""
        conn, response = self._request("GET", path, None, {"Accept": "*/*"})
        try:
            if response.status >= 400:
                self._answer(response, self._read(response))
            written = 0
            while True:
                try:
                    chunk = response.read(CHUNK_BYTES)
                except (OSError, http.client.HTTPException) as exc:
                    raise ApiUnreachable(f"the API at {self.endpoint.url} broke off the download: {exc}") from exc
                if not chunk:
                    return written
                write(chunk)
                written += len(chunk)
        finally:
            conn.close()

    @staticmethod
    def quote(segment: str) -> str:
        """One path segment (a chat id holds '@' and may hold '/')."""
        return quote(segment, safe="")

    def _connection(self) -> http.client.HTTPConnection:
        parts = self._parts
        if parts.scheme == "https":
            return http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=self._timeout_s)
        return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=self._timeout_s)

    def _request(
        self, method: str, path: str, body: bytes | Iterable[bytes] | None, extra: dict[str, str]
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send a request; the open connection and its response (the caller closes the connection)."""
        conn = self._connection()
        headers = {**self._headers, **extra}
        sent = False
        try:
            try:
                conn.putrequest(method, self._parts.path.rstrip("/") + path)
                for name, value in headers.items():
                    conn.putheader(name, value)
                conn.endheaders()
                sent = True
                if isinstance(body, bytes):
                    conn.send(body)
                elif body is not None:
                    for chunk in body:
                        conn.send(chunk)
            except (BrokenPipeError, ConnectionResetError) as exc:
                # The server answered before the body was all sent (a 413 for an upload over
                # its limit) and closed: its answer, if it can still be read, says why.
                if not sent:
                    raise ApiUnreachable(f"no API answers at {self.endpoint.url}: {exc}") from exc
                try:
                    return conn, conn.getresponse()
                except (OSError, http.client.HTTPException):
                    raise ApiUnreachable(f"the API at {self.endpoint.url} gave no answer: {exc}") from exc
            except (TimeoutError, OSError) as exc:
                # Nothing was sent that a server could have acted on, or a local file failed
                # to read mid-upload (the server refuses the body cut short).
                raise ApiUnreachable(f"no API answers at {self.endpoint.url}: {exc}") from exc
            try:
                return conn, conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                # The request may have been acted on: callers make their
                # requests idempotent (a message carries its own id).
                raise ApiUnreachable(f"the API at {self.endpoint.url} gave no answer: {exc}") from exc
        except BaseException:
            conn.close()
            raise

    def _read(self, response: http.client.HTTPResponse) -> bytes:
        try:
            return response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ApiUnreachable(f"the API at {self.endpoint.url} gave no answer: {exc}") from exc

    @staticmethod
    def _answer(response: http.client.HTTPResponse, raw: bytes) -> Any:
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = None
        if response.status >= 400:
            detail = doc.get("detail") if isinstance(doc, dict) else None
            raise ApiRefused(response.status, str(detail) if detail else raw[:200].decode(errors="replace"))
        return doc

    def _call(self, method: str, path: str, body: Any) -> Any:
        payload = None
        extra: dict[str, str] = {}
        if body is not None:
            payload = json.dumps(body).encode()
            extra = {"Content-Type": "application/json", "Content-Length": str(len(payload))}
        elif method not in ("GET", "HEAD"):
            extra = {"Content-Length": "0"}
        conn, response = self._request(method, path, payload, extra)
        try:
            return self._answer(response, self._read(response))
        finally:
            conn.close()

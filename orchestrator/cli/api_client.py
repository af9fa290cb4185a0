"""A small JSON client of the installation's HTTP API, on the standard library.

For the CLI's thin commands: ``orchestrator send`` must store a message
within half a second of CPU, which an HTTP client library's import alone
would take a good part of (httpx: about 0.25 s here).  One connection per
call; the API is on loopback or a LAN and a CLI makes a handful of calls.
"""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from orchestrator.core.errors import ApiRefused, ApiUnreachable
from orchestrator.http.endpoint import CLIENT_HEADER, INSTALL_HEADER, Endpoint


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

    @staticmethod
    def quote(segment: str) -> str:
        """One path segment (a chat id holds '@' and may hold '/')."""
        return quote(segment, safe="")

    def _call(self, method: str, path: str, body: Any) -> Any:
        parts = self._parts
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=self._timeout_s)
        else:
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=self._timeout_s)
        headers = dict(self._headers)
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            try:
                conn.request(method, parts.path.rstrip("/") + path, body=payload, headers=headers)
            except (TimeoutError, OSError) as exc:
                # Nothing was sent that a server could have acted on.
                raise ApiUnreachable(f"no API answers at {self.endpoint.url}: {exc}") from exc
            try:
                response = conn.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException) as exc:
                # The request may have been acted on: callers make their
                # requests idempotent (a message carries its own id).
                raise ApiUnreachable(f"the API at {self.endpoint.url} gave no answer: {exc}") from exc
        finally:
            conn.close()
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = None
        if response.status >= 400:
            detail = doc.get("detail") if isinstance(doc, dict) else None
            raise ApiRefused(response.status, str(detail) if detail else raw[:200].decode(errors="replace"))
        return doc

"""The web chat page at ``/`` and its files under ``/static/``: plain files from
``orchestrator/http/web`` (no build step, nothing fetched elsewhere).

They need no token (they hold no data).  The page runs only its own files: its
headers (:data:`PAGE_HEADERS`) allow no inline script and nothing from
elsewhere, on the page and on every answer under ``/static/`` (its 404s too:
:class:`StaticHeaders`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import MutableHeaders

WEB_DIR = Path(__file__).parent.parent / "web"
# The page runs only its own files: no inline script, nothing from elsewhere.  Images may
# also be blob: URLs: a file's preview is fetched with the token and shown from its bytes
# (an <img src> cannot send the Authorization header); only the page can make those.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

router = APIRouter()


@router.get("/", include_in_schema=False)
def page() -> FileResponse:
    return FileResponse(WEB_DIR / "index.html", headers={**PAGE_HEADERS, "Cache-Control": "no-cache"})


def mount_static(api: FastAPI) -> None:
    """The page's files under ``/static/``, with the page's headers."""
    api.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
    api.add_middleware(StaticHeaders)


class StaticHeaders:
    """The page's headers on every answer under ``/static/`` (its 404s too).

    A plain ASGI middleware: starlette's ``@app.middleware("http")``
    (BaseHTTPMiddleware), which did this before, wrapped every request of
    every route in a task and a streamed response, about a third of a
    ``GET /health`` (docs/performance.md, "The HTTP path")."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/static/"):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in PAGE_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)

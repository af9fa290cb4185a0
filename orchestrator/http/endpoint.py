"""Where a running installation's HTTP API answers, for clients on this machine.

``orchestrator up`` and ``orchestrator api`` write ``<data dir>/api.json``
(the URL to reach, the pid that serves it) when they start; the CLI's thin
commands (``orchestrator send``) read it and talk to that API instead of
opening the database themselves, which costs a CLI process SQLAlchemy's
import (about 0.6 s of CPU; docs/performance.md).  ``ORCHESTRATOR_API_URL``
names an API explicitly (another machine's, say) and wins over the file.

A file found in the data dir can be stale: its server gone (the connection
is refused and the client falls back), or its port taken since by another
installation's API.  So a client that found the API through the file sends
:data:`INSTALL_HEADER` with its own install id, and an API of another
installation refuses the request (421) before doing anything.

Standard library only: the CLI imports this before it knows whether it will
need anything heavier.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.settings import Settings

ANNOUNCE_FILE = "api.json"
INSTALL_HEADER = "X-Orchestrator-Install"
# Sent by this project's clients (the CLI's, the web page's): while no API token is set, a
# request that changes something must carry it (orchestrator/http/guards.py), which no HTML
# form can and no script of another site can without a CORS preflight the API never grants.
CLIENT_HEADER = "X-Orchestrator-Client"


@dataclass(frozen=True)
class Endpoint:
    url: str  # the API's root, e.g. http://127.0.0.1:8000 (no trailing slash)
    token: str  # the bearer token ("" when the API needs none)
    # The install id the API must have (sent as INSTALL_HEADER); None for an
    # API named explicitly, which is trusted as configured.
    install_id: str | None
    announced: bool


def client_url(host: str, port: int) -> str:
    """The URL a local client uses for a server bound to ``host``:``port``."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"  # bound to every address: loopback is one of them
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


@contextlib.contextmanager
def announced(settings: Settings, host: str, port: int) -> Iterator[Path]:
    """Write the announce file for the server at ``host``:``port`` while the block runs."""
    path = announce(settings, host, port)
    try:
        yield path
    finally:
        withdraw(settings)


def announce(settings: Settings, host: str, port: int, *, pid: int | None = None) -> Path:
    """Write (atomically) the announce file of the API this process serves."""
    path = settings.data_dir / ANNOUNCE_FILE
    tmp = path.with_name(f".{ANNOUNCE_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({"url": client_url(host, port), "pid": pid or os.getpid()}), encoding="utf-8")
    tmp.replace(path)
    return path


def withdraw(settings: Settings) -> None:
    """Remove the announce file if this process wrote it (a newer server's stays)."""
    path = settings.data_dir / ANNOUNCE_FILE
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text(encoding="utf-8")).get("pid") == os.getpid():
            path.unlink()


def find(settings: Settings) -> Endpoint | None:
    """The API to talk to: ``ORCHESTRATOR_API_URL``, else the announced one, else None."""
    if settings.api.url:
        return Endpoint(settings.api.url.rstrip("/"), settings.api.token, None, announced=False)
    try:
        doc = json.loads((settings.data_dir / ANNOUNCE_FILE).read_text(encoding="utf-8"))
        url = doc["url"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none announced, or a file that is not ours: work in process
    if not isinstance(url, str) or not url.startswith("http://"):
        return None
    return Endpoint(url, settings.api.token, settings.install_id, announced=True)

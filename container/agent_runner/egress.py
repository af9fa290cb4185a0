"""A run's way out: ``HTTP_PROXY`` and ``HTTPS_PROXY`` on the container's loopback, relayed to
the host's egress proxy (``ContainerInput.egress_socket``), which decides every request on
the group's network policy.  Without that socket nothing is set: the container has no
network at all.

When the host ends TLS for brokered hosts (``ContainerInput.egress_ca``), the clients' CA
variables name the bundle it mounted (the system's CAs and the installation's egress CA).
The variables are set for the run's processes (every tool's child inherits the runner's
environment) in both spellings, with ``NO_PROXY`` for loopback so the Claude Code CLI's
model calls still go to its own relay; they are taken back when the run ends (a warm
container serves the next run, whose policy may differ).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import msgspec

from .protocol import ContainerInput
from .relay import kept_relay

_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
# What each client reads for the CAs it trusts (OpenSSL and Python, requests, pip, git, Node, curl).
_CA_NAMES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
    "CURL_CA_BUNDLE",
)
_LOOPBACK = "127.0.0.1,localhost,::1"
# Every variable a run's way out sets (and takes back after it).
EGRESS_ENV = (*_NAMES, *_CA_NAMES, "NO_PROXY", "no_proxy")


@contextlib.contextmanager
def egress_env(inp: ContainerInput) -> Iterator[str | None]:
    """The run's proxy address while it runs (None: no way out)."""
    if inp.egress_socket is msgspec.UNSET:
        yield None
        return
    before = {name: os.environ.get(name) for name in EGRESS_ENV}
    # The same address for every run of a warm container: a kept Claude Code CLI was started with it.
    address = kept_relay(inp.egress_socket).base_url
    for name in _NAMES:
        os.environ[name] = address
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = _LOOPBACK
    if inp.egress_ca is not msgspec.UNSET:
        for name in _CA_NAMES:
            os.environ[name] = inp.egress_ca
    try:
        yield address
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

"""The checks behind the API's routes, as FastAPI dependencies: the bearer token and the installation.

:func:`api_checks` is what every ``/api`` request passes, as ONE dependency, in
this order: the token (401) before anything is looked at, the install header
(421), then no NUL in a path or query parameter (400).  One, not three:
FastAPI's resolution costs per dependency per request, a tenth of a small
post's server time for three (docs/performance.md).  :func:`require_token` is
the token alone (``GET /metrics``, outside ``/api``).  Both read the token and
the installation id of the request's app (``orchestrator/http/state.py``), and
both are async: FastAPI runs a plain def dependency in its thread pool, a hop
per request for checks that never block.  The request guard
(``orchestrator/http/guards.py``) checks the token before the body is read;
these check it again and put it in the OpenAPI document (:data:`BEARER`).
"""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from orchestrator.http.contract import refuse_nul_parameters
from orchestrator.http.endpoint import INSTALL_HEADER
from orchestrator.http.state import api_state

# The bearer token's scheme in the API's document; stateless, so one for every app.
BEARER = HTTPBearer(
    auto_error=False, description="ORCHESTRATOR_API_TOKEN; required when the server listens beyond loopback."
)

# What the /api router lists for the install header's refusal (check_install).
WRONG_INSTALL: dict[int | str, dict[str, Any]] = {
    421: {"description": f"the request's {INSTALL_HEADER} names another installation"}
}


def check_token(expected: bytes, credentials: HTTPAuthorizationCredentials | None) -> None:
    """401 unless the request carries the API token ``expected`` (when one is set), compared in constant time."""
    if not expected:
        return
    given = credentials.credentials.encode() if credentials is not None else b""
    if not hmac.compare_digest(given, expected):
        raise HTTPException(
            401,
            "missing or wrong bearer token" if given else "this API needs 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


def check_install(install_id: str, request: Request) -> None:
    """421 when the request names another installation than ``install_id``."""
    # A client that found this API through a data dir's announce file says
    # which installation it means (orchestrator/http/endpoint.py): a stale
    # file naming a port another installation took since must not store
    # its message here.
    claimed = request.headers.get(INSTALL_HEADER)
    if claimed is not None and claimed != install_id:
        raise HTTPException(421, f"this API serves installation {install_id}, not {claimed}")


# A default, not Annotated: FastAPI reads the string annotations against module globals.
async def api_checks(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(BEARER)) -> None:
    """What every ``/api`` request must pass (see the module's doc)."""
    state = api_state(request)
    check_token(state.api_token, credentials)
    check_install(state.install_id, request)
    await refuse_nul_parameters(request)


async def require_token(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(BEARER)) -> None:
    """The token alone (``/metrics`` is outside ``/api``)."""
    check_token(api_state(request).api_token, credentials)

"""The API's contract: one error body, and the error answers every route shares, in its OpenAPI document.

Every error the API answers is an :class:`ErrorBody` (``{"detail": ...}``; a
400 adds the offending ``field``, a 429 ``retry_after_s``).  The answers that
come from one mechanism rather than from a route are documented here, once,
for every operation they apply to (:func:`document_shared_errors`), instead of
being repeated route by route:

* **400** wherever the request has input (parameters or a body): the
  validation handler of ``orchestrator/http/api.py`` answers 400 naming the
  field, so FastAPI's generated 422 entry, which the API never answers, is
  replaced by it;
* **401** (with ``WWW-Authenticate: Bearer``) on every operation behind the
  bearer token: FastAPI marks those with the ``security`` requirement of
  ``HTTPBearer``, so the document cannot list one without the other;
* **403** and **413** on every operation: the request guard
  (``orchestrator/http/guards.py``) answers them before any route, for a
  ``Host`` that is not this machine's or a change requested without
  ``X-Orchestrator-Client`` or from another site while no token is set, and
  for a body over ``ORCHESTRATOR_API_MAX_REQUEST_BYTES`` (a route with a limit of
  its own, the file upload, documents its own 413 instead);
* **503** (with ``Retry-After``) on every operation: the database cannot serve for now
  (PostgreSQL restarting or unreachable, SQLite's lock held elsewhere past
  ``ORCHESTRATOR_API_DB_WAIT_S``, a full disk); nothing was stored, and the same
  request may be sent again.  The handler is the app's (``orchestrator/http/api.py``),
  so every operation lists it; one that reads no database simply never answers it;
* an ``application/json`` :class:`ErrorBody` for every 4xx and 5xx a route
  lists without saying what it carries (its 404s, 409s, the router's 421).

A method a path does not have is a 405 whose ``Allow`` lists every method the
path has (:func:`allow_every_method`; Starlette's own names only the first
route that matched the path, so ``GET /api/groups`` hid ``POST``).

No text parameter (path or query) may hold a NUL: PostgreSQL's text cannot,
and such a value reached it as a 500.  :func:`refuse_nul_parameters` answers
400 naming the parameter, and the document's string parameters say so
(:data:`NO_NUL_PATTERN`).

What only one route answers (a 404 naming the missing chat, a 409 for a busy
group) stays on that route's ``responses=``.  ``tests/host/test_api_contract.py``
holds the server to the document with schemathesis.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, TypeAdapter
from starlette.exceptions import HTTPException
from starlette.routing import Match, Mount

ERROR_SCHEMA = "ErrorBody"
# Any text but NUL, which neither database keeps (a regular expression for JSON Schema and pydantic).
NO_NUL_PATTERN = r"^[^\x00]*$"
_ERROR_REF = {"$ref": f"#/components/schemas/{ERROR_SCHEMA}"}
# FastAPI's entries for the 422 it would answer; the API answers 400 instead.
_FASTAPI_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")


class ErrorBody(BaseModel):
    """What every error answer of the API carries."""

    detail: str = Field(description="What went wrong, for people.")
    field: str | None = Field(
        default=None, description="Bad input (400): the offending field, dotted (`metadata.context[0].url`)."
    )
    retry_after_s: int | None = Field(
        default=None,
        description="Over a rate (429): whole seconds until one more is taken; the database "
        "unavailable (503): seconds to wait before trying again (as `Retry-After`).",
    )


BAD_INPUT = {"description": "bad input: `field` names the first offending field; nothing changed"}
HOST_REFUSED = {
    "description": "no ORCHESTRATOR_API_TOKEN is set and the `Host` header is not a name of this "
    "machine (127.0.0.1, localhost, [::1], ORCHESTRATOR_API_ALLOWED_HOSTS): DNS "
    "rebinding; or, for a POST, PUT, PATCH or DELETE without a token set, the request "
    "lacks `X-Orchestrator-Client` (any value) or comes from another site's page "
    "(`Sec-Fetch-Site: cross-site` or `same-site`, an `Origin` not this API's)"
}
TOO_LARGE = {
    "description": "the request body is larger than ORCHESTRATOR_API_MAX_REQUEST_BYTES (refused before it is read)"
}
UNAVAILABLE = {
    "description": "the database cannot serve for now (restarting or unreachable, locked by another writer past "
    "ORCHESTRATOR_API_DB_WAIT_S, its disk full); nothing was stored: send the same request again "
    "after `Retry-After` seconds",
    "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}},
}
UNAUTHORIZED = {
    "description": "missing or wrong `Authorization: Bearer <ORCHESTRATOR_API_TOKEN>`",
    "headers": {"WWW-Authenticate": {"description": "`Bearer`", "schema": {"type": "string"}}},
}


def document_shared_errors(api: FastAPI) -> None:
    """Make ``api``'s OpenAPI document list the shared error answers (see the module's doc)."""
    generate: Callable[[], dict[str, Any]] = api.openapi

    def openapi() -> dict[str, Any]:
        if api.openapi_schema is None:
            api.openapi_schema = _with_shared_errors(generate())
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to change the document


def _with_shared_errors(doc: dict[str, Any]) -> dict[str, Any]:
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            responses: dict[str, Any] = operation.setdefault("responses", {})
            has_input = bool(operation.get("parameters") or operation.get("requestBody"))
            if responses.pop("422", None) is not None or has_input:
                responses.setdefault("400", dict(BAD_INPUT))
            if operation.get("security"):
                responses.setdefault("401", json.loads(json.dumps(UNAUTHORIZED)))
            responses.setdefault("403", dict(HOST_REFUSED))
            responses.setdefault("413", dict(TOO_LARGE))
            _add_unavailable(responses)
            for parameter in operation.get("parameters", []):
                _no_nul(parameter.get("schema", {}))
            for code, response in responses.items():
                if code[0] in "45" and not response.get("content"):
                    response["content"] = {"application/json": {"schema": dict(_ERROR_REF)}}
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas[ERROR_SCHEMA] = ErrorBody.model_json_schema()
    for name in _FASTAPI_VALIDATION_SCHEMAS:
        if f'"#/components/schemas/{name}"' not in json.dumps(doc["paths"]):
            schemas.pop(name, None)
    return doc


def _add_unavailable(responses: dict[str, Any]) -> None:
    """The database's 503, beside a route's own 503 if it has one (the replay's: the queue did not take it)."""
    own = responses.get("503")
    if own is None:
        responses["503"] = json.loads(json.dumps(UNAVAILABLE))
        return
    own["description"] = f"{own.get('description', '')}; or {UNAVAILABLE['description']}"
    own.setdefault("headers", json.loads(json.dumps(UNAVAILABLE["headers"])))


def _no_nul(schema: dict[str, Any]) -> None:
    """Say in a parameter's schema that its text holds no NUL (refuse_nul_parameters refuses one)."""
    for branch in [schema, *schema.get("anyOf", [])]:
        if branch.get("type") == "string" and "pattern" not in branch and "enum" not in branch:
            branch["pattern"] = NO_NUL_PATTERN


async def refuse_nul_parameters(request: Request) -> None:
    """A dependency: 400 naming the first path or query parameter that holds a NUL.
    async: a plain def dependency runs in FastAPI's thread pool, a hop per request."""
    for where, values in (("path", request.path_params.items()), ("query", request.query_params.multi_items())):
        for name, value in values:
            if isinstance(value, str) and "\x00" in value:
                raise RequestValidationError(
                    [{"loc": (where, name), "msg": "must not contain NUL characters", "type": "value_error"}]
                )


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allow_every_method(api: FastAPI) -> None:
    """Answer a method the path lacks with a 405 whose ``Allow`` names all the path's methods."""

    def method_not_allowed(request: Request, exc: Exception) -> JSONResponse:
        # Each method asked of the app's routes as the router asks (included routers are routes
        # of their own, not copies); mounts take any method and answer for themselves.
        routes = [r for r in api.router.routes if not isinstance(r, Mount)]
        allowed = [
            m for m in _METHODS if any(r.matches({**request.scope, "method": m})[0] == Match.FULL for r in routes)
        ]
        headers = dict(exc.headers or {}) if isinstance(exc, HTTPException) else {}
        if allowed:
            headers["Allow"] = ", ".join(allowed)
        detail = exc.detail if isinstance(exc, HTTPException) else "Method Not Allowed"
        return JSONResponse({"detail": detail}, 405, headers=headers)

    api.add_exception_handler(405, method_not_allowed)


def inline_json_schema(adapter: TypeAdapter[Any]) -> dict[str, Any]:
    """``adapter``'s JSON schema with its ``$defs`` written in place: the schema of a request
    field that stays open in its model (checked later, by code that names the field its own
    way) but is documented exactly.  For models without recursion."""
    schema = adapter.json_schema()
    defs: dict[str, Any] = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].rsplit("/", 1)[-1]])
            # A discriminator's mapping points into $defs; the oneOf says the same without it.
            return {
                k: resolve(v)
                for k, v in node.items()
                if not (k == "discriminator" and isinstance(v, dict) and "propertyName" in v)
            }
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved

"""A route's model as its JSON answer, serialized once (:func:`model_response`).

A route that returns a model has FastAPI validate it against the route's
``response_model`` again before serializing it, a tenth of a small request's
time (docs/performance.md, "The HTTP path").  The routes on the hot path
(``GET /health``, ``POST /api/messages``), whose model is their
``response_model`` (the document still names it), answer with this instead.
"""

from __future__ import annotations

from fastapi.responses import Response
from pydantic import BaseModel


def model_response(model: BaseModel, status_code: int = 200) -> Response:
    """``model`` as the JSON answer, serialized once."""
    return Response(model.model_dump_json(), status_code=status_code, media_type="application/json")

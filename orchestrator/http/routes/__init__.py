"""The API's routes, a module per topic, each with its ``router`` (a FastAPI ``APIRouter``).

``orchestrator/http/api.py`` (``create_app``) includes them: those of ``/api`` under
one router that adds the prefix, the bearer token, the install header and the NUL
check (``orchestrator/http/auth.py``); ``/health``, ``/metrics``, the signed channel
routes and the page beside it.  A route reads what it needs from the request's app
(``orchestrator/http/state.py``) and raises: the exception handlers answer
(``orchestrator/http/errors.py``).
"""

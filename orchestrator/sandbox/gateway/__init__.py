"""The model gateway: the sandbox's only way to a model, and it holds the secret.

For each run that uses a real model, the worker serves an HTTP endpoint on a unix socket
inside the run's private folder, which is mounted into the container.  The container
talks to the model API through it; the gateway adds the API key, forwards only the model
API's route, holds every request to the policy and counts tokens.  The container never
sees the key: not in its environment, files or arguments.

One job a module:

* ``model_gateway.py``: :class:`ModelGateway`, the parts put together for one run;
* ``config.py``: :class:`GatewayConfig`, what one run's gateway is (from the settings);
* ``server.py``: the HTTP server on the socket, its handler, and HTTP in and out;
* ``rules.py``: the request policy, a table of named rules (docs/sandbox.md lists them);
* ``allowlists.py``: the headers, fields and tools a request may carry, recorded from the clients;
* ``wire.py``: a request's top level, headers and tools, read as its upstream reads them;
* ``scan.py``: the byte searches that tell whether a key could be read another way;
* ``sources.py``: the messages held to content sent inline;
* ``rewrite.py``: the body sent upstream, as it came or with its top level written anew;
* ``upstream.py``: the upstream APIs, and the client that forwards to one and relays its answer;
* ``metering.py``: each answer's usage as it passes, and the run's tally;
* ``refusal.py``: an answer the gateway gives itself.

Inside the package the modules import each other relatively: ``bench/gateway_prepare.py``
loads another revision's package under another name, beside the tree's.
"""

from __future__ import annotations

from .allowlists import (
    ANTHROPIC_BETAS,
    ANTHROPIC_FIELDS,
    ANTHROPIC_HEADERS,
    ANTHROPIC_TOOL_TYPES,
    OPENAI_FIELDS,
    OPENAI_HEADERS,
    OPENAI_TOOL_TYPES,
)
from .config import MAX_CONNECTIONS, GatewayConfig
from .model_gateway import ModelGateway
from .server import chmod_socket
from .upstream import ANTHROPIC_PATHS, OPENAI_PATHS, UPSTREAMS, missing_setting

__all__ = [
    "ANTHROPIC_BETAS",
    "ANTHROPIC_FIELDS",
    "ANTHROPIC_HEADERS",
    "ANTHROPIC_PATHS",
    "ANTHROPIC_TOOL_TYPES",
    "MAX_CONNECTIONS",
    "OPENAI_FIELDS",
    "OPENAI_HEADERS",
    "OPENAI_PATHS",
    "OPENAI_TOOL_TYPES",
    "UPSTREAMS",
    "GatewayConfig",
    "ModelGateway",
    "chmod_socket",
    "missing_setting",
]

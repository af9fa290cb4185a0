"""The egress proxy: the sandbox's one way to the network, on its group's terms.

A run whose group's network policy is not ``off`` (``sandbox/egress_policy.py``) gets a
proxy of its own, started and stopped with its attempt beside the model gateway, in the
worker: the policy, the budgets and the log are the run's, the proxy lives exactly as long
as the run may use it, and nothing needs deploying.  It listens on a unix socket in the
run's host-only folder, mounted read-only into the container (as the gateway's is); the
runner relays ``HTTP_PROXY``/``HTTPS_PROXY`` on the container's loopback to it
(``container/agent_runner/egress.py``), so ordinary clients (curl, pip, git, urllib) work.

It is a small asyncio proxy, not a library: without TLS interception a proxy only reads a
request's head, decides and then copies bytes.  Per request it decides, and records the
decision (:class:`Decision`):

* ``CONNECT host:port`` (HTTPS, or any TLS): the target as the CONNECT line names it, never a
  later SNI or Host; tunnelled once allowed.  A target (a URL's host too) must be a host name
  of the policy's grammar and a port before anything is decided or asked (``targets.py``);
* a brokered host's CONNECT is intercepted (``interception.py``);
* a plain HTTP request in absolute form (``GET http://host:port/path``): forwarded in origin
  form with ``Host`` set from the URL and ``Connection: close``; upgrades are refused
  (``relay.py``);
* the host must be a name the policy allows, by a method it allows, resolving to public
  addresses only, never to the installation's own ports (``decision.py``);
* a run's requests, bytes (both ways), open connections and idle time are bounded
  (``account.py``).

A refusal is ``403`` with ``X-Orchestrator-Egress: refused`` and the reason as the body
(``refusals.py``).  The server itself, and the proxy made for a run from the settings, are
``server.py``.
"""

from orchestrator.sandbox.egress.account import Decision, Limits
from orchestrator.sandbox.egress.decision import Resolver, system_resolver
from orchestrator.sandbox.egress.refusals import REFUSED_HEADER
from orchestrator.sandbox.egress.server import EGRESS_CA_BUNDLE, EGRESS_SOCKET, EgressProxy, egress_proxy
from orchestrator.sandbox.egress.targets import parse_resolve

__all__ = [
    "EGRESS_CA_BUNDLE",
    "EGRESS_SOCKET",
    "REFUSED_HEADER",
    "Decision",
    "EgressProxy",
    "Limits",
    "Resolver",
    "egress_proxy",
    "parse_resolve",
    "system_resolver",
]

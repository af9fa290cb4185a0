"""The policy's decision on one request: may it go, and to which address.

Per request, in order: the run's request and byte budgets; the host must be a name (an IP
literal is refused) the group's policy allows, or one with a brokered credential, by a
method it allows (a refused host the policy may ask about is noted for the chat's
question); a plain request's protocol upgrade is refused.  Then the proxy resolves the
name itself, through ``ORCHESTRATOR_EGRESS_RESOLVE`` (``host:port:address``, exactly that
host and port) or the system's resolver, whose every address must be public
(``core/addresses.py``), and connects to the address it checked (no second lookup to
rebind); whichever way a name resolves to this host's own addresses (loopback, 0.0.0.0,
an interface's, its public one), the installation's own ports (``Settings.own_ports``)
stay shut.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import h11

from orchestrator.core.addresses import is_this_host
from orchestrator.sandbox.egress.account import RunAccount
from orchestrator.sandbox.egress.refusals import Refused
from orchestrator.sandbox.egress.targets import is_literal
from orchestrator.sandbox.egress_policy import EgressPolicy, host_refusal, may_ask, method_refusal

Resolver = Callable[[str, int], Sequence[str]]
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def system_resolver(host: str, port: int) -> list[str]:
    return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


@dataclass(frozen=True)
class Decider:
    """What a run's proxy decides its requests by: the group's ``policy``, the run's account
    (its budgets), the hosts with a brokered credential, the resolve pins, the installation's
    own ports, a resolver, and which resolved addresses may be reached (every one a name
    resolves to must be)."""

    policy: EgressPolicy
    run: RunAccount
    brokered: Collection[str]
    resolve: Mapping[tuple[str, int], str]
    forbidden_ports: frozenset[int]
    resolver: Resolver
    allowed: Callable[[Address], bool]

    async def decide(self, method: str, host: str, port: int, request: h11.Request) -> str:  # noqa: C901 - the policy's checks in their order, each a refusal
        """The address to connect to for ``host:port``, or :class:`Refused` with why."""
        run, limits = self.run, self.run.limits
        if run.requests >= limits.max_requests:
            raise Refused(f"this run's {limits.max_requests} requests are spent")
        run.requests += 1
        if run.bytes >= limits.max_bytes:
            raise Refused(f"this run's {limits.max_bytes} bytes are spent")
        if is_literal(host):
            raise Refused(f"{host} is an IP address; the policy names hosts")
        # A brokered host is on the group's list by its credential.
        listed = self.policy.mode != "off" and host.lower().rstrip(".") in self.brokered
        refusal = (None if listed else host_refusal(self.policy, host, port)) or method_refusal(self.policy, method)
        if refusal is not None:
            if may_ask(self.policy, host, port):
                run.to_ask[(host.lower().rstrip("."), port)] = None
            raise Refused(refusal)
        if method != "CONNECT" and any(name.lower() == b"upgrade" for name, _ in request.headers):
            raise Refused("protocol upgrades are not forwarded over plain HTTP")
        pinned = self.resolve.get((host.lower().rstrip("."), port))
        if pinned is not None:
            if port in self.forbidden_ports:
                raise Refused(f"port {port} is one of this installation's own services")
            return pinned
        loop = asyncio.get_running_loop()
        try:
            addresses = await asyncio.wait_for(
                loop.run_in_executor(None, self.resolver, host, port), timeout=limits.resolve_s
            )
        except TimeoutError:
            raise Refused(f"resolving {host} took too long") from None
        except OSError as exc:
            raise Refused(f"cannot resolve {host}: {exc}") from None
        if not addresses:
            raise Refused(f"{host} resolves to no address")
        for text in addresses:
            try:
                address = ipaddress.ip_address(text.partition("%")[0])
            except ValueError:
                raise Refused(f"{host} resolves to {text!r}, not an address") from None
            if not self.allowed(address):
                raise Refused(f"{host} resolves to a non-public address ({address})")
            # A public name may be this host's own (its public address, or a resolver that
            # answers with one): the installation's services listen there.
            if port in self.forbidden_ports and is_this_host(address):
                raise Refused(
                    f"{host} resolves to this host ({address}), and port {port} is one of this installation's own services"
                )
        return addresses[0]

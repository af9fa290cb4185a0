"""What the egress proxy parses before it decides: CONNECT targets, URLs and the resolve pins.

A target (a CONNECT line's ``host:port``, a plain request's absolute URL) must be a host
name of the policy's grammar and a port (``egress_policy.host_name``, ``port_number``)
before anything is decided or asked: ``*.com:443``, ``under_score.example:443`` or
``x.test:1:443`` is a 400, never a question.  A plain request's path is normalised once
(``sandbox/request_paths.py``), as an intercepted one's is.  An IP literal passes the
grammar to be refused by the decision in its own words.  ``ORCHESTRATOR_EGRESS_RESOLVE``'s
``host:port:address`` entries are read here too (:func:`parse_resolve`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from orchestrator.sandbox.egress.refusals import Refused
from orchestrator.sandbox.egress_policy import host_name, port_number
from orchestrator.sandbox.request_paths import OriginTarget, PathRefused, origin_target


def is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def authority(text: str, default_port: int | None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) as a CONNECT line or a URL names it, held to what a rule
    can name before anything is decided or asked (a 400 otherwise): the host a name of the
    policy's grammar (``egress_policy.host_name``: lowercased, one trailing dot dropped; no
    ``*``, no ``_``, no empty label), the port digits from 1 to 65535 after exactly one colon
    outside brackets.  An IP literal is passed on as it is, for the decision
    (``decision.py``) to refuse in its own words."""
    if text.startswith("["):
        end = text.find("]")
        host_text, rest = (text, "") if end < 0 else (text[: end + 1], text[end + 1 :])
        if rest and not rest.startswith(":"):
            raise Refused(f"{text!r} is no host:port", status=400)
        port_text = rest[1:] if rest else None
        if not is_literal(host_text):
            raise Refused(f"{text!r} is no host:port: {host_text!r} is no IPv6 address", status=400)
    else:
        if text.count(":") > 1:
            raise Refused(f"{text!r} is no host:port: one colon, before the port", status=400)
        host_text, sep, port_text_or_empty = text.partition(":")
        port_text = port_text_or_empty if sep else None
    if port_text is None:
        if default_port is None:
            raise Refused(f"{text!r} names no port", status=400)
        port = default_port
    else:
        try:
            port = port_number(port_text)
        except ValueError as exc:
            raise Refused(f"{text!r} is no host:port: {exc}", status=400) from None
    if is_literal(host_text):
        return host_text.strip("[]").lower(), port
    try:
        return host_name(host_text), port
    except ValueError as exc:
        raise Refused(f"{text!r} is no host:port: {exc}", status=400) from None


def origin(target: str) -> OriginTarget:
    """``target`` normalised once (``sandbox/request_paths.py``), or :class:`Refused` (403) saying why."""
    try:
        return origin_target(target)
    except PathRefused as exc:
        raise Refused(str(exc)) from None


def absolute(target: str) -> tuple[str, int, str]:
    """A plain request's absolute-form target as (host, port, origin-form path), the path
    normalised as an intercepted request's is (``sandbox/request_paths.py``; its query as sent)."""
    try:
        parts = urlsplit(target)
    except ValueError as exc:  # an unclosed "[", among others
        raise Refused(f"{target!r} is no URL: {exc}", status=400) from None
    if parts.scheme != "http" or not parts.netloc:
        raise Refused(
            "a plain request names an http:// URL (HTTPS goes through CONNECT)"
            if parts.scheme != "https"
            else "https:// goes through CONNECT, not as a plain request",
            status=400,
        )
    if "@" in parts.netloc:
        raise Refused("credentials in the URL are not forwarded", status=400)
    host, port = authority(parts.netloc, default_port=80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return host, port, origin(path).target


def parse_resolve(entries: Sequence[str]) -> dict[tuple[str, int], str]:
    """``host:port:address`` entries (as ``ORCHESTRATOR_EGRESS_RESOLVE`` and curl's ``--resolve``
    spell them) as a map; ValueError naming a bad one."""
    out: dict[tuple[str, int], str] = {}
    for entry in entries:
        host, _, rest = entry.strip().partition(":")
        port_text, _, address = rest.partition(":")
        try:
            port = int(port_text)
            ipaddress.ip_address(address.strip("[]"))
        except ValueError:
            raise ValueError(f"{entry!r}: expected host:port:address") from None
        if not host or not 1 <= port <= 65535:
            raise ValueError(f"{entry!r}: expected host:port:address")
        out[(host.lower().rstrip("."), port)] = address.strip("[]")
    return out

"""Which addresses are public and which are this host's own (orchestrator/core/addresses.py),
the same on every Python (issue 44): the IANA special-purpose registries, multicast, site-local
and the space set aside decide, not ``ipaddress.is_global`` (3.11's calls fec0::1, 224.0.0.1
and ff02::1 global)."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from orchestrator.core.addresses import is_public, is_this_host
from tests.conftest import require_service

ADDRESSES: list[tuple[str, bool, str]] = [
    # IPv4, public
    ("1.1.1.1", True, "public unicast"),
    ("8.8.8.8", True, "public unicast"),
    ("100.128.0.1", True, "just past the shared address space"),
    ("172.32.0.1", True, "just past 172.16/12"),
    ("192.31.196.1", True, "AS112-v4, globally reachable"),
    ("192.52.193.1", True, "AMT, globally reachable"),
    ("192.175.48.1", True, "AS112 direct delegation, globally reachable"),
    ("198.20.0.1", True, "just past the benchmarking /15"),
    ("223.255.255.254", True, "the last unicast before multicast"),
    # IPv4, not public
    ("0.0.0.0", False, "this host"),
    ("0.1.2.3", False, "this network"),
    ("10.0.0.1", False, "private"),
    ("100.64.0.1", False, "shared address space (CGN)"),
    ("100.127.255.254", False, "shared address space (CGN)"),
    ("127.0.0.1", False, "loopback"),
    ("127.8.9.10", False, "loopback"),
    ("169.254.169.254", False, "link-local, the metadata service"),
    ("172.16.0.1", False, "private"),
    ("172.31.255.254", False, "private"),
    ("192.0.0.1", False, "IETF protocol assignments"),
    ("192.0.0.8", False, "IPv4 dummy address"),
    ("192.0.0.9", False, "PCP anycast: the nearest PCP server, not a destination"),
    ("192.0.0.10", False, "TURN anycast: likewise"),
    ("192.0.0.170", False, "NAT64 discovery"),
    ("192.0.0.255", False, "IETF protocol assignments"),
    ("192.0.2.1", False, "documentation TEST-NET-1"),
    ("192.88.99.1", False, "6to4 relay anycast, deprecated"),
    ("192.168.1.1", False, "private"),
    ("198.18.0.1", False, "benchmarking"),
    ("198.19.255.255", False, "benchmarking"),
    ("198.51.100.1", False, "documentation TEST-NET-2"),
    ("203.0.113.1", False, "documentation TEST-NET-3"),
    ("224.0.0.1", False, "multicast, all hosts"),
    ("233.252.0.1", False, "multicast, MCAST-TEST-NET"),
    ("239.255.255.250", False, "multicast, SSDP"),
    ("240.0.0.1", False, "reserved"),
    ("255.255.255.255", False, "limited broadcast"),
    # IPv6, public
    ("2606:4700::1111", True, "public unicast"),
    ("2001:4860:4860::8888", True, "public unicast"),
    ("2001:200::1", True, "just past the IETF protocol assignments /23"),
    ("2001:3::1", True, "AMT, globally reachable"),
    ("2001:4:112::1", True, "AS112-v6, globally reachable"),
    ("2001:20::1", True, "ORCHIDv2, globally reachable"),
    ("2001:30::1", True, "drone remote ID, globally reachable"),
    ("2620:4f:8000::1", True, "AS112 direct delegation, globally reachable"),
    ("3ffd:ffff::1", True, "just before the 6bone's"),
    ("64:ff9b::8.8.8.8", True, "NAT64 to a public address"),
    ("::ffff:1.1.1.1", True, "IPv4-mapped public"),
    ("2002:101:101::1", True, "6to4, public end"),
    # IPv6, not public
    ("::", False, "unspecified"),
    ("::1", False, "loopback"),
    ("::2:3:4:5", False, "reserved by the IETF (::/8)"),
    ("::ffff:10.0.0.1", False, "IPv4-mapped private"),
    ("::ffff:224.0.0.1", False, "IPv4-mapped multicast"),
    ("64:ff9b::10.0.0.1", False, "NAT64 to a private address"),
    ("64:ff9b::100.64.0.1", False, "NAT64 to the shared address space"),
    ("100::1", False, "discard-only"),
    ("100:0:0:1::1", False, "dummy prefix"),
    ("2001:1::1", False, "PCP anycast"),
    ("2001:1::2", False, "TURN anycast"),
    ("2001:2::1", False, "benchmarking"),
    ("2001:10::1", False, "ORCHID, deprecated"),
    ("2001:1ff::1", False, "IETF protocol assignments, unassigned"),
    ("2001:db8::1", False, "documentation"),
    ("3fff::1", False, "documentation (RFC 9637)"),
    ("3fff:fff::1", False, "documentation (RFC 9637)"),
    ("3ffe::1", False, "the 6bone's, returned"),
    ("5f00::1", False, "SRv6 SIDs"),
    ("4000::1", False, "outside 2000::/3: unallocated"),
    ("fc00::1", False, "unique local"),
    ("fd12:3456::1", False, "unique local"),
    ("fe80::1", False, "link-local"),
    ("fec0::1", False, "site-local, deprecated"),
    ("feff::1", False, "site-local, deprecated"),
    ("ff02::1", False, "multicast, link-local all nodes"),
    ("ff05::2", False, "multicast, site-local"),
    ("ff0e::1", False, "multicast, global scope"),
]


@pytest.mark.parametrize(("text", "public", "what"), ADDRESSES, ids=[a[0] for a in ADDRESSES])
def test_the_address_table(text: str, public: bool, what: str) -> None:
    assert is_public(ipaddress.ip_address(text)) is public, what


def interface_address() -> str | None:
    """An address of one of this machine's interfaces other than loopback (the one it would
    send from), or None where it has no route at all."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("198.51.100.7", 9))  # no packet leaves: UDP connect picks a source
            address = str(probe.getsockname()[0])
    except OSError:
        return None
    return None if ipaddress.ip_address(address).is_loopback else address


@pytest.mark.parametrize(
    ("text", "own"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("0.0.0.0", True),
        ("0.0.0.7", True),
        ("::", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("198.51.100.7", False),
        ("8.8.8.8", False),
        ("2001:db8::7", False),
        ("::ffff:8.8.8.8", False),
    ],
)
def test_this_hosts_own_addresses(text: str, own: bool) -> None:
    assert is_this_host(ipaddress.ip_address(text)) is own


def test_an_interfaces_address_is_this_hosts() -> None:
    address = interface_address()
    require_service(address is not None, "an interface address besides loopback")
    assert address is not None
    assert is_this_host(ipaddress.ip_address(address))
    assert is_this_host(ipaddress.ip_address(f"::ffff:{address}"))

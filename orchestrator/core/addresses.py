"""Which network addresses are public, and which are this host's own: the rules every path out
of the host shares (a URL block a person pastes, ``orchestrator/run/url_fetch.py``; the
sandbox's egress proxy, ``orchestrator/sandbox/egress/decision.py``).

An address is public unless it lies in one of the blocks of the tables below (the IANA
special-purpose registries for IPv4 and IPv6, multicast, and the space set aside or returned),
and an IPv6 one only within 2000::/3, the space allocated for global unicast.  The tables, not
``ipaddress.is_global``, decide: its answer changes between Python versions (3.11's calls
fec0::1, 224.0.0.1 and ff02::1 global).  An IPv6 address which carries an IPv4 one
(IPv4-mapped, NAT64, 6to4, Teredo, SIIT) is judged by the IPv4 addresses it carries: a
translator or a tunnel on the way hands the connection to them.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import time

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # ::a.b.c.d (deprecated; :: and ::1 among them)
_IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")  # ::ffff:0:a.b.c.d (SIIT)
_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
# Where RFC 6052 puts the IPv4 address for the prefix lengths that fit in the local-use /48: the
# bytes of the IPv6 address (byte 8, the "u" octet, is always skipped).
_NAT64_LOCAL_USE_PLACES = ((6, 7, 9, 10), (7, 9, 10, 11), (9, 10, 11, 12), (12, 13, 14, 15))

# IPv4 that is not public: the IANA IPv4 Special-Purpose Address Registry's blocks that are not
# globally reachable, multicast and the reserved space.  192.0.0.0/24 is not public as a whole:
# its two globally reachable addresses, 192.0.0.9 (PCP anycast) and 192.0.0.10 (TURN anycast),
# reach the nearest such server, the host's own gateway or its provider's, no destination a
# sandbox has any business with.  The registry's other globally reachable blocks (AS112's
# 192.31.196.0/24 and 192.175.48.0/24, AMT's 192.52.193.0/24) are public.
_NOT_PUBLIC_V4 = tuple(
    ipaddress.IPv4Network(block)
    for block in (
        "0.0.0.0/8",  # "this network" (RFC 791); a connection to 0.0.0.0 reaches this host
        "10.0.0.0/8",  # private use (RFC 1918)
        "100.64.0.0/10",  # shared address space, carrier-grade NAT (RFC 6598)
        "127.0.0.0/8",  # loopback (RFC 1122)
        "169.254.0.0/16",  # link-local (RFC 3927); the cloud metadata services live here
        "172.16.0.0/12",  # private use (RFC 1918)
        "192.0.0.0/24",  # IETF protocol assignments (RFC 6890), all of it (above)
        "192.0.2.0/24",  # documentation, TEST-NET-1 (RFC 5737)
        "192.88.99.0/24",  # 6to4 relay anycast, deprecated (RFC 7526): the nearest relay
        "192.168.0.0/16",  # private use (RFC 1918)
        "198.18.0.0/15",  # benchmarking (RFC 2544)
        "198.51.100.0/24",  # documentation, TEST-NET-2 (RFC 5737)
        "203.0.113.0/24",  # documentation, TEST-NET-3 (RFC 5737)
        "224.0.0.0/4",  # multicast (RFC 5771), MCAST-TEST-NET 233.252.0.0/24 among it
        "240.0.0.0/4",  # reserved (RFC 1112)
        "255.255.255.255/32",  # limited broadcast (RFC 919), inside 240/4 but named for itself
    )
)

# "This network" (RFC 791): whatever of it a connection names, it reaches this host.
_THIS_NETWORK_V4 = ipaddress.IPv4Network("0.0.0.0/8")
# IPv6 global unicast: the only space allocated for it (RFC 4291 and IANA's IPv6 address space).
_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")

# IPv6 that is not public: the IANA IPv6 Special-Purpose Address Registry's blocks that are not
# globally reachable, and the space set aside or returned.  Most lie outside 2000::/3 and so are
# refused anyway; they are named so that the table reads as the registry does.
_NOT_PUBLIC_V6 = tuple(
    ipaddress.IPv6Network(block)
    for block in (
        "::/8",  # reserved by the IETF (RFC 4291): ::, ::1 and the IPv4-carrying forms (judged before)
        "100::/64",  # discard-only (RFC 6666)
        "100:0:0:1::/64",  # dummy prefix (RFC 9780)
        "2001::/23",  # IETF protocol assignments (RFC 2928), but the blocks of _PUBLIC_INSIDE_V6
        "2001:1::1/128",  # PCP anycast (RFC 7723): the nearest PCP server, the host's gateway
        "2001:1::2/128",  # TURN anycast (RFC 8155): likewise
        "2001:1::3/128",  # DNS-SD SRP anycast (RFC 9665): likewise
        "2001:2::/48",  # benchmarking (RFC 5180)
        "2001:10::/28",  # ORCHID, deprecated (RFC 4843)
        "2001:db8::/32",  # documentation (RFC 3849)
        "3fff::/20",  # documentation (RFC 9637)
        "3ffe::/16",  # the 6bone's, returned (RFC 3701)
        "5f00::/16",  # segment routing (SRv6) SIDs (RFC 9602)
        "fc00::/7",  # unique local (RFC 4193)
        "fe80::/10",  # link-local (RFC 4291)
        "fec0::/10",  # site-local, deprecated (RFC 3879)
        "ff00::/8",  # multicast (RFC 4291)
    )
)
# Globally reachable blocks inside 2001::/23, as the registry marks them.
_PUBLIC_INSIDE_V6 = tuple(
    ipaddress.IPv6Network(block)
    for block in (
        "2001:3::/32",  # AMT (RFC 7450)
        "2001:4:112::/48",  # AS112-v6 (RFC 7535)
        "2001:20::/28",  # ORCHIDv2 (RFC 7343)
        "2001:30::/28",  # drone remote ID entity tags (RFC 9374)
    )
)


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address] | None:
    """The IPv4 addresses an IPv6 address stands for, when it is one of the forms that carry one
    (whoever connects to it reaches, through a translator or a tunnel, that IPv4 address), else None."""
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if address.sixtofour is not None:  # 2002::/16: the tunnel's end is bits 16-47
        return [address.sixtofour]
    if address.teredo is not None:  # 2001::/32: the server, and the client (its bits inverted)
        return list(address.teredo)
    packed = address.packed
    if address in _IPV4_COMPATIBLE or address in _IPV4_TRANSLATED or address in _NAT64_WELL_KNOWN:
        return [ipaddress.IPv4Address(packed[12:])]
    if address in _NAT64_LOCAL_USE:
        # The operator chooses the prefix length, and so where the IPv4 address sits; the address
        # does not say which: every place is a candidate.
        return [ipaddress.IPv4Address(bytes(packed[i] for i in place)) for place in _NAT64_LOCAL_USE_PLACES]
    return None


def is_public(address: IPAddress) -> bool:
    """Whether ``address`` is a public one (the module's doc), the same on every Python."""
    if isinstance(address, ipaddress.IPv4Address):
        return not any(address in block for block in _NOT_PUBLIC_V4)
    # An IPv6 address that carries an IPv4 one (::ffff:127.0.0.1, 64:ff9b::10.0.0.1, 2002:a00:1::,
    # a Teredo address...) is judged by the IPv4 addresses it carries: a translator or a tunnel on
    # the way hands the connection to them.
    embedded = embedded_ipv4(address)
    if embedded is not None:
        return all(is_public(v4) for v4 in embedded)
    if any(address in block for block in _PUBLIC_INSIDE_V6):
        return True
    if any(address in block for block in _NOT_PUBLIC_V6):
        return False
    return address in _GLOBAL_UNICAST_V6


# -- this host's own addresses --------------------------------------------------------------

# How long an answer of is_this_host holds: an interface's addresses change seldom (DHCP, a VPN
# coming up), and a proxy asks once per request.
_LOCAL_TTL_S = 30.0
_LOCAL_CACHE_MAX = 4096
_local_cache: dict[IPAddress, tuple[float, bool]] = {}
# bind() says the address is not this host's (or the host has no such family at all).
_NOT_LOCAL_ERRNOS = frozenset({errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT})


def is_this_host(address: IPAddress) -> bool:
    """Whether a connection to ``address`` reaches this host itself: the unspecified addresses
    (0.0.0.0/8, ::), loopback, an address bound to one of its interfaces (its public one too),
    and, when that cannot be told (a link-local address without its interface), yes."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # the kernel connects ::ffff:a.b.c.d to a.b.c.d
    if address.is_loopback or address.is_unspecified or address in _THIS_NETWORK_V4:
        return True
    now = time.monotonic()
    cached = _local_cache.get(address)
    if cached is not None and now - cached[0] < _LOCAL_TTL_S:
        return cached[1]
    if len(_local_cache) >= _LOCAL_CACHE_MAX:
        _local_cache.clear()
    local = _bindable(address)
    _local_cache[address] = (now, local)
    return local


def _bindable(address: IPAddress) -> bool:
    # The kernel lets a socket bind only to an address of this host (an interface's, a broadcast
    # one, or any with net.ipv4.ip_nonlocal_bind set: then every address counts as this host's,
    # which errs on the closed side); no list of interfaces to read, or to keep current.
    family = socket.AF_INET6 if isinstance(address, ipaddress.IPv6Address) else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(address), 0))
    except OSError as exc:
        return exc.errno not in _NOT_LOCAL_ERRNOS
    return True

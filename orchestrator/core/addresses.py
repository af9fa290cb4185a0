"""Which network addresses are public: the rule every path out of the host shares (a URL block
a person pastes, ``orchestrator/run/url_fetch.py``; the sandbox's egress proxy,
``orchestrator/sandbox/egress.py``).

An address is public when ``ipaddress`` calls it global, except that an IPv6 address which
carries an IPv4 one (IPv4-mapped, NAT64, 6to4, Teredo, SIIT) is judged by the IPv4 addresses
it carries: a translator or a tunnel on the way hands the connection to them.
"""

from __future__ import annotations

import ipaddress

_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # ::a.b.c.d (deprecated; :: and ::1 among them)
_IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")  # ::ffff:0:a.b.c.d (SIIT)
_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
# Where RFC 6052 puts the IPv4 address for the prefix lengths that fit in the local-use /48: the
# bytes of the IPv6 address (byte 8, the "u" octet, is always skipped).
_NAT64_LOCAL_USE_PLACES = ((6, 7, 9, 10), (7, 9, 10, 11), (9, 10, 11, 12), (12, 13, 14, 15))


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


def is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    # An IPv6 address that carries an IPv4 one (::ffff:127.0.0.1, 64:ff9b::10.0.0.1, 2002:a00:1::,
    # a Teredo address...) is judged by the IPv4 addresses it carries: a translator or a tunnel on
    # the way hands the connection to them.  ipaddress's own verdict on these ranges is no guide
    # (3.11's calls ::ffff:1.1.1.1 non-global and 64:ff9b::10.0.0.1 global).
    if isinstance(address, ipaddress.IPv6Address):
        embedded = embedded_ipv4(address)
        if embedded is not None:
            return all(v4.is_global for v4 in embedded)
    return address.is_global

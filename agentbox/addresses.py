"""Which IP addresses a callback may be sent to: the SSRF rules.

A callback URL comes from whoever sent the event, so agentbox must not become
a way to reach this machine, its network or a cloud metadata service. Before
every delivery the host is resolved and every address it resolves to must be
public (globally routable unicast). Addresses that reach an IPv4 host
(IPv4-mapped, IPv4-translated, NAT64) are judged by the IPv4 address inside;
the deprecated IPv4-compatible form is refused outright. Other IPv6 addresses
must be in 2000::/3, the only block assigned for global unicast.
"""

from __future__ import annotations

import ipaddress
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from urllib.parse import urlsplit

IPAddress = IPv4Address | IPv6Address

# Never a callback destination (unless the origin is allowlisted as a local one).
REFUSED_V4 = tuple(IPv4Network(n) for n in (
    "0.0.0.0/8",        # "this network"
    "10.0.0.0/8",       # RFC 1918
    "100.64.0.0/10",    # carrier-grade NAT
    "127.0.0.0/8",      # loopback
    "169.254.0.0/16",   # link-local, incl. 169.254.169.254 (cloud metadata)
    "172.16.0.0/12",    # RFC 1918
    "192.0.0.0/24",     # IETF protocol assignments
    "192.0.2.0/24",     # documentation
    "192.88.99.0/24",   # 6to4 relay anycast
    "192.168.0.0/16",   # RFC 1918
    "198.18.0.0/15",    # benchmarking
    "198.51.100.0/24",  # documentation
    "203.0.113.0/24",   # documentation
    "224.0.0.0/4",      # multicast
    "240.0.0.0/4",      # reserved, incl. broadcast
))
REFUSED_V6 = tuple(IPv6Network(n) for n in (
    "::/96",            # unspecified, loopback and the deprecated IPv4-compatible form
    "::ffff:0:0/96",    # IPv4-mapped (judged below)
    "64:ff9b::/96",     # NAT64 (judged below)
    "64:ff9b:1::/48",   # local-use NAT64
    "100::/64",         # discard
    "2001::/23",        # IETF protocol assignments, incl. Teredo
    "2001:db8::/32",    # documentation
    "3fff::/20",        # documentation
    "2002::/16",        # 6to4: tunnels to arbitrary IPv4 addresses
    "fc00::/7",         # unique-local
    "fe80::/10",        # link-local
    "fec0::/10",        # site-local (deprecated)
    "ff00::/8",         # multicast
))
NAT64 = IPv6Network("64:ff9b::/96")
IPV4_TRANSLATED = IPv6Network("::ffff:0:0:0/96")
GLOBAL_UNICAST_V6 = IPv6Network("2000::/3")


def embedded_ipv4(address: IPv6Address) -> IPv4Address | None:
    """The IPv4 host an IPv6 address reaches (IPv4-mapped, -translated or NAT64), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in NAT64 or address in IPV4_TRANSLATED:
        return IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


def is_public(address: IPAddress) -> bool:
    """True when `address` is globally routable unicast: a permitted destination."""
    if isinstance(address, IPv6Address):
        if address.scope_id:
            return False  # a zone index only makes sense on a local link
        inner = embedded_ipv4(address)
        if inner is not None:
            return is_public(inner)
        if address not in GLOBAL_UNICAST_V6:
            return False
        refused: tuple[IPv4Network, ...] | tuple[IPv6Network, ...] = REFUSED_V6
    else:
        refused = REFUSED_V4
    if any(address in network for network in refused):
        return False
    return address.is_global and not address.is_multicast


def parse_address(text: str) -> IPAddress | None:
    """`text` as an IP address (IPv6 with or without brackets), or None for a name."""
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None

def origin_of(url: str) -> str:
    """scheme://host:port of a URL, the port always written: how destinations are keyed."""
    parts = urlsplit(url)
    default = 443 if parts.scheme == "https" else 80
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}:{default if parts.port is None else parts.port}"

"""Which addresses webhook deliveries may connect to (the SSRF guard). Pure logic.

By default only globally routable unicast addresses are allowed. Refused: loopback, private
(RFC 1918), link-local (169.254.0.0/16, including the cloud metadata address 169.254.169.254),
CGNAT (100.64.0.0/10), multicast, reserved, unspecified, documentation and benchmark ranges, and
IPv6 ULA (fc00::/7) and link-local (fe80::/10). IPv4-mapped and NAT64 IPv6 addresses are judged by
the IPv4 address inside them. ``PIPELINE_ALLOWED_NETWORKS`` (CIDRs) opens exceptions.

    >>> AddressPolicy().allows("169.254.169.254")
    False
    >>> AddressPolicy.parse("127.0.0.0/8").allows("127.0.0.1")
    True
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["AddressPolicy", "IPAddress", "IPNetwork", "blocked_reason"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _unwrap(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def blocked_reason(address: IPAddress) -> str | None:
    """Why ``address`` is refused by default (``None``: it is a public unicast address)."""
    address = _unwrap(address)
    checks = (
        (address.is_unspecified, "unspecified"),
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local"),
        (address.is_multicast, "multicast"),
        (isinstance(address, ipaddress.IPv4Address) and address in _CGNAT, "CGNAT"),
        (address.is_private, "private"),
        (address.is_reserved, "reserved"),
        (not address.is_global, "not globally routable"),
    )
    return next((reason for blocked, reason in checks if blocked), None)


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    allowed: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, cidrs: str | Iterable[str]) -> AddressPolicy:
        """From ``"127.0.0.0/8,10.0.0.0/8"`` or a list; ``ValueError`` names a bad entry."""
        items = cidrs.split(",") if isinstance(cidrs, str) else list(cidrs)
        networks = []
        for item in (i.strip() for i in items):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(
                    f"PIPELINE_ALLOWED_NETWORKS: {item!r} is not a network in CIDR form, "
                    "e.g. 127.0.0.0/8 or fd00::/8"
                ) from None
        return cls(tuple(networks))

    def refusal(self, host: str) -> str | None:
        """Why connecting to the IP address ``host`` is refused, or ``None`` if it is allowed."""
        try:
            address = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return f"{host!r} is not an IP address"
        if any(_unwrap(address) in net or address in net for net in self.allowed):
            return None
        reason = blocked_reason(address)
        return None if reason is None else f"{address} is in a blocked range ({reason})"

    def allows(self, host: str) -> bool:
        return self.refusal(host) is None

"""The SSRF guard's resolver: host names resolve only to addresses the ``AddressPolicy``
allows (so the address checked is the address connected to), except a configured proxy's, on
its port only."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from pipeline.core.address_policy import AddressPolicy

__all__ = ["BlockedAddressError", "GuardedResolver", "is_ip_literal"]


class BlockedAddressError(OSError):
    """The address is refused by the SSRF guard."""


class GuardedResolver(AbstractResolver):
    """Resolves with aiohttp's threaded resolver, then drops addresses the policy refuses; a
    configured proxy's host (``trust``) is not judged, and its addresses are remembered in
    ``trusted`` for the socket check."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy
        self._inner = aiohttp.ThreadedResolver()
        self._trusted_hosts: set[tuple[str, int]] = set()
        #: (address, port) of the configured proxies: the socket check lets them through, and
        #: nothing else on those machines.
        self.trusted: set[tuple[str, int]] = set()

    def trust(self, proxy: str) -> None:
        """``proxy`` (a URL) is a proxy the operator configured: connected to whatever its
        address, on its port only."""
        parts = urlsplit(proxy)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if (host, port) not in self._trusted_hosts:
            self._trusted_hosts.add((host, port))
            if is_ip_literal(host):
                self.trusted.add((host, port))

    async def every_address(self, host: str) -> list[str]:
        """Every address ``host`` resolves to, unjudged (``OSError`` when it does not)."""
        return [r["host"] for r in await self._inner.resolve(host, 0, socket.AF_UNSPEC)]

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        if (host, port) in self._trusted_hosts:
            self.trusted.update((r["host"], port) for r in results)
            return results
        allowed = [r for r in results if self._policy.allows(r["host"])]
        if not allowed:
            refusals = sorted({str(self._policy.refusal(r["host"])) for r in results})
            raise BlockedAddressError(
                f"{host} resolves only to blocked addresses: {'; '.join(refusals)}"
            )
        return allowed

    async def close(self) -> None:
        await self._inner.close()


def is_ip_literal(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host.split("%", 1)[0])
        return True
    except OSError:
        return False

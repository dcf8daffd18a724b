"""The SSRF guard around a proxy: a proxy is trusted on its port only, and behind a proxy a
target with any blocked address is refused (the proxy may fall back to that one)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from pipeline.core.address_policy import AddressPolicy
from pipeline.core.settings import Settings
from pipeline.http.address_guard import BlockedAddressError, GuardedResolver
from pipeline.http.sender import WebhookSender, merged_headers

ADDRESSES = {"squid.internal": ["10.0.0.5"], "mixed.example": ["93.184.216.34", "169.254.169.254"]}


class FakeInner:
    async def resolve(self, host: str, port: int = 0, family: Any = socket.AF_INET) -> list[Any]:
        return [{"host": a, "port": port} for a in ADDRESSES[host]]

    async def close(self) -> None:
        pass


def guarded() -> GuardedResolver:
    async def make() -> GuardedResolver:
        resolver = GuardedResolver(AddressPolicy())
        resolver._inner = FakeInner()  # type: ignore[assignment]
        return resolver

    return asyncio.run(make())


def test_a_proxy_is_trusted_on_its_port_only() -> None:
    resolver = guarded()
    resolver.trust("http://squid.internal:3128")

    async def go() -> None:
        assert [r["host"] for r in await resolver.resolve("squid.internal", 3128)] == ["10.0.0.5"]
        assert resolver.trusted == {("10.0.0.5", 3128)}
        try:
            await resolver.resolve("squid.internal", 8080)  # its other ports: judged as any host
        except BlockedAddressError:
            return
        raise AssertionError("the proxy's host on another port was not judged")

    asyncio.run(go())


def test_behind_a_proxy_any_blocked_address_refuses_the_target() -> None:
    async def go() -> str | None:
        sender = await WebhookSender(Settings()).start()
        try:
            assert sender._resolver is not None
            sender._resolver._inner = FakeInner()  # type: ignore[assignment]
            return await sender._refusal_behind_proxy("mixed.example")
        finally:
            await sender.aclose()

    refusal = asyncio.run(go())
    assert refusal is not None and "169.254.169.254" in refusal


def test_a_static_header_never_rides_beside_ours_whatever_its_case() -> None:
    merged = merged_headers(
        {"authorization": "Basic old", "X-Team": "a"}, {"Authorization": "Bearer tok"}
    )
    assert merged == {"X-Team": "a", "Authorization": "Bearer tok"}

"""``WebhookSender.failure_of``: a proxy's refusals are connection failures (retried)."""

from __future__ import annotations

import aiohttp
from yarl import URL

from pipeline.core.outcomes import Failure
from pipeline.core.settings import Settings
from pipeline.http.sender import WebhookSender


def test_a_proxy_that_refuses_is_a_connection_failure() -> None:
    sender = WebhookSender(Settings())
    info = aiohttp.RequestInfo(URL("http://proxy:3128"), "CONNECT", {}, URL("http://proxy:3128"))  # type: ignore[arg-type]
    refused = aiohttp.ClientHttpProxyError(
        info, (), status=407, message="Proxy Authentication Required"
    )
    failure, detail = sender.failure_of(refused)
    assert failure is Failure.CONNECTION_ERROR
    assert detail == "proxy answered 407: Proxy Authentication Required"
    unreachable = aiohttp.ClientProxyConnectionError(
        aiohttp.client_reqrep.ConnectionKey("proxy", 3128, False, True, None, None, None),  # type: ignore[attr-defined]
        OSError(111, "Connection refused"),
    )
    assert sender.failure_of(unreachable)[0] is Failure.CONNECTION_ERROR

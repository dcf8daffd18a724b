"""The webhook request (seed §2.2, §4.1), sent with aiohttp.

One ``ClientSession`` per worker, shared by every destination: connections are pooled and reused,
with at most ``max_connections_per_host`` to one host. Redirects are not followed. TLS certificates
are verified against the system's trust store (``SSL_CERT_FILE`` adds one): a receiver with a
self-signed certificate fails the handshake, so no request is ever sent to it.

aiohttp and not httpx on this path: with 64 requests in flight httpx 0.28 falls to about 130
requests/s on this machine while aiohttp sends 11,000-15,000 (docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import ssl
import time

import aiohttp

from ._config import Destination
from ._outcomes import Failure, UrlResult, classify, parse_retry_after
from ._settings import Settings
from ._signing import SIGNATURE_HEADER, sign

__all__ = ["WebhookSender", "USER_AGENT"]

#: Seed §2.2 and §9.3: ``<product_token>/1.0``.
USER_AGENT = "pipeline-webhooks/1.0"
#: How much of a response body we read (and keep a little of, for the dead-letter record).
_MAX_RESPONSE_BYTES = 64 * 1024
_DETAIL_CHARS = 200


class WebhookSender:
    def __init__(self, settings: Settings, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self._settings = settings
        self._ssl = ssl_context or ssl.create_default_context()
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> WebhookSender:
        connector = aiohttp.TCPConnector(
            limit=0,
            limit_per_host=self._settings.max_connections_per_host,
            ssl=self._ssl,
            ttl_dns_cache=60,
            enable_cleanup_closed=True,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self._settings.delivery_timeout),
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding",),
        )
        return self

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @staticmethod
    def headers_for(
        destination: Destination, static: dict[str, str], body: bytes
    ) -> dict[str, str]:
        headers = dict(static)
        headers["Content-Type"] = "application/json"
        headers["User-Agent"] = USER_AGENT
        if destination.shared_secret:
            headers[SIGNATURE_HEADER] = sign(body, destination.shared_secret)
        return headers

    async def attempt(self, destination: Destination, body: bytes) -> list[UrlResult]:
        """POST ``body`` to every webhook of ``destination`` at once."""
        return list(
            await asyncio.gather(
                *(
                    self.post(hook.url, self.headers_for(destination, hook.headers, body), body)
                    for hook in destination.webhooks
                )
            )
        )

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> UrlResult:
        assert self._session is not None, "WebhookSender.start() was not awaited"
        started = time.monotonic()

        def result(
            failure: Failure | None, status: int | None = None, detail: str = ""
        ) -> UrlResult:
            return UrlResult(
                url, status, failure, detail[:_DETAIL_CHARS], time.monotonic() - started
            )

        try:
            async with self._session.post(
                url, data=body, headers=headers, allow_redirects=False
            ) as response:
                text = await response.content.read(_MAX_RESPONSE_BYTES)
                status = response.status
                failure = classify(status)
                retry_after = None
                if status in (429, 503):
                    retry_after = parse_retry_after(
                        response.headers.get("Retry-After"), time.time()
                    )
                detail = "" if failure is None else text.decode("utf-8", "replace")
                return UrlResult(
                    url,
                    status,
                    failure,
                    detail[:_DETAIL_CHARS],
                    time.monotonic() - started,
                    retry_after,
                )
        except TimeoutError:
            return result(
                Failure.TIMEOUT, detail=f"no answer within {self._settings.delivery_timeout:g} s"
            )
        except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError) as exc:
            return result(Failure.TLS_ERROR, detail=_describe(exc))
        except aiohttp.InvalidURL as exc:
            return result(Failure.INVALID_URL, detail=_describe(exc))
        except (aiohttp.ClientResponseError, aiohttp.ClientPayloadError) as exc:
            return result(Failure.BAD_RESPONSE, detail=_describe(exc))
        except (aiohttp.ClientError, OSError) as exc:
            return result(Failure.CONNECTION_ERROR, detail=_describe(exc))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"

"""``Tokens``: OAuth2 client-credentials tokens, shared, refreshed, dropped on a 401; driven by a
token endpoint stand-in and a clock the test moves."""

from __future__ import annotations

import asyncio
import base64
from urllib.parse import unquote

import orjson
import pytest

from pipeline.core.config import OAuth2
from pipeline.http.oauth2 import FAILURE_HOLD, TokenError, Tokens

OAUTH = OAuth2(
    token_url="https://auth.example/token", client_id="id:1", client_secret="s3cr&t", scope="hooks"
)


class Endpoint:
    def __init__(self) -> None:
        self.asked: list[tuple[dict[str, str], dict[str, str]]] = []
        self.answer: tuple[int, bytes] | None = None
        self.lifetime = 3600

    async def post(
        self, url: str, form: dict[str, str], headers: dict[str, str]
    ) -> tuple[int, bytes]:
        assert url == OAUTH.token_url
        self.asked.append((form, headers))
        await asyncio.sleep(0.01)  # others wait meanwhile
        if self.answer is not None:
            return self.answer
        body = {"access_token": f"tok-{len(self.asked)}", "expires_in": self.lifetime}
        return 200, orjson.dumps(body)


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_fetch_for_many_requests_with_the_client_authenticated() -> None:
    endpoint = Endpoint()
    tokens = Tokens(endpoint.post)

    async def go() -> list[str]:
        return list(await asyncio.gather(*(tokens.token(OAUTH) for _ in range(100))))

    assert asyncio.run(go()) == ["tok-1"] * 100
    [(form, headers)] = endpoint.asked
    assert form == {"grant_type": "client_credentials", "scope": "hooks"}
    login = base64.b64decode(headers["Authorization"].removeprefix("Basic ")).decode()
    assert [unquote(part) for part in login.split(":")] == ["id:1", "s3cr&t"]  # RFC 6749 2.3.1


def test_a_token_is_refreshed_before_it_expires_and_after_a_401() -> None:
    endpoint, clock = Endpoint(), Clock()
    endpoint.lifetime = 100  # refreshed 10 s before its end (a tenth of its life)
    tokens = Tokens(endpoint.post, clock)

    async def go() -> list[str]:
        got = [await tokens.token(OAUTH)]
        clock.now += 89
        got.append(await tokens.token(OAUTH))
        clock.now += 2  # 91 s: within 10 s of the end
        got.append(await tokens.token(OAUTH))
        tokens.spoiled(OAUTH, "tok-1")  # an old token's 401 drops nothing
        got.append(await tokens.token(OAUTH))
        tokens.spoiled(OAUTH, "tok-2")
        got.append(await tokens.token(OAUTH))
        return got

    assert asyncio.run(go()) == ["tok-1", "tok-1", "tok-2", "tok-2", "tok-3"]


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ((500, b"oops"), "token endpoint https://auth.example/token answered 500"),
        ((401, b'{"error":"invalid_client"}'), "answered 401 (invalid_client)"),
        ((200, b'{"token_type":"bearer"}'), "answered without an access_token"),
    ],
)
def test_a_failing_endpoint_is_an_error_in_words_without_secrets(
    answer: tuple[int, bytes], said: str
) -> None:
    endpoint, clock = Endpoint(), Clock()
    endpoint.answer = answer
    tokens = Tokens(endpoint.post, clock)

    async def go() -> None:
        for _ in range(3):  # within FAILURE_HOLD: one request to the endpoint, not three
            with pytest.raises(
                TokenError, match=said.replace("(", r"\(").replace(")", r"\)")
            ) as caught:
                await tokens.token(OAUTH)
            assert "s3cr" not in str(caught.value)
        assert len(endpoint.asked) == 1
        clock.now += FAILURE_HOLD
        endpoint.answer = None
        assert await tokens.token(OAUTH) == "tok-2"

    asyncio.run(go())


def test_an_endpoint_that_does_not_answer_is_an_error() -> None:
    async def refuse(url: str, form: dict[str, str], headers: dict[str, str]) -> tuple[int, bytes]:
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(TokenError, match="did not answer: ConnectionRefusedError"):
        asyncio.run(Tokens(refuse).token(OAUTH))

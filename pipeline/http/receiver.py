"""``pipeline receiver``: a webhook receiver that verifies ``X-Signature`` and prints each call.

With ``--secret`` a request whose ``X-Signature`` does not match the body is answered 401 and
reported; so is one whose Standard Webhooks headers (when present) do not match or carry a
timestamp more than 5 minutes from this machine's clock (a replayed capture). ``--secret`` given
more than once (a rotation: the new secret and the old) accepts a request signed with any of them.
A batching destination's request (a JSON array) is described as its calls.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

import orjson
from aiohttp import web

from pipeline.core.signing import (
    SIGNATURE_HEADER,
    verify,
    verify_ed25519,
    verify_standard_webhooks,
)

__all__ = ["ReceivedCall", "make_receiver_app", "describe"]


@dataclass(frozen=True, slots=True)
class ReceivedCall:
    path: str
    headers: dict[str, str]
    body: bytes
    signature_ok: bool | None  # None: no secret to check against

    @property
    def payload(self) -> dict[str, object]:
        value = orjson.loads(self.body)
        return value if isinstance(value, dict) else {}

    @property
    def calls(self) -> list[dict[str, object]]:
        """The calls the body carries: one, or a batch's array of them."""
        value = orjson.loads(self.body)
        items = value if isinstance(value, list) else [value]
        return [item for item in items if isinstance(item, dict)]


@dataclass
class ReceiverStats:
    by_type: Counter[str] = field(default_factory=Counter)
    bad_signatures: int = 0


def describe(call: ReceivedCall) -> str:
    """One line per call: type, who, what, and the signature verdict."""
    try:
        payload = call.payload
        if not payload and (calls := call.calls):
            verdict = _VERDICTS[call.signature_ok]
            return f"batch of {len(calls)} calls  [{verdict}] {call.path}"
    except orjson.JSONDecodeError:
        return f"{call.path}: body is not JSON ({len(call.body)} bytes)"
    kind = str(payload.get("type", "?"))
    who = payload.get("userId") or payload.get("anonymousId") or "-"
    what = payload.get("event") or payload.get("name") or payload.get("groupId") or ""
    if kind == "alias":
        what = f"{payload.get('Previous ID')} → {payload.get('User ID')}"
    verdict = _VERDICTS[call.signature_ok]
    what_text = f" {what!s}" if what else ""
    return f"{kind:<8} {who!s}{what_text}  [{verdict}] {call.path}"


_VERDICTS = {None: "unsigned", True: "signature ok", False: "SIGNATURE INVALID"}


def make_receiver_app(
    *,
    secret: str | None = None,
    secrets: Sequence[str] = (),
    public_key: str | None = None,
    status: int = 200,
    out: TextIO | None = sys.stdout,
    verbose: bool = False,
    on_call: Callable[[ReceivedCall], None] | None = None,
) -> web.Application:
    stats = ReceiverStats()
    keys = [*([] if secret is None else [secret]), *secrets]

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        signature_ok = None  # every check asked for must pass
        now = time.time()
        if public_key is not None:  # Ed25519 (v1a): no secret needed
            signature_ok = verify_ed25519(request.headers, body, public_key, now=now)
        if keys:
            given = request.headers.get(SIGNATURE_HEADER)
            hmac_ok = any(verify(body, key, given) for key in keys)
            if "webhook-signature" in request.headers and not public_key:
                # Standard Webhooks: the signature must match AND be fresh (replay protection).
                hmac_ok = hmac_ok and any(
                    verify_standard_webhooks(request.headers, body, key, now=now) for key in keys
                )
            signature_ok = hmac_ok and signature_ok is not False
        call = ReceivedCall(request.path, dict(request.headers), body, signature_ok)
        if on_call is not None:
            on_call(call)
        try:
            for one in call.calls:
                stats.by_type[str(one.get("type"))] += 1
        except orjson.JSONDecodeError:
            stats.by_type["invalid"] += 1
        if out is not None:
            print(describe(call), file=out, flush=True)
            if verbose:
                print("  " + body.decode("utf-8", "replace"), file=out, flush=True)
        if signature_ok is False:
            stats.bad_signatures += 1
            return web.json_response({"error": "signature mismatch"}, status=401)
        return web.json_response({"ok": True}, status=status)

    async def counts(_: web.Request) -> web.Response:
        return web.json_response(
            {"calls": dict(stats.by_type), "bad_signatures": stats.bad_signatures}
        )

    app = web.Application(client_max_size=4 * 1024 * 1024)
    app.router.add_get("/_stats", counts)
    app.router.add_route("*", "/{tail:.*}", receive)
    return app

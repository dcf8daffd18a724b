"""A minimal HTTP/1.1 responder for benchmarks: one asyncio ``Protocol``, no framework.

    python -m bench._receiver --mode ok                # 200 at once
    python -m bench._receiver --mode ok --delay 0.1    # 200 after 100 ms
    python -m bench._receiver --mode hang              # reads the request, never answers
    python -m bench._receiver --mode fail-first        # 500 to a messageId's first attempt, then 200
    python -m bench._receiver --fail-user slow --fail-for 30   # 503 to each user "slow…" for 30 s
    python -m bench._receiver --admit 100              # 429 (no Retry-After) past 100 a second

Prints its port on the first line of stdout. ``GET /__stats`` answers JSON (requests, answered
2xx, first/last 2xx time); ``GET /__reset`` zeroes the counters; ``GET /__arrivals`` returns every
POST as ``[messageId, attempt, epoch seconds]`` (``--log`` only).

``--fail-user PREFIX``: each user whose userId starts with PREFIX is answered 503 (at once,
whatever the mode) for ``--fail-for`` seconds from that user's first request, then 200. Those
users' requests are left out of ``/__stats`` (its figures are the other users'); ``GET /__failing``
answers how many were refused and ``[userId, messageId, epoch seconds]`` of each answered 200, in
the order answered (kept across ``/__reset``, as each user's window is).

``--admit N``: at most N requests are answered 2xx in any second (a sliding window); the others
get 429 without ``Retry-After`` and count in ``/__stats`` as ``throttled``, not as answered.

Why not aiohttp.web: a single-process aiohttp server answered ~5,000 req/s here and was the
bottleneck of the first end-to-end benchmark. This responder does the least an HTTP/1.1 server
must (keep-alive, Content-Length bodies), so the client side is what gets measured. The same
receiver serves the raw aiohttp baseline, the naive baseline and the pipeline, so ratios are fair.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import socket
import sys
import time

import orjson

_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
_FAIL = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nfail"
_UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nfail"
_TOO_MANY = b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 4\r\n\r\nslow"
_MESSAGE_ID = b'"messageId":"'
_USER_ID = b'"userId":"'


class Stats:
    def __init__(self) -> None:
        self.reset()
        self.arrivals: list[tuple[str, int, float]] = []
        self.attempts: dict[str, int] = {}
        #: ``--fail-user``: each failing user's first request (monotonic), the requests refused,
        #: and (userId, messageId, time) of those answered 200.
        self.failing_since: dict[str, float] = {}
        self.failing_refused = 0
        self.failing_answered: list[tuple[str, str, float]] = []

    def reset(self) -> None:
        self.requests = 0
        self.answered = 0
        #: Calls in the requests answered 2xx (a batch's JSON array carries many).
        self.calls = 0
        self.throttled = 0
        #: ``--admit``: when the requests admitted in the last second were (monotonic).
        self.admitted: collections.deque[float] = collections.deque()
        self.first = 0.0
        self.last = 0.0

    def as_json(self) -> bytes:
        return orjson.dumps(
            {
                "requests": self.requests,
                "answered": self.answered,
                "calls": self.calls,
                "throttled": self.throttled,
                "first": self.first,
                "last": self.last,
            }
        )


class Responder(asyncio.Protocol):
    def __init__(self, args: argparse.Namespace, stats: Stats) -> None:
        self.args = args
        self.stats = stats
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buffer[:end]
            length = 0
            at = head.lower().find(b"\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r", at + 16)
                length = int(head[at + 16 : stop if stop >= 0 else len(head)])
            total = end + 4 + length
            if len(buffer) < total:
                break
            self.request(head, buffer[end + 4 : total])
            buffer = buffer[total:]
        self.buffer = buffer

    def request(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        if head.startswith(b"GET /__"):
            path = head[4 : head.find(b" ", 4)]
            if path == b"/__reset":
                self.stats.reset()
                self.stats.arrivals.clear()
                self.stats.attempts.clear()
                payload = b"{}"
            elif path == b"/__arrivals":
                payload = orjson.dumps(self.stats.arrivals)
            elif path == b"/__failing":
                payload = orjson.dumps(
                    {
                        "refused": self.stats.failing_refused,
                        "answered": self.stats.failing_answered,
                    }
                )
            else:
                payload = self.stats.as_json()
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % len(payload)
                + payload
            )
            return
        if self.args.fail_user and self.failing(body):
            return
        stats = self.stats
        stats.requests += 1
        mode = self.args.mode
        if mode == "hang":
            return
        answer = _FAIL if mode == "fail" else _OK
        if self.args.admit and answer is _OK and not self.admit():
            stats.throttled += 1
            self.transport.write(_TOO_MANY)
            return
        if mode == "fail-first" or self.args.log:
            at = body.find(_MESSAGE_ID)
            message_id = ""
            if at >= 0:
                start = at + len(_MESSAGE_ID)
                message_id = body[start : body.find(b'"', start)].decode()
            attempt = stats.attempts.get(message_id, 0) + 1
            stats.attempts[message_id] = attempt
            if self.args.log:
                stats.arrivals.append((message_id, attempt, time.time()))
            if mode == "fail-first" and attempt == 1:
                answer = _FAIL
        if answer is _OK:
            now = time.time() + self.args.delay
            if not stats.answered:
                stats.first = now
            stats.last = now
            stats.answered += 1
            stats.calls += body.count(_MESSAGE_ID) or 1
        if self.args.delay:
            self.loop.call_later(self.args.delay, self._write, answer)
        else:
            self.transport.write(answer)

    def admit(self) -> bool:
        """``--admit``: room in the last second's window (taken if so)?"""
        window, now = self.stats.admitted, time.monotonic()
        while window and now - window[0] >= 1.0:
            window.popleft()
        if len(window) >= self.args.admit:
            return False
        window.append(now)
        return True

    def failing(self, body: bytes) -> bool:
        """Answer a failing user's request (``--fail-user``); ``False``: not a failing user's."""
        prefix = _USER_ID + self.args.fail_user.encode()
        at = body.find(prefix)
        if at < 0:
            return False
        assert self.transport is not None
        start = at + len(_USER_ID)
        user = body[start : body.find(b'"', start)].decode()
        stats, now = self.stats, time.monotonic()
        if now - stats.failing_since.setdefault(user, now) < self.args.fail_for:
            stats.failing_refused += 1
            self.transport.write(_UNAVAILABLE)
            return True
        at = body.find(_MESSAGE_ID) + len(_MESSAGE_ID)
        message_id = body[at : body.find(b'"', at)].decode()
        stats.failing_answered.append((user, message_id, time.time()))
        self.transport.write(_OK)
        return True

    def _write(self, answer: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(args: argparse.Namespace) -> None:
    stats = Stats()
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    server = await loop.create_server(lambda: Responder(args, stats), sock=sock, backlog=4096)
    print(sock.getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mode", choices=("ok", "hang", "fail", "fail-first"), default="ok")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before answering")
    parser.add_argument("--log", action="store_true", help="keep every POST's arrival time")
    parser.add_argument("--fail-user", default="", help="503 to the users of this userId prefix")
    parser.add_argument(
        "--fail-for", type=float, default=30.0, help="seconds from a failing user's first request"
    )
    parser.add_argument("--admit", type=int, default=0, help="2xx at most this many a second")
    args = parser.parse_args()
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()

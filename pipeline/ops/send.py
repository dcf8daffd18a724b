"""``pipeline send FILE.jsonl``: produce Segment-format calls, one JSON object per line.

A line's own ``writeKey`` wins over ``--write-key``; ``--source`` names the source directly. Bad
lines are reported by line number and skipped; every good line is sent, and acknowledged by Kafka
before the summary is printed.

A line is the call as a Segment library would send it: one without ``timestamp`` but with
``originalTimestamp`` (and ``sentAt``) gets its ``timestamp`` by Segment's clock-skew rule, exactly
as the ingestion API does (``pipeline.core.segment_request.correct_timestamp``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO

import orjson
from tqdm import tqdm

from pipeline.core.calls import parse_call
from pipeline.core.config import ConfigTable, shown_write_key
from pipeline.core.exceptions import BrokerUnavailable, InvalidCall
from pipeline.core.records import call_to_record
from pipeline.core.segment_request import correct_timestamp
from pipeline.core.settings import Settings
from pipeline.core.timestamps import now_ms
from pipeline.kafka.clients import topics_for
from pipeline.kafka.config_store import load_table
from pipeline.kafka.producer import AckedProducer
from pipeline.kafka.registry_codec import make_codec

__all__ = ["SendSummary", "send_lines", "open_input"]


@dataclass
class SendSummary:
    sent: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.rejected and not self.failed


def open_input(path: str) -> IO[bytes]:
    return sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115


def send_lines(
    settings: Settings,
    lines: Iterable[bytes],
    *,
    write_key: str | None = None,
    source_id: str | None = None,
    table: ConfigTable | None = None,
    progress: bool | None = None,
    timeout: float = 60.0,
) -> SendSummary:
    """Validate and produce each line; returns what was sent and what was rejected, by line."""
    started = time.monotonic()
    table = table if table is not None else load_table(settings)
    if source_id is not None and source_id not in table.sources:
        raise InvalidCall("--source", f"no source has the id {source_id!r}")
    codec = make_codec(settings)
    topic = topics_for(settings).calls
    producer = AckedProducer(settings)
    summary = SendSummary()
    # progress None: a bar only when stderr is a terminal.
    bar = tqdm(unit=" calls", disable=None if progress is None else not progress, file=sys.stderr)
    try:
        for number, line in _numbered(lines):
            try:
                raw = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                summary.rejected.append((number, f"invalid JSON: {exc}"))
                continue
            try:
                source = _source_of(raw, table, write_key, source_id)
                received_at = now_ms()
                if isinstance(raw, dict):  # anything else: parse_call names the problem
                    correct_timestamp(raw, received_at)
                call = parse_call(
                    raw, source_id=source, received_at=received_at, raw_size=len(line)
                )
            except InvalidCall as exc:
                summary.rejected.append((number, str(exc)))
                continue
            producer.produce(topic, call.key, codec.encode("Call", call_to_record(call)))
            summary.sent += 1
            bar.update()
        try:
            producer.flush(timeout)
        except BrokerUnavailable:
            remaining = summary.sent - producer.acks.answered
            raise BrokerUnavailable(
                f"{remaining} of {summary.sent} calls were not acknowledged by Kafka within "
                f"{timeout:.0f} s; they may or may not have been written"
            ) from None
    finally:
        bar.close()
    summary.failed = [str(failure) for failure in producer.failed]
    summary.seconds = time.monotonic() - started
    return summary


def _numbered(lines: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield number, line.rstrip(b"\r\n")


def _source_of(
    raw: object, table: ConfigTable, write_key: str | None, source_id: str | None
) -> str:
    line_key = raw.get("writeKey") if isinstance(raw, dict) else None
    if line_key is not None and not isinstance(line_key, str):
        raise InvalidCall("writeKey", "must be a string")
    key = line_key or write_key
    if key:
        source = table.source_for_write_key(key)
        if source is None:
            shown = shown_write_key(key)
            raise InvalidCall("writeKey", f"no source has the write key {shown!r}")
        return source.id
    if source_id is not None:
        return source_id
    raise InvalidCall(
        "writeKey", "no write key: give --write-key or --source, or a writeKey per line"
    )

"""What a decided delivery hands off: the records to produce for its outcome (its next retry
tier, its dead letter, or nothing), its delivery log record, and the release of its user when it
held an ordered destination's user back (``pipeline.roles.ordering``); counted."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pipeline.core.delivery_policy import Conclusion
from pipeline.core.log_entries import conclusion_log_record, suppressed_log_record
from pipeline.core.outcomes import DeadLetterReason, Outcome, UrlResult
from pipeline.core.records import Delivery, delivery_to_record
from pipeline.core.suppression import SUPPRESSED_REASON
from pipeline.core.topics import Topics
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.consumer_loop import ConsumedRecord
from pipeline.kafka.errors import Headed, Produced
from pipeline.kafka.log_batches import Delivered
from pipeline.roles.delivery_decisions import HandOff, LiveConfig, Logged
from pipeline.roles.delivery_outcomes import DeadLetters, MetricsByDestination, dead_letter_of
from pipeline.roles.delivery_tracing import RETRY_WAIT, wait_header
from pipeline.roles.holds import release_record
from pipeline.roles.parking import schedule_header
from pipeline.runtime import metrics
from pipeline.runtime.tracing import trace_headers

__all__ = ["HandOffs", "PASSED"]

log = logging.getLogger("pipeline.deliver")

#: The header saying a record in a retry tier waits to be tried again.
RETRY_HEADER = wait_header(RETRY_WAIT)
#: What the dead letter of a call that held its user back (an ordered destination's) says.
PASSED = "its user's later calls to this ordered destination go on past it"


class HandOffs:
    """The hand-offs of one delivery handler (its ``role``)."""

    def __init__(
        self,
        role: str,
        *,
        topics: Topics,
        codec: RecordCodec,
        follower: LiveConfig,
        counted: MetricsByDestination,
        dead_letters: DeadLetters,
        log_on: bool,
    ) -> None:
        self._role = role
        self._topics = topics
        self._codec = codec
        self._follower = follower
        self._metrics = counted
        self._dead_letters = dead_letters
        self._log_on = log_on

    def undecodable(self, consumed: ConsumedRecord, detail: str) -> HandOff:
        letter = dead_letter_of(DeadLetterReason.UNDECODABLE, consumed, detail=detail)
        trace = trace_headers(consumed.message.headers())
        return HandOff([self._dead_letters.record(letter, trace)])

    def suppressed(self, consumed: ConsumedRecord, record: Delivery, now: float) -> HandOff:
        """A record a deletion request suppresses: nothing to produce but its log record (and
        the release of its user, if it held one back)."""
        self._metrics(record.destination_id).suppressed.inc()
        logged = None
        if self._log_on:
            logged = suppressed_log_record(record, int(now * 1000), SUPPRESSED_REASON)
        return HandOff(self.release(consumed, record, "suppressed"), logged)

    def concluded(
        self,
        consumed: ConsumedRecord,
        before: Delivery,
        conclusion: Conclusion,
        finished: float,
        results: Sequence[UrlResult] = (),
        started: float = 0.0,
        batch: str = "",
    ) -> tuple[list[Produced], Logged]:
        """The records to produce for ``conclusion`` (reached at ``finished``; ``results`` of the
        request begun at ``started``, if one was made; ``batch``: the batch that carried it) and
        its log record; counted."""
        outcome, record = conclusion.outcome, conclusion.delivery
        counted = self._metrics(before.destination_id)
        counted.outcomes[outcome].inc()
        logged: Logged = None
        if self._log_on:
            if outcome is Outcome.DELIVERED and not batch:
                logged = Delivered(before, list(results), started, finished)
            else:
                reason = conclusion.reason or ("" if conclusion.requested else "circuit_open")
                logged = conclusion_log_record(
                    before,
                    outcome,
                    record,
                    finished,
                    results=results,
                    started=started,
                    reason=str(reason),
                    batch=batch,
                )
        if outcome is Outcome.DELIVERED:
            if not record.replays:  # a replay's call arrived long ago: not the pipeline's latency
                metrics.END_TO_END_SECONDS.observe(max(0.0, finished - record.received_at / 1000))
            # A delivered record is not kept, so neither is its attempt history.
            return self.release(consumed, before, "delivered"), logged
        if outcome is Outcome.RETRY:
            counted.retries[record.tier].inc()
            value = self._codec.encode("Delivery", delivery_to_record(record))
            header = schedule_header(
                record.tier,
                record.not_before,
                record.first_attempt_at,
                record.deadline,
                record.destination_id,
            )
            topic = self._topics.retry[record.tier]
            headers = [header, RETRY_HEADER, *trace_headers(consumed.message.headers())]
            retried: Headed = (topic, consumed.message.key(), value, headers)
            return [retried], logged
        assert conclusion.reason is not None
        released = self.release(consumed, before, "dead_lettered")
        detail = conclusion.detail
        if released:
            detail += PASSED if not detail else f" ({PASSED})"
        letter = dead_letter_of(conclusion.reason, consumed, delivery=record, detail=detail)
        trace = trace_headers(consumed.message.headers())
        return [self._dead_letters.record(letter, trace), *released], logged

    def release(self, consumed: ConsumedRecord, record: Delivery, outcome: str) -> list[Produced]:
        """The release of ``record``'s user, if ``record`` held it back: it waited in a retry
        tier for an ordered destination, and has its outcome now (``pipeline.roles.ordering``)."""
        if consumed.key[0] == self._topics.deliveries:
            return []  # never waited: its lane goes on by itself
        destination = self._follower.table.destinations.get(record.destination_id)
        if destination is None or not destination.ordered:
            return []  # not holding anyone back (a deleted destination's holds are swept)
        return [release_record(self._topics, consumed.message.key(), outcome, record)]

    def internal_error(
        self, consumed: ConsumedRecord, record: Delivery, exc: Exception
    ) -> list[Produced]:
        """The dead letter of a record a bug stopped (called in the ``except`` block)."""
        log.exception("%s: unexpected error on %s", self._role, record.message_id)
        letter = dead_letter_of(
            DeadLetterReason.INTERNAL_ERROR,
            consumed,
            delivery=record,
            detail=f"{type(exc).__name__}: {exc}",
        )
        return [
            self._dead_letters.record(letter, trace_headers(consumed.message.headers())),
            *self.release(consumed, record, "dead_lettered"),
        ]

"""``WebhookSender.set_share``: a destination's ``rate_limit`` is the group's; each process sends
at the mean of its shares of the two delivery roles, so the group never sends more than the limit
however the roles' partitions are spread."""

from __future__ import annotations

from fractions import Fraction

import pytest

from pipeline.core.config import Destination
from pipeline.core.settings import Settings
from pipeline.http.sender import WebhookSender

LIMIT = 40.0


def rate_of(shares: dict[str, float]) -> float:
    sender = WebhookSender(Settings())
    for role, share in shares.items():
        sender.set_share(role, share)
    dest = Destination(
        id="d", sources=["web"], rate_limit=LIMIT, webhooks=[{"url": "http://h.example/x"}]
    )
    return sender._bucket(dest, LIMIT).rate


@pytest.mark.parametrize(
    "split",
    [
        # 3 deliver partitions split 2+1, 4 retry partitions 2+2 (the larger share summed to 1.17)
        [(Fraction(2, 3), Fraction(1, 2)), (Fraction(1, 3), Fraction(1, 2))],
        [(Fraction(1), Fraction(0)), (Fraction(0), Fraction(1))],
        [(Fraction(1, 2), Fraction(1, 4)), (Fraction(1, 2), Fraction(3, 4))],
    ],
)
def test_the_group_sends_at_most_the_limit(split: list[tuple[Fraction, Fraction]]) -> None:
    total = sum(rate_of({"deliver": float(d), "retry": float(r)}) for d, r in split)
    assert total == pytest.approx(LIMIT)


def test_one_process_with_every_partition_sends_the_whole_limit() -> None:
    assert rate_of({"deliver": 1.0, "retry": 1.0}) == LIMIT


def test_processes_running_one_role_each_share_the_limit() -> None:
    # A deliver-only and a retry-only process: half each, not the limit each.
    assert rate_of({"deliver": 1.0}) + rate_of({"retry": 1.0}) == LIMIT

"""Topic names. Every name takes the ``--topic-prefix``; retry tiers are numbered from 0."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Topics"]


@dataclass(frozen=True, slots=True)
class Topics:
    """The pipeline's topic names for one prefix and one number of retry tiers.

    >>> Topics("t1.", retry_tiers=2).retry
    ('t1.deliveries.webhooks.retry.0', 't1.deliveries.webhooks.retry.1')
    """

    prefix: str = ""
    retry_tiers: int = 5
    #: The retry tier topics, by tier (named once: the delivery handler asks per record).
    retry: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        tiers = tuple(f"{self.deliveries}.retry.{n}" for n in range(self.retry_tiers))
        object.__setattr__(self, "retry", tiers)  # a frozen dataclass sets its own fields so

    @property
    def calls(self) -> str:
        return f"{self.prefix}calls"

    @property
    def config(self) -> str:
        return f"{self.prefix}config"

    @property
    def deliveries(self) -> str:
        return f"{self.prefix}deliveries.webhooks"

    @property
    def log(self) -> str:
        """The delivery log: every decision about a call (keyed by message id)."""
        return f"{self.prefix}deliveries.log"

    @property
    def events(self) -> str:
        """Operational events: circuits, destinations disabled, dead letters (keyed by
        destination)."""
        return f"{self.prefix}pipeline.events"

    @property
    def dlq(self) -> str:
        return f"{self.deliveries}.dlq"

    @property
    def dlq_replays(self) -> str:
        """Which dead letters were replayed (compacted, keyed by dead-letter id)."""
        return f"{self.dlq}.replays"

    @property
    def replays(self) -> str:
        """Replays of retained calls (``pipeline replay``) and how far each got (compacted,
        keyed by replay id)."""
        return f"{self.prefix}replays"

    @property
    def deletion_requests(self) -> str:
        """Deletion requests and the sources they notified (compacted, keyed by user id)."""
        return f"{self.prefix}deletion-requests"

    @property
    def pace(self) -> str:
        """Each delivery process's word on each destination's pace, twice a second: its demand,
        a lowered pace, a pause (compacted, keyed ``<destination>\\0<process>``)."""
        return f"{self.prefix}pace"

    def changelog(self, state: str) -> str:
        """The changelog of a partition state (``dedupe``: the router's memory of the calls it
        routed; ``ordering``: the deliver role's held users), one partition per input
        partition (compacted)."""
        return f"{self.prefix}state.{state}.changelog"

    @property
    def audience_state(self) -> str:
        """Last value sent per audience or computed trait and user (compacted,
        keyed ``<source>/<property>/<user>``)."""
        return f"{self.prefix}audience-state"

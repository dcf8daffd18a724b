"""Runs one or more roles (router, deliver, retry, log-store) in one process, sharing config,
producer and HTTP session. Consumer groups are ``<topic prefix><role>`` (the log-store's also names
its store): scaling out means starting more processes with the same settings.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from functools import partial

from pipeline.core.settings import Settings, default_state_dir
from pipeline.core.topics import Topics
from pipeline.http.sender import WebhookSender
from pipeline.kafka.clients import topics_for
from pipeline.kafka.cluster import fit_to_cluster, reach
from pipeline.kafka.config_store import ConfigFollower
from pipeline.kafka.consumer_loop import GATHER, ConsumerLoop
from pipeline.kafka.deletions import DeletionFollower
from pipeline.kafka.events import EventEmitter
from pipeline.kafka.partition_state import PartitionState, check_changelog, check_topic
from pipeline.kafka.producer import AsyncProducer
from pipeline.kafka.registry_codec import make_codec
from pipeline.kafka.transactions import PartitionTransactions
from pipeline.roles.dedupe import MARGIN, Dedupe
from pipeline.roles.deliver import DeliveryHandler
from pipeline.roles.holds import RETENTION as ORDERING_RETENTION
from pipeline.roles.holds import Holds
from pipeline.roles.log_store import run_log_store
from pipeline.roles.pace_exchange import PaceExchange
from pipeline.roles.parking import Parking, RoutingParker
from pipeline.roles.router import RouterHandler

__all__ = ["ROLES", "run_roles", "group_id"]

log = logging.getLogger("pipeline.worker")

ROLES = ("router", "deliver", "retry", "log-store")

#: The retry role pauses a partition and seeks back to a record that is not due yet; after the
#: resume, librdkafka fetches again only once the fetch it had outstanding returns, which takes
#: up to ``fetch.wait.max.ms`` (500 ms by default) on an idle partition. Every retry would be that
#: late, so the retry consumer long-polls for 50 ms at most (some 20 small requests a second per
#: broker when idle).
_RETRY_CONSUMER = {"fetch.wait.max.ms": 50}


def _state(settings: Settings, topics: Topics, name: str, retention: float) -> PartitionState:
    """The partition state ``name`` of a role in this process; its changelog topic is checked
    first (``StateUnavailable``)."""
    changelog = topics.changelog(name)
    check_changelog(settings, changelog)
    directory = os.path.join(default_state_dir(settings), name)
    return PartitionState(settings, changelog=changelog, directory=directory, retention=retention)


def _dedupe(settings: Settings, topics: Topics) -> Dedupe | None:
    """The router's memory of the calls it routed (``None``: ``PIPELINE_DEDUPE_WINDOW=off``)."""
    if settings.dedupe_window is None:
        return None
    state = _state(settings, topics, "dedupe", settings.dedupe_window + MARGIN)
    return Dedupe(state, settings.dedupe_window)


def _holds(settings: Settings, topics: Topics) -> Holds:
    """The deliver role's held users of ordered destinations."""
    return Holds(_state(settings, topics, "ordering", ORDERING_RETENTION))


def _routing_parker(parking: Parking, follower: ConfigFollower) -> RoutingParker:
    """The router's parker of one batch, over the live config as it is then."""
    return parking.routing_parker(follower.table.destinations)


def group_id(settings: Settings, role: str) -> str:
    return f"{settings.topic_prefix}{role}"


async def run_roles(
    settings: Settings,
    roles: Iterable[str],
    stop: asyncio.Event,
    *,
    ready: asyncio.Event | None = None,
) -> None:
    """Run ``roles`` until ``stop`` is set; then drain in-flight work, commit, and return.

    The cluster is reached first (a TLS or login failure ends it at once), and the settings
    fitted to it: on the embedded broker, no router transactions and a short session timeout.
    """
    roles = [r for r in ROLES if r in set(roles)]
    cluster = await asyncio.to_thread(reach, settings, 60.0)
    settings = fit_to_cluster(settings, cluster)
    topics = topics_for(settings)
    codec = make_codec(settings)
    follower = ConfigFollower(settings, codec=codec).start()
    delivering = "deliver" in roles or "retry" in roles
    # The delivery roles suppress what a deletion request covers: they start knowing them all.
    deletions = DeletionFollower(settings, codec=codec).start() if delivering else None
    producer: AsyncProducer | None = None
    sender: WebhookSender | None = None
    exchange: PaceExchange | None = None
    events: EventEmitter | None = None
    try:
        await asyncio.to_thread(follower.wait_ready, 60.0)
        if deletions is not None:
            await asyncio.to_thread(deletions.wait_ready, 60.0)
        producer = AsyncProducer(settings)
        loops: list[ConsumerLoop] = []
        if delivering:
            await asyncio.to_thread(check_topic, settings, topics.pace, "the pace topic")
            sender = await WebhookSender(settings).start()
            events = EventEmitter(producer, codec, topics.events)
            exchange = PaceExchange(
                settings, topics, sender.health, producer, follower, events
            ).start()
        deliverers: dict[str, DeliveryHandler] = {}
        for role, topics_in in (("deliver", [topics.deliveries]), ("retry", list(topics.retry))):
            if role in roles:
                assert sender is not None
                holds = None
                if role == "deliver":
                    holds = await asyncio.to_thread(_holds, settings, topics)
                deliverers[role] = DeliveryHandler(
                    role,
                    topics_in,
                    settings=settings,
                    topics=topics,
                    follower=follower,
                    producer=producer,
                    sender=sender,
                    health=sender.health,
                    stop=stop,
                    codec=codec,
                    deleted=None if deletions is None else deletions.deleted,
                    holds=holds,
                )
                # Records waiting for a turn go to a partition of the first tier by number: of
                # those it has (a topic made before PIPELINE_RETRY_PARTITIONS changed keeps its).
                made = cluster.partitions.get(topics.retry[0])
                if made:
                    deliverers[role].parking.tier_partitions = made
                deliverers[role].start()
        retry = deliverers.get("retry")
        if retry is not None:  # records parked for a turn where it reads count in the demand here
            for delivery in deliverers.values():
                delivery.parking.holds_place = retry.holds_place
        if "router" in roles:
            dedupe = await asyncio.to_thread(_dedupe, settings, topics)
            # Delivering here too: records for a destination whose every circuit is open go
            # straight to a retry tier, as the deliver role would send them on arrival.
            deliverer = deliverers.get("deliver")
            handler = RouterHandler(
                topics=topics,
                follower=follower,
                producer=producer,
                stop=stop,
                codec=codec,
                transactions=partial(PartitionTransactions, settings)
                if settings.transactions
                else None,
                retake_after=settings.session_timeout or 45.0,
                log=settings.log,
                log_bodies=settings.log_bodies,
                parking=None
                if deliverer is None
                else partial(_routing_parker, deliverer.parking, follower),
                dedupe=dedupe,
            )
            # With transactions the router commits its offsets inside them, not the loop.
            loops.append(
                ConsumerLoop(
                    settings,
                    group_id(settings, "router"),
                    handler,
                    commits=not handler.transactional,
                    gather=GATHER if handler.transactional else 0.0,
                )
            )
        for role, delivery in deliverers.items():
            overrides = _RETRY_CONSUMER if role == "retry" else None
            loops.append(
                ConsumerLoop(
                    settings, group_id(settings, role), delivery, consumer_overrides=overrides
                )
            )
        log.info("running %s on %s", ", ".join(roles), settings.bootstrap_servers)
        if ready is not None:
            ready.set()
        # The log-store opens its store (waiting for it while it is down) beside the others:
        # nothing of the delivery path waits for it.
        stores = [run_log_store(settings, topics, codec, stop)] if "log-store" in roles else []
        await asyncio.gather(*(loop.run(stop) for loop in loops), *stores)
        for fatal in (getattr(loop.handler, "fatal", None) for loop in loops):
            if fatal is not None:
                raise fatal
    finally:
        if exchange is not None:
            await exchange.aclose()
        if events is not None:
            await events.aclose()
        if sender is not None:
            await sender.aclose()
        if producer is not None:
            await asyncio.to_thread(producer.close)
        follower.stop()
        if deletions is not None:
            deletions.stop()

"""``pipeline doctor``: check a deployment's settings against the real cluster, and say what to do.

Each check is one line: what was found and, when something is wrong, what to do about it. The
checks, in order (a check that needs the cluster is skipped when it was not reached):

- brokers: reachable, the TLS handshake and the login accepted (each failure told apart, within
  10 s); whether it is the embedded broker;
- topics: every topic exists, with the partitions, cleanup policy and retention it should have;
- transactions: an empty transaction commits (needed where ``PIPELINE_TRANSACTIONS`` is on);
- schema registry: answers, and accepts the credentials (when one is configured);
- log store: opens;
- destinations: every webhook URL parses, and its host resolves to addresses the SSRF guard
  allows (no request is sent).
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from pipeline.core.address_policy import AddressPolicy
from pipeline.core.exceptions import BrokerUnavailable, PipelineError
from pipeline.core.settings import Settings, default_log_store_url
from pipeline.kafka.clients import topic_specs
from pipeline.kafka.cluster import (
    Cluster,
    KafkaLoginRefused,
    KafkaTlsFailed,
    fit_to_cluster,
    reach,
)

__all__ = ["Check", "diagnose"]

#: How long the cluster has to answer, and a transaction to commit.
TIMEOUT = 10.0
_QUIET = logging.getLogger("pipeline.rdkafka.doctor")
_QUIET.disabled = True
#: Topic configs whose absence means a known value.
_DEFAULTS = {"cleanup.policy": "delete"}


@dataclass(frozen=True, slots=True)
class Check:
    """One finding. ``ok``: ``True`` fine, ``False`` a problem, ``None`` skipped or not used."""

    name: str
    ok: bool | None
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def diagnose(settings: Settings, *, on_check: Callable[[Check], None] | None = None) -> list[Check]:
    """Run every check; ``on_check`` sees each as it finishes (for progress output)."""
    checks: list[Check] = []

    def add(check: Check) -> None:
        checks.append(check)
        if on_check is not None:
            on_check(check)

    cluster, check = _brokers(settings)
    add(check)
    topics: Check | None = None
    if cluster is not None:
        settings = fit_to_cluster(settings, cluster, say=False)
        topics = _topics(settings)
        add(topics)
        if topics.detail.startswith(f"{len(topic_specs(settings))} missing"):
            add(Check("transactions", None, "skipped: no topics yet"))
        else:
            add(_transactions(settings, cluster))
    else:
        for name in ("topics", "transactions"):
            add(Check(name, None, "skipped: the cluster was not reached"))
    add(_registry(settings))
    add(_log_store(settings))
    if topics is None:
        add(Check("destinations", None, "skipped: the config topic is on the cluster"))
    elif topics.detail.startswith(f"{len(topic_specs(settings))} missing"):
        add(Check("destinations", None, "skipped: no topics yet"))
    else:
        add(_destinations(settings))
    return checks


def _brokers(settings: Settings) -> tuple[Cluster | None, Check]:
    protocol = settings.kafka_client.security_protocol
    try:
        cluster = reach(settings, timeout=TIMEOUT)
    except KafkaTlsFailed as exc:
        return None, Check(
            "brokers",
            False,
            str(exc),
            "fix the TLS settings: PIPELINE_KAFKA_SSL_CA_LOCATION must hold the CA that signed "
            "the broker's certificate; a broker that wants a client certificate needs "
            "PIPELINE_KAFKA_SSL_CERTIFICATE_LOCATION and PIPELINE_KAFKA_SSL_KEY_LOCATION",
        )
    except KafkaLoginRefused as exc:
        return None, Check(
            "brokers",
            False,
            str(exc),
            "fix the credentials (PIPELINE_KAFKA_SASL_USERNAME, PIPELINE_KAFKA_SASL_PASSWORD, "
            "PIPELINE_KAFKA_SASL_MECHANISM, or the properties file)",
        )
    except BrokerUnavailable as exc:
        return None, Check(
            "brokers",
            False,
            str(exc),
            f"check PIPELINE_BOOTSTRAP_SERVERS ({settings.bootstrap_servers}) and that the "
            f"brokers are up and reachable from here (security.protocol {protocol})",
        )
    kind = " (the embedded broker)" if cluster.embedded else ""
    return cluster, Check(
        "brokers",
        True,
        f"cluster {cluster.cluster_id} at {settings.bootstrap_servers}: {cluster.brokers} "
        f"broker(s){kind}, {protocol}",
    )


def _topics(settings: Settings) -> Check:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

    from pipeline.kafka.clients import admin_config

    admin = AdminClient(admin_config(settings, lambda _error: None))
    specs = topic_specs(settings)
    try:
        metadata = admin.list_topics(timeout=TIMEOUT)
        present = [s for s in specs if s.topic in metadata.topics]
        resources = [ConfigResource("TOPIC", s.topic) for s in present]
        described = admin.describe_configs(resources, request_timeout=TIMEOUT) if resources else {}
        configs = {r.name: f.result() for r, f in described.items()}
    except KafkaException as exc:
        return Check("topics", False, f"could not describe the topics: {exc}", "")
    problems = []
    missing = [s.topic for s in specs if s.topic not in metadata.topics]
    if missing:
        problems.append(
            f"{len(missing)} missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"
        )
    for spec in present:
        have = len(metadata.topics[spec.topic].partitions)
        if have != spec.num_partitions:
            problems.append(f"{spec.topic} has {have} partitions (settings: {spec.num_partitions})")
        current = configs.get(spec.topic, {})
        wanted = {"cleanup.policy": "delete", **(spec.config or {})}
        for name, value in wanted.items():
            entry = current.get(name)
            # A broker may list only the configs set on the topic: no cleanup.policy is delete.
            have_value = entry.value if entry is not None else _DEFAULTS.get(name)
            if have_value is not None and have_value != value:
                problems.append(f"{spec.topic} has {name}={have_value} (expected {value})")
    if problems:
        fix = "run `pipeline topics create`" if missing else ""
        if any("cleanup.policy" in p or "retention" in p or "partitions" in p for p in problems):
            fix = (fix + "; " if fix else "") + (
                "a topic's partitions are never changed by the pipeline (keys would move); "
                "alter cleanup.policy or retention.ms with your Kafka tools, or `pipeline topics "
                "create` for the retention settings it follows"
            )
        return Check("topics", False, "; ".join(problems), fix)
    return Check("topics", True, f"all {len(specs)} present, as configured")


def _transactions(settings: Settings, cluster: Cluster) -> Check:
    """A transaction that commits a consumer offset (a group of the doctor's own, on the config
    topic): librdkafka does not send an empty transaction at all, so this is the smallest one
    that reaches the transaction coordinator and the group coordinator, as the router's do."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    from pipeline.kafka.clients import consumer_config, producer_config, topics_for

    used = "on" if settings.transactions else "off"
    quiet = {"error_cb": lambda _error: None, "logger": _QUIET}
    producer = Producer(
        producer_config(
            settings,
            **{"transactional.id": f"{settings.topic_prefix}doctor-{uuid.uuid4().hex[:8]}"},
            **quiet,
        )
    )
    consumer = Consumer(consumer_config(settings, f"{settings.topic_prefix}doctor", **quiet))
    try:
        producer.init_transactions(TIMEOUT)
        producer.begin_transaction()
        producer.send_offsets_to_transaction(
            [TopicPartition(topics_for(settings).config, 0, 0)],
            consumer.consumer_group_metadata(),
            TIMEOUT,
        )
        producer.commit_transaction(TIMEOUT)
    except KafkaException as exc:
        detail = f"a transaction did not commit within {TIMEOUT:.0f} s: {exc.args[0].str()}"
        if settings.transactions:
            return Check(
                "transactions",
                False,
                detail,
                "the router hands off in transactions (PIPELINE_TRANSACTIONS on): fix the "
                "broker (transaction state log, ACLs on transactional ids), or set "
                "PIPELINE_TRANSACTIONS=off",
            )
        return Check("transactions", None, f"{detail} (not used: PIPELINE_TRANSACTIONS is off)")
    finally:
        consumer.close()
    note = " (off on the embedded broker)" if cluster.embedded and not settings.transactions else ""
    return Check("transactions", True, f"a transaction commits; router transactions {used}{note}")


def _registry(settings: Settings) -> Check:
    if not settings.schema_registry_url:
        return Check("schema registry", None, "not used (Avro single-object encoding)")
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    from pipeline.kafka.registry_codec import registry_client_config

    url = settings.schema_registry_url
    try:
        client = SchemaRegistryClient(
            {"url": url, "timeout": TIMEOUT, "max.retries": 0, **registry_client_config(settings)}
        )
        subjects = client.get_subjects()
    except SchemaRegistryError as exc:
        if exc.http_status_code in (401, 403):
            return Check(
                "schema registry",
                False,
                f"{url} refused the credentials (HTTP {exc.http_status_code})",
                "check PIPELINE_SCHEMA_REGISTRY_BASIC_AUTH (user:password)",
            )
        return Check("schema registry", False, f"{url} answered an error: {exc}", "")
    except Exception as exc:  # noqa: BLE001 (the client raises what its HTTP library raises)
        return Check(
            "schema registry",
            False,
            f"{url} did not answer: {type(exc).__name__}: {exc}",
            "check PIPELINE_SCHEMA_REGISTRY_URL and that the registry is up",
        )
    return Check("schema registry", True, f"{url} answers ({len(subjects)} subjects)")


def _log_store(settings: Settings) -> Check:
    from pipeline.store import open_store
    from pipeline.store._url import parse_store_url

    url = default_log_store_url(settings)
    try:
        shown = parse_store_url(url).shown
        store = open_store(url)
        store.close()
    except (PipelineError, ValueError) as exc:
        return Check(
            "log store",
            False,
            str(exc),
            "check PIPELINE_LOG_STORE_URL (sqlite:///PATH or postgresql://...) and that the "
            "database is up and writable",
        )
    return Check("log store", True, f"{shown} opens")


def _destinations(settings: Settings) -> Check:
    from pipeline.kafka.config_store import load_table

    try:
        table = load_table(settings, timeout=TIMEOUT)
    except BrokerUnavailable as exc:
        return Check("destinations", False, f"could not read the config topic: {exc}", "")
    policy = AddressPolicy.parse(settings.allowed_networks)
    problems = []
    count = 0
    for destination in sorted(table.destinations.values(), key=lambda d: d.id):
        for webhook in destination.webhooks:
            count += 1
            problem = _url_problem(webhook.url, policy)
            if problem:
                problems.append(f"{destination.id}: {problem}")
    if problems:
        return Check(
            "destinations",
            False,
            "; ".join(problems),
            "fix the URL in the config, or allow the network with PIPELINE_ALLOWED_NETWORKS "
            "if the receiver is meant to be internal",
        )
    if not count:
        return Check("destinations", None, "none configured (`pipeline config apply FILE`)")
    return Check(
        "destinations",
        True,
        f"{count} webhook URL(s) of {len(table.destinations)} destination(s) parse and "
        "resolve to allowed addresses",
    )


def _url_problem(url: str, policy: AddressPolicy) -> str:
    """Why deliveries to ``url`` would be refused ("" when they would not)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url} is not an http or https URL with a host"
    host = parts.hostname
    try:
        infos = socket.getaddrinfo(host, parts.port or 443, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        return f"{host} does not resolve ({exc})"
    for info in infos:
        refusal = policy.refusal(str(info[4][0]))
        if refusal:
            return f"{host}: {refusal} (the SSRF guard refuses it)"
    return ""

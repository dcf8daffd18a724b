"""Reaching the cluster: what answers, and why nothing does.

``reach`` sends metadata requests until the cluster answers, and tells the three ways it can
fail apart: the TLS handshake failed (a wrong CA, a missing client certificate), the broker
refused the login (SASL), or nothing answered at all. The first two are mistakes in the settings
that waiting will not mend, so they are raised as soon as librdkafka reports them (well within
10 s); an address that does not answer may be a broker still starting, so it gets ``timeout``.

``fit_to_cluster`` adapts settings to the embedded development broker (tansu), recognised by its
cluster id: its transactions stall read_committed readers and its first group join waits half
the session timeout, so there the router runs without transactions and consumers with a 6 s
session timeout, unless a setting says otherwise.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from pipeline.core.deadline import Deadline
from pipeline.core.exceptions import BrokerUnavailable
from pipeline.core.settings import Settings
from pipeline.kafka.broker import EMBEDDED_CLUSTER_ID
from pipeline.kafka.clients import admin_config

__all__ = [
    "Cluster",
    "KafkaTlsFailed",
    "KafkaLoginRefused",
    "reach",
    "fit_to_cluster",
    "EMBEDDED_CLUSTER_ID",
    "EMBEDDED_SESSION_TIMEOUT",
]

log = logging.getLogger("pipeline.kafka")

#: The cluster id ``pipeline broker`` gives the embedded broker; tansu's own default is
#: ``tansu_cluster``. Either means "the embedded broker".
_EMBEDDED_IDS = (EMBEDDED_CLUSTER_ID, "tansu_cluster")
#: The consumers' session timeout there: its JoinGroup waits half of it.
EMBEDDED_SESSION_TIMEOUT = 6.0

_QUIET = logging.getLogger("pipeline.rdkafka.probe")
_QUIET.disabled = True
_LOGIN = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}
#: A TLS failure comes as ``_SSL`` or, when the broker's side refuses (a client certificate it
#: requires is missing: TLS 1.3 tells the client on its first read), as ``_TRANSPORT`` with
#: OpenSSL's words in it.
_TLS_WORDS = re.compile(r"SSL routines|SSL alert|certificate verify|SSL handshake")


def _kind(error: KafkaError) -> str:
    """``tls``, ``login`` or ``other``."""
    code = error.code()
    if code in _LOGIN:
        return "login"
    if code == KafkaError._SSL or (
        code == KafkaError._TRANSPORT and _TLS_WORDS.search(error.str() or "")
    ):
        return "tls"
    return "other"


class KafkaTlsFailed(BrokerUnavailable):
    """The TLS handshake with a broker failed: its certificate is not trusted, ours is missing
    or refused. Fix the settings; waiting will not help."""


class KafkaLoginRefused(BrokerUnavailable):
    """The broker refused the SASL login: an unknown user, a wrong password, a mechanism it
    does not offer. Fix the credentials; waiting will not help."""


@dataclass(frozen=True, slots=True)
class Cluster:
    """What answered: its cluster id, how many brokers its metadata lists, and how many
    partitions each of its topics has."""

    cluster_id: str | None
    brokers: int
    partitions: Mapping[str, int] = field(default_factory=dict)

    @property
    def embedded(self) -> bool:
        return self.cluster_id in _EMBEDDED_IDS


class _Errors:
    """librdkafka's error callback, kept: the first fatal one (TLS, login) and the last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fatal: KafkaError | None = None
        self.last: KafkaError | None = None

    def __call__(self, error: KafkaError) -> None:
        with self._lock:
            if error.code() != KafkaError._ALL_BROKERS_DOWN:  # says less than the one before
                self.last = error
            if self.fatal is None and _kind(error) != "other":
                self.fatal = error


def reach(settings: Settings, timeout: float = 30.0) -> Cluster:
    """Return once the cluster answers a metadata request.

    Raises ``KafkaTlsFailed`` or ``KafkaLoginRefused`` as soon as librdkafka reports one, and
    ``BrokerUnavailable`` when nothing answered within ``timeout`` seconds.
    """
    errors = _Errors()
    # Its findings are raised, with what to do: librdkafka's own lines would only repeat them.
    config: dict[str, Any] = {**admin_config(settings, errors), "logger": _QUIET}
    admin = AdminClient(config)
    deadline = Deadline.after(timeout)
    last = ""
    while True:
        try:
            metadata = admin.list_topics(timeout=deadline.capped(0.5, floor=0.05))
            partitions = {name: len(topic.partitions) for name, topic in metadata.topics.items()}
            return Cluster(metadata.cluster_id, len(metadata.brokers), partitions)
        except KafkaException as exc:
            last = exc.args[0].str() if exc.args else str(exc)
        admin.poll(0)  # serve the error callback
        if errors.fatal is not None:
            raise _explain(settings, errors.fatal)
        if deadline.expired():
            break
    seen = errors.last.str() if errors.last is not None else last
    raise BrokerUnavailable(
        f"no Kafka broker answered at {settings.bootstrap_servers} within {timeout:.0f} s ({seen})"
    )


def _explain(settings: Settings, error: KafkaError) -> BrokerUnavailable:
    client = settings.kafka_client
    if _kind(error) == "tls":
        ca = client.common.get("ssl.ca.location")
        cert = client.common.get("ssl.certificate.location")
        hints = [
            f"the broker's certificate must be signed by the CA in {ca} "
            f"({client.origins['ssl.ca.location']})"
            if ca
            else "the broker's certificate must be signed by a CA this machine trusts "
            "(or set PIPELINE_KAFKA_SSL_CA_LOCATION)",
            f"the client certificate is {cert} ({client.origins['ssl.certificate.location']})"
            if cert
            else "if the broker requires a client certificate (mTLS), set "
            "PIPELINE_KAFKA_SSL_CERTIFICATE_LOCATION and PIPELINE_KAFKA_SSL_KEY_LOCATION",
        ]
        return KafkaTlsFailed(
            f"TLS handshake with {settings.bootstrap_servers} failed: {error.str()}; "
            + "; ".join(hints)
        )
    mechanism = client.common.get("sasl.mechanism", "GSSAPI")
    key = "sasl.username" if "sasl.username" in client.common else "sasl.oauthbearer.client.id"
    user = client.common.get(key)
    who = f"user {user!r} ({key} from {client.origins[key]})" if user else "the client"
    return KafkaLoginRefused(
        f"authentication failed: {settings.bootstrap_servers} refused the {mechanism} login of "
        f"{who}: {error.str()}; check the user name and password (or the mechanism the "
        "cluster offers)"
    )


def fit_to_cluster(settings: Settings, cluster: Cluster, *, say: bool = True) -> Settings:
    """``settings`` as they should run against ``cluster``: on the embedded broker, router
    transactions off and a 6 s session timeout, where no setting chose them. Says so in one
    line (``say``)."""
    if not cluster.embedded:
        return settings
    given = settings.model_fields_set
    changes: dict[str, object] = {}
    said = []
    if "transactions" not in given:
        changes["transactions"] = False
        said.append("router transactions off")
    elif settings.transactions and say:
        log.warning(
            "embedded broker (cluster id %s): router transactions are on (PIPELINE_TRANSACTIONS); "
            "its transactions can leave committed records unreadable for a while",
            cluster.cluster_id,
        )
    if (
        "session_timeout" not in given
        and "session.timeout.ms" not in settings.kafka_client.consumer
    ):
        changes["session_timeout"] = EMBEDDED_SESSION_TIMEOUT
        said.append(f"consumer session timeout {EMBEDDED_SESSION_TIMEOUT:g} s")
    if "worker_processes" not in given:  # one machine's development broker
        changes["worker_processes"] = 1
    if said and say:
        log.info(
            "embedded broker (cluster id %s): %s (set PIPELINE_TRANSACTIONS or "
            "PIPELINE_SESSION_TIMEOUT to choose)",
            cluster.cluster_id,
            ", ".join(said),
        )
    return settings.replace(**changes) if changes else settings

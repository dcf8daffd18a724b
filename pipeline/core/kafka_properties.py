"""Kafka client properties: a ``client.properties`` file, overrides, and the checks they pass.

Kafka users carry their cluster's connection settings in a Java properties file (the one
Confluent Cloud hands out, which other Kafka tools read too); ``PIPELINE_KAFKA_CONFIG`` names it.
Single properties can be overridden by ``PIPELINE_KAFKA_<PROPERTY>``, the librdkafka name in
capitals with dots as underscores (``PIPELINE_KAFKA_SASL_PASSWORD`` is ``sasl.password``). The
environment wins over the file; a value given in both is noted (never shown).

Everything is checked before any connection: an unknown property (with the closest name), a
property the pipeline sets itself, a security protocol or SASL mechanism librdkafka does not
know, SASL without its credentials, a certificate file that is missing. Errors name the file
and line, or the variable.

    >>> props = ClientProperties.build({}, {"security.protocol": "ssl"})
    >>> props.common["security.protocol"]
    'SSL'
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ClientProperties",
    "KafkaPropertiesError",
    "Sourced",
    "read_properties",
    "is_secret",
    "mask",
    "OVERRIDES",
    "REGISTRY_KEYS",
]


class KafkaPropertiesError(ValueError):
    """Kafka client properties that cannot work; every problem is listed, each naming where the
    value came from."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


# librdkafka's properties (CONFIGURATION.md of 2.16) by scope: any client, consumers, producers.
_ANY = """
    allow.auto.create.topics api.version.fallback.ms api.version.request
    api.version.request.timeout.ms bootstrap.servers broker.address.family
    broker.address.ttl broker.version.fallback builtin.features client.dns.lookup client.id
    client.rack connections.max.idle.ms debug
    enable.metrics.push enable.random.seed enable.sasl.oauthbearer.unsecure.jwt
    enable.ssl.certificate.verification enabled_events https.ca.location https.ca.pem
    internal.termination.signal log.connection.close log.queue log.thread.name
    log_level max.in.flight max.in.flight.requests.per.connection message.copy.max.bytes
    message.max.bytes metadata.broker.list metadata.max.age.ms
    metadata.recovery.rebootstrap.trigger.ms metadata.recovery.strategy
    plugin.library.paths receive.message.max.bytes
    reconnect.backoff.jitter.ms reconnect.backoff.max.ms reconnect.backoff.ms
    retry.backoff.max.ms retry.backoff.ms sasl.kerberos.keytab sasl.kerberos.kinit.cmd
    sasl.kerberos.min.time.before.relogin sasl.kerberos.principal sasl.kerberos.service.name
    sasl.mechanism sasl.mechanisms sasl.oauthbearer.assertion.algorithm
    sasl.oauthbearer.assertion.claim.aud sasl.oauthbearer.assertion.claim.exp.seconds
    sasl.oauthbearer.assertion.claim.iss sasl.oauthbearer.assertion.claim.jti.include
    sasl.oauthbearer.assertion.claim.nbf.seconds sasl.oauthbearer.assertion.claim.sub
    sasl.oauthbearer.assertion.file sasl.oauthbearer.assertion.jwt.template.file
    sasl.oauthbearer.assertion.private.key.file
    sasl.oauthbearer.assertion.private.key.passphrase sasl.oauthbearer.assertion.private.key.pem
    sasl.oauthbearer.client.credentials.client.id
    sasl.oauthbearer.client.credentials.client.secret sasl.oauthbearer.client.id
    sasl.oauthbearer.client.secret sasl.oauthbearer.config sasl.oauthbearer.extensions
    sasl.oauthbearer.grant.type sasl.oauthbearer.metadata.authentication.type
    sasl.oauthbearer.method sasl.oauthbearer.scope sasl.oauthbearer.sub.claim.name
    sasl.oauthbearer.token.endpoint.url sasl.password sasl.username security.protocol
    socket.blocking.max.ms socket.connection.setup.timeout.ms socket.keepalive.enable
    socket.max.fails socket.nagle.disable socket.receive.buffer.bytes socket.send.buffer.bytes
    socket.timeout.ms ssl.ca.certificate.stores ssl.ca.location ssl.ca.pem
    ssl.certificate.location ssl.certificate.pem ssl.cipher.suites
    ssl.crl.location ssl.curves.list ssl.endpoint.identification.algorithm ssl.engine.id
    ssl.engine.location ssl.key.location ssl.key.password ssl.key.pem ssl.keystore.location
    ssl.keystore.password ssl.providers ssl.sigalgs.list statistics.interval.ms topic.blacklist
    topic.metadata.propagation.max.ms topic.metadata.refresh.fast.cnt
    topic.metadata.refresh.fast.interval.ms topic.metadata.refresh.interval.ms
    topic.metadata.refresh.sparse
"""
_CONSUMER = """
    auto.commit.interval.ms check.crcs coordinator.query.interval.ms fetch.error.backoff.ms
    fetch.max.bytes fetch.message.max.bytes fetch.min.bytes fetch.queue.backoff.ms
    fetch.wait.max.ms group.instance.id group.protocol group.remote.assignor
    heartbeat.interval.ms max.partition.fetch.bytes max.poll.interval.ms
    queued.max.messages.kbytes queued.min.messages session.timeout.ms
"""
_PRODUCER = """
    batch.num.messages batch.size compression.codec compression.level compression.type
    delivery.timeout.ms linger.ms message.send.max.retries message.timeout.ms
    queue.buffering.backpressure.threshold queue.buffering.max.kbytes
    queue.buffering.max.messages queue.buffering.max.ms request.timeout.ms retries
    sticky.partitioning.linger.ms transaction.timeout.ms
"""
_SCOPES = {
    **dict.fromkeys(_ANY.split(), "any"),
    **dict.fromkeys(_CONSUMER.split(), "consumer"),
    **dict.fromkeys(_PRODUCER.split(), "producer"),
}

#: Properties the pipeline sets itself, and why a file may not change them.
_OURS = {
    "enable.idempotence": "every producer is idempotent (nothing acknowledged is lost or doubled)",
    "acks": "every producer waits for all in-sync replicas (acks=all)",
    "request.required.acks": "every producer waits for all in-sync replicas (acks=all)",
    "group.id": "each role has its consumer group (<topic prefix><role>)",
    "transactional.id": "the router has one transactional id per input partition",
    "enable.auto.commit": "offsets are committed only once a record's outcome is durable",
    "auto.commit.enable": "offsets are committed only once a record's outcome is durable",
    "enable.auto.offset.store": "offsets are committed only once a record's outcome is durable",
    "isolation.level": "readers never see what a router's transaction has not committed",
    "partition.assignment.strategy": "rebalances are cooperative (cooperative-sticky)",
    "group.protocol": "rebalances are cooperative (cooperative-sticky)",
    "enable.partition.eof": "each reader decides whether it needs end-of-partition events",
    "auto.offset.reset": "a new group reads from the earliest offset",
    "offset.store.method": "offsets are committed to the broker",
    "enable.gapless.guarantee": "idempotence is handled by the pipeline's producers",
}
#: What ``acks`` may say all the same: the pipeline's own value.
_ACKS_ALL = {"all", "-1"}

#: Keys of Java clients' files that mean something here, or nothing.
_JAAS = "sasl.jaas.config"
_IGNORED = {
    "sasl.login.callback.handler.class": "a Java class; librdkafka fetches OAUTHBEARER tokens "
    "itself (sasl.oauthbearer.method=oidc)",
    "basic.auth.credentials.source": "the Schema Registry credentials are basic.auth.user.info",
}
#: Java-only keys that have a librdkafka counterpart to use instead.
_JAVA = {
    "ssl.truststore.location": "ssl.ca.location (a PEM file)",
    "ssl.truststore.password": "ssl.ca.location (a PEM file)",
    "ssl.truststore.type": "ssl.ca.location (a PEM file)",
    "ssl.keystore.type": "ssl.keystore.location (PKCS#12) or ssl.certificate.location and "
    "ssl.key.location (PEM)",
    "key.serializer": "nothing: the pipeline writes Avro itself",
    "value.serializer": "nothing: the pipeline writes Avro itself",
    "key.deserializer": "nothing: the pipeline reads Avro itself",
    "value.deserializer": "nothing: the pipeline reads Avro itself",
}
#: Schema Registry keys a Confluent file carries beside the Kafka ones, and the setting each fills.
REGISTRY_KEYS = {
    "schema.registry.url": "schema_registry_url",
    "basic.auth.user.info": "schema_registry_basic_auth",
    "schema.registry.basic.auth.user.info": "schema_registry_basic_auth",
    "schema.registry.ssl.ca.location": "schema_registry_ssl_ca_location",
    "schema.registry.ssl.certificate.location": "schema_registry_ssl_certificate_location",
    "schema.registry.ssl.key.location": "schema_registry_ssl_key_location",
}

_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")
_OAUTH_METHODS = ("default", "oidc")
#: Properties naming a file that must exist and be readable.
_FILES = (
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.keystore.location",
    "ssl.crl.location",
    "sasl.kerberos.keytab",
)

#: The settings that override one property each: ``kafka_<property with _>`` and its property.
OVERRIDES = {
    "kafka_security_protocol": "security.protocol",
    "kafka_sasl_mechanism": "sasl.mechanism",
    "kafka_sasl_username": "sasl.username",
    "kafka_sasl_password": "sasl.password",
    "kafka_ssl_ca_location": "ssl.ca.location",
    "kafka_ssl_certificate_location": "ssl.certificate.location",
    "kafka_ssl_key_location": "ssl.key.location",
    "kafka_ssl_key_password": "ssl.key.password",
    "kafka_ssl_endpoint_identification_algorithm": "ssl.endpoint.identification.algorithm",
    "kafka_sasl_oauthbearer_method": "sasl.oauthbearer.method",
    "kafka_sasl_oauthbearer_client_id": "sasl.oauthbearer.client.id",
    "kafka_sasl_oauthbearer_client_secret": "sasl.oauthbearer.client.secret",
    "kafka_sasl_oauthbearer_token_endpoint_url": "sasl.oauthbearer.token.endpoint.url",
    "kafka_sasl_oauthbearer_scope": "sasl.oauthbearer.scope",
    "kafka_sasl_oauthbearer_extensions": "sasl.oauthbearer.extensions",
}

_SECRET = re.compile(r"password|secret|passphrase|jaas|user\.info|oauthbearer\.config|key\.pem")


def is_secret(name: str) -> bool:
    """Whether property ``name`` holds a secret (never logged or shown).

    >>> is_secret("sasl.password"), is_secret("sasl.username")
    (True, False)
    """
    return _SECRET.search(name) is not None


def mask(name: str, value: str) -> str:
    """``value`` as it may be shown: secrets as ``********``."""
    return "********" if is_secret(name) and value else value


@dataclass(frozen=True, slots=True)
class Sourced:
    """A value and where it came from (``client.properties line 4``,
    ``PIPELINE_KAFKA_SASL_PASSWORD``)."""

    value: str
    origin: str


def read_properties(path: str | os.PathLike[str]) -> dict[str, Sourced]:
    """The key/value pairs of a Java properties file, each with its file and line.

    ``KafkaPropertiesError`` when the file cannot be read or holds a key twice.
    """
    import javaproperties  # a pure-Python reader of the whole format (escapes, continuations)

    name = os.fspath(path)
    try:
        text = Path(name).read_text(encoding="utf-8")
    except OSError as exc:
        raise KafkaPropertiesError(
            [f"PIPELINE_KAFKA_CONFIG: cannot read {name}: {exc.strerror or exc}"]
        ) from None
    except UnicodeDecodeError:
        raise KafkaPropertiesError([f"PIPELINE_KAFKA_CONFIG: {name} is not UTF-8 text"]) from None
    found: dict[str, Sourced] = {}
    problems = []
    line = 1
    for item in javaproperties.parse(text):
        if isinstance(item, javaproperties.KeyValue):
            where = f"{name} line {line}"
            if item.key in found:
                problems.append(f"{where}: {item.key} is set twice (also {found[item.key].origin})")
            found[item.key] = Sourced(item.value.strip(), where)
        line += item.source.count("\n")
    if problems:
        raise KafkaPropertiesError(problems)
    return found


@dataclass(frozen=True, slots=True)
class ClientProperties:
    """The librdkafka properties a user gave, checked: those of every client, of consumers
    only and of producers only; the Schema Registry's from the same file; and notes worth a
    line in the log (an environment value that overrides the file's)."""

    common: dict[str, str] = field(default_factory=dict)
    consumer: dict[str, str] = field(default_factory=dict)
    producer: dict[str, str] = field(default_factory=dict)
    #: Settings the file fills (``schema_registry_url``, ...) with their values.
    registry: dict[str, Sourced] = field(default_factory=dict)
    #: ``bootstrap.servers`` of the file, if it has one.
    bootstrap_servers: Sourced | None = None
    #: Where each property came from.
    origins: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def security_protocol(self) -> str:
        return self.common.get("security.protocol", "PLAINTEXT")

    def describe(self) -> list[tuple[str, str, str]]:
        """(property, value masked, origin) for each property, sorted."""
        merged = {**self.common, **self.consumer, **self.producer}
        return [(k, mask(k, merged[k]), self.origins[k]) for k in sorted(merged)]

    @classmethod
    def build(
        cls,
        file: Mapping[str, Sourced],
        overrides: Mapping[str, str],
    ) -> ClientProperties:
        """Merge a file's properties (``read_properties``) and ``overrides`` (property → value,
        each from ``PIPELINE_KAFKA_<PROPERTY>``), check them, and split them by client kind.

        ``KafkaPropertiesError`` lists every problem.
        """
        problems: list[str] = []
        notes: list[str] = []
        given: dict[str, Sourced] = {}
        registry: dict[str, Sourced] = {}
        bootstrap: Sourced | None = None
        for key, item in file.items():
            if key == _JAAS:
                for name, value in _from_jaas(item, problems).items():
                    given.setdefault(name, Sourced(value, item.origin))
            elif key in REGISTRY_KEYS:
                registry[REGISTRY_KEYS[key]] = item
            elif key in ("bootstrap.servers", "metadata.broker.list"):
                bootstrap = item
            elif key in _IGNORED:
                notes.append(f"{item.origin}: {key} is not used here ({_IGNORED[key]})")
            else:
                problem = _refusal(key, item.value)
                if problem:
                    problems.append(f"{item.origin}: {problem}")
                elif key not in ("acks", "request.required.acks"):
                    given[key] = item
        for key, value in overrides.items():
            variable = f"PIPELINE_KAFKA_{key.upper().replace('.', '_')}"
            before = given.get(key)
            if before is not None and before.value != value:
                notes.append(f"{key}: {variable} overrides the value in {before.origin}")
            given[key] = Sourced(value, variable)
        _normalise(given, problems)
        _check(given, problems)
        if problems:
            raise KafkaPropertiesError(problems)
        out = cls(registry=registry, bootstrap_servers=bootstrap, notes=tuple(notes))
        for key, item in given.items():
            scope = _SCOPES.get(key, "any")
            target = {"any": out.common, "consumer": out.consumer, "producer": out.producer}[scope]
            target[key] = item.value
            out.origins[key] = item.origin
        return out


def _refusal(key: str, value: str) -> str:
    """Why ``key`` cannot be given in a file ("" when it can)."""
    if key in ("acks", "request.required.acks") and value.lower() in _ACKS_ALL:
        return ""  # the pipeline's own value: harmless
    if key in _OURS:
        return f"{key}: the pipeline sets this itself ({_OURS[key]}); remove it"
    if key in _JAVA:
        return f"{key} is a Java client setting; librdkafka uses {_JAVA[key]}"
    if key not in _SCOPES:
        close = difflib.get_close_matches(key, [*_SCOPES, *REGISTRY_KEYS], n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"{key} is not a librdkafka property{hint}"
    return ""


def _from_jaas(item: Sourced, problems: list[str]) -> dict[str, str]:
    """``sasl.jaas.config`` of a Java client file, as librdkafka properties: the user name and
    password of the PLAIN and SCRAM login modules, the client credentials of OAUTHBEARER."""
    options = dict(re.findall(r"""(\w+)\s*=\s*["']([^"']*)["']""", item.value))
    if "PlainLoginModule" in item.value or "ScramLoginModule" in item.value:
        if "username" in options and "password" in options:
            return {"sasl.username": options["username"], "sasl.password": options["password"]}
    elif "OAuthBearerLoginModule" in item.value:
        found = {"sasl.oauthbearer.method": "oidc"}
        for java, ours in (
            ("clientId", "sasl.oauthbearer.client.id"),
            ("clientSecret", "sasl.oauthbearer.client.secret"),
            ("scope", "sasl.oauthbearer.scope"),
        ):
            if java in options:
                found[ours] = options[java]
        extensions = [
            f"{k[len('extension_') :]}={v}"
            for k, v in options.items()
            if k.startswith("extension_")
        ]
        if extensions:
            found["sasl.oauthbearer.extensions"] = ",".join(extensions)
        return found
    problems.append(
        f"{item.origin}: sasl.jaas.config: only the PLAIN, SCRAM and OAUTHBEARER login modules "
        "with their options are understood; give sasl.username and sasl.password instead"
    )
    return {}


def _normalise(given: dict[str, Sourced], problems: list[str]) -> None:
    """Upper-case the enumerations librdkafka compares case-insensitively, and fold
    ``sasl.mechanisms`` into ``sasl.mechanism``."""
    if "sasl.mechanisms" in given:
        item = given.pop("sasl.mechanisms")
        if (
            "sasl.mechanism" in given
            and given["sasl.mechanism"].value.upper() != item.value.upper()
        ):
            problems.append(
                f"sasl.mechanism: {given['sasl.mechanism'].origin} says "
                f"{given['sasl.mechanism'].value!r}, {item.origin} says {item.value!r} "
                "(sasl.mechanisms)"
            )
        given.setdefault("sasl.mechanism", item)
    for key, allowed in (("security.protocol", _PROTOCOLS), ("sasl.mechanism", _MECHANISMS)):
        if key in given:
            item = given[key]
            value = item.value.upper()
            if value not in allowed:
                problems.append(
                    f"{item.origin}: {key}: {item.value!r} is not one of {', '.join(allowed)}"
                )
            given[key] = Sourced(value, item.origin)
    method = given.get("sasl.oauthbearer.method")
    if method is not None:
        if method.value.lower() not in _OAUTH_METHODS:
            problems.append(
                f"{method.origin}: sasl.oauthbearer.method: {method.value!r} is not one of "
                + ", ".join(_OAUTH_METHODS)
            )
        given["sasl.oauthbearer.method"] = Sourced(method.value.lower(), method.origin)


def _check(given: Mapping[str, Sourced], problems: list[str]) -> None:
    """The combinations that cannot work, and files that are not there."""

    def has(key: str) -> bool:
        return bool(given.get(key) and given[key].value)

    def origin(key: str) -> str:
        return given[key].origin

    protocol = given["security.protocol"].value if has("security.protocol") else "PLAINTEXT"
    sasl = protocol.startswith("SASL_")
    tls = protocol.endswith("SSL")
    mechanism = given["sasl.mechanism"].value if has("sasl.mechanism") else ""
    sasl_given = [k for k in ("sasl.mechanism", "sasl.username", "sasl.password") if has(k)]
    if sasl_given and not sasl:
        problems.append(
            f"{origin(sasl_given[0])}: {sasl_given[0]} is set but security.protocol is {protocol}, "
            "which does not authenticate with SASL; set security.protocol to SASL_SSL "
            "(or SASL_PLAINTEXT)"
        )
    if sasl and not mechanism:
        where = origin("security.protocol")
        problems.append(
            f"{where}: security.protocol {protocol} needs sasl.mechanism "
            f"(one of {', '.join(_MECHANISMS)}; PIPELINE_KAFKA_SASL_MECHANISM)"
        )
    if sasl and mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        for key in ("sasl.username", "sasl.password"):
            if not has(key):
                variable = f"PIPELINE_KAFKA_{key.upper().replace('.', '_')}"
                problems.append(f"sasl.mechanism {mechanism} needs {key} ({variable})")
    if sasl and mechanism == "OAUTHBEARER" and has("sasl.oauthbearer.method"):
        if given["sasl.oauthbearer.method"].value == "oidc":
            for key in (
                "sasl.oauthbearer.client.id",
                "sasl.oauthbearer.client.secret",
                "sasl.oauthbearer.token.endpoint.url",
            ):
                if not has(key) and not (
                    key.endswith(("client.id", "client.secret"))
                    and has(
                        key.replace("sasl.oauthbearer.", "sasl.oauthbearer.client.credentials.")
                    )
                ):
                    variable = f"PIPELINE_KAFKA_{key.upper().replace('.', '_')}"
                    problems.append(f"sasl.oauthbearer.method oidc needs {key} ({variable})")
    tls_given = [
        k for k in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location") if has(k)
    ]
    if tls_given and not tls:
        problems.append(
            f"{origin(tls_given[0])}: {tls_given[0]} is set but security.protocol is {protocol}, "
            "which does not use TLS; set security.protocol to SSL (or SASL_SSL)"
        )
    if has("ssl.certificate.location") != has("ssl.key.location"):
        present, absent = (
            ("ssl.certificate.location", "ssl.key.location")
            if has("ssl.certificate.location")
            else ("ssl.key.location", "ssl.certificate.location")
        )
        problems.append(f"{origin(present)}: {present} is set without {absent} (mTLS needs both)")
    for key in _FILES:
        if has(key):
            _check_file(given[key], key, problems)


def _check_file(item: Sourced, key: str, problems: list[str]) -> None:
    path = item.value
    if key == "ssl.ca.location" and path == "probe":
        return  # librdkafka's own: look for the system's CA bundle
    if not os.path.exists(path):
        problems.append(f"{item.origin}: {key}: {path} does not exist")
    elif not os.access(path, os.R_OK):
        problems.append(f"{item.origin}: {key}: {path} is not readable by this user")


def properties_of(settings_values: Iterable[tuple[str, str | None]]) -> dict[str, str]:
    """``{property: value}`` from ``(setting name, value)`` pairs of ``OVERRIDES`` that are set."""
    return {OVERRIDES[name]: value for name, value in settings_values if value}

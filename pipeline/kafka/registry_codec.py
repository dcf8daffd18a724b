"""Avro records in the Confluent wire format, through a Schema Registry.

With ``PIPELINE_SCHEMA_REGISTRY_URL`` set, records are written as ``00`` + the 4-byte big-endian
schema id the registry gave the writer schema + the Avro binary body (what every Confluent
serializer, Kafka Connect and ksqlDB read), by ``confluent_kafka.schema_registry``'s
``AvroSerializer`` and ``AvroDeserializer`` (fastavro underneath). ``make_codec`` picks the codec:

    >>> from pipeline.core.settings import Settings
    >>> type(make_codec(Settings())).__name__
    'Codec'

Choices, kept in ``docs/decisions-deploy.md``:

- ``encode(name, record)`` knows no topic, so subjects follow the *record name* strategy: the
  subject of a ``Delivery`` is ``pipeline.Delivery`` wherever it is written (the main topic, every
  retry tier, inside a dead letter), and one compatibility rule covers it everywhere.
- The schema registered is the one in ``schemas/``, with the types it borrows from another file
  written inline (``DeadLetter`` embeds ``Delivery``): one self-contained schema per subject, no
  schema references to resolve.
- Schemas are registered on first use (``auto.register.schemas``); the registry's compatibility
  check then guards evolution. A reader resolves the writer schema (fetched by id, cached) against
  our current one, exactly like the single-object path does by fingerprint.
- Records in single-object encoding (``C3 01``) still decode, so a running pipeline can switch to
  the registry without dead-lettering what is already on its topics.
- A registry that cannot be reached raises ``SchemaRegistryUnavailable``, never
  ``UndecodableRecord``: an outage must not send good records to the dead-letter topic.
"""

from __future__ import annotations

import copy
import functools
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.exceptions import PipelineError, UndecodableRecord
from pipeline.core.records import Delivery, delivery_to_record
from pipeline.core.settings import Settings
from pipeline.kafka.codec import _SCHEMA_FILES, MAGIC, Codec, schema_dir

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

__all__ = [
    "RegistryCodec",
    "SchemaRegistryUnavailable",
    "make_codec",
    "registry_client_config",
    "registry_schemas",
    "CONFLUENT_MAGIC",
]

#: First byte of a record in the Confluent wire format (then a 4-byte schema id).
CONFLUENT_MAGIC = 0
_CONFLUENT_HEADER = 5
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
#: The registry answers "not found" for an unknown schema id with this HTTP status.
_NOT_FOUND = 404


class SchemaRegistryUnavailable(PipelineError):
    """The Schema Registry did not answer (or answered an error other than "not found")."""


def make_codec(settings: Settings) -> Codec | RegistryCodec:
    """The codec ``settings`` ask for: Confluent wire format with a registry URL, else
    Avro single-object encoding (``Codec.default()``). One codec per registry (URL and
    credentials) and process."""
    if settings.schema_registry_url:
        conf = registry_client_config(settings)
        return _registry_codec(settings.schema_registry_url, tuple(sorted(conf.items())))
    return Codec.default()


def registry_client_config(settings: Settings) -> dict[str, str]:
    """The Schema Registry client's config beside its URL: basic auth
    (``PIPELINE_SCHEMA_REGISTRY_BASIC_AUTH``, ``user:password``) and TLS files."""
    conf = {}
    auth = settings.secret("schema_registry_basic_auth")
    if auth:
        conf["basic.auth.user.info"] = auth
    for key, value in (
        ("ssl.ca.location", settings.schema_registry_ssl_ca_location),
        ("ssl.certificate.location", settings.schema_registry_ssl_certificate_location),
        ("ssl.key.location", settings.schema_registry_ssl_key_location),
    ):
        if value:
            conf[key] = value
    return conf


@functools.cache
def _registry_codec(url: str, conf: tuple[tuple[str, str], ...]) -> RegistryCodec:
    return RegistryCodec(url, conf=dict(conf))


# ---- self-contained schemas --------------------------------------------------------------------


def _full_name(name: str, namespace: str | None) -> str:
    if "." in name or not namespace:
        return name
    return f"{namespace}.{name}"


def _inline(schema: Any, namespace: str | None, known: Mapping[str, Any], defined: set[str]) -> Any:
    """``schema`` with every reference to a type of ``known`` (defined in another file) replaced by
    that type's definition, the first time it is used; later uses stay references."""
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return schema
        full = _full_name(schema, namespace)
        if full not in defined and full in known:
            definition = known[full]
            return _inline(definition, None, known, defined)
        return schema
    if isinstance(schema, list):
        return [_inline(branch, namespace, known, defined) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    out = dict(schema)
    if kind in ("record", "error", "enum", "fixed"):
        own_namespace = schema.get("namespace", namespace)
        full = _full_name(str(schema["name"]), own_namespace)
        defined.add(full)
        if "." in full:
            own_namespace = full.rsplit(".", 1)[0]
        if kind in ("record", "error"):
            out["fields"] = [
                {**f, "type": _inline(f["type"], own_namespace, known, defined)}
                for f in schema["fields"]
            ]
        return out
    if kind == "array":
        out["items"] = _inline(schema["items"], namespace, known, defined)
    elif kind == "map":
        out["values"] = _inline(schema["values"], namespace, known, defined)
    elif isinstance(kind, dict | list) or (isinstance(kind, str) and kind not in _PRIMITIVES):
        out["type"] = _inline(kind, namespace, known, defined)
    return out


def _collect(schema: Any, namespace: str | None, into: dict[str, Any]) -> None:
    """Every named type in ``schema``, by full name, as a definition that stands on its own."""
    if isinstance(schema, list):
        for branch in schema:
            _collect(branch, namespace, into)
        return
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    if kind in ("record", "error", "enum", "fixed"):
        full = _full_name(str(schema["name"]), schema.get("namespace", namespace))
        definition = {k: v for k, v in schema.items() if k != "namespace"}
        definition["name"] = full  # a full name carries its namespace to nested types
        into.setdefault(full, copy.deepcopy(definition))
        own_namespace = full.rsplit(".", 1)[0] if "." in full else None
        for f in schema.get("fields", []):
            _collect(f["type"], own_namespace, into)
    elif kind == "array":
        _collect(schema["items"], namespace, into)
    elif kind == "map":
        _collect(schema["values"], namespace, into)
    elif isinstance(kind, dict | list):
        _collect(kind, namespace, into)


def registry_schemas(directory: Path | None = None) -> dict[str, str]:
    """Our current schemas as the registry gets them, by short name (``Call``, ``Delivery``...):
    JSON text, each self-contained (types from other files written inline)."""
    directory = directory or schema_dir()
    known: dict[str, Any] = {}
    result: dict[str, str] = {}
    for stem in _SCHEMA_FILES:
        raw = json.loads((directory / f"{stem}.avsc").read_text())
        expanded = _inline(raw, None, known, set())
        result[str(raw["name"]).rsplit(".", 1)[-1]] = json.dumps(expanded, ensure_ascii=False)
        _collect(raw, None, known)
    return result


def _registry_error() -> type[Exception]:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    return SchemaRegistryError


# ---- the codec ---------------------------------------------------------------------------------


class RegistryCodec:
    """``encode(name, record)`` / ``decode(name, data)`` like ``Codec``, in the Confluent wire
    format. ``client`` replaces the registry client (tests); ``conf`` adds client settings
    (``basic.auth.user.info``, ``ssl.ca.location``...).

    The registry is asked once per schema and process (to register a writer schema, or to fetch
    one by id); the answers are cached by the client.
    """

    def __init__(
        self,
        url: str,
        *,
        conf: Mapping[str, Any] | None = None,
        client: SchemaRegistryClient | None = None,
        directory: Path | None = None,
    ) -> None:
        # Imported here: the registry client needs confluent-kafka's ``schemaregistry`` extra,
        # which the default (single-object) path does without.
        from confluent_kafka.schema_registry import (
            Schema,
            SchemaRegistryClient,
            record_subject_name_strategy,
        )
        from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

        self.url = url
        self._local = Codec(directory) if directory is not None else Codec.default()
        self._client = client or SchemaRegistryClient({"url": url, **(conf or {})})
        self._schemas: dict[str, Schema] = {}
        self._subjects: dict[str, str] = {}
        self._registered: set[str] = set()
        self._lock = threading.Lock()
        self._serializers: dict[str, AvroSerializer] = {}
        self._deserializers: dict[str, AvroDeserializer] = {}
        for name, text in registry_schemas(directory).items():
            schema = Schema(text, schema_type="AVRO")
            self._schemas[name] = schema
            raw = json.loads(text)
            self._subjects[name] = _full_name(str(raw["name"]), raw.get("namespace"))
            self._serializers[name] = AvroSerializer(
                self._client,
                schema,
                conf={
                    "auto.register.schemas": True,
                    "subject.name.strategy": record_subject_name_strategy,
                },
            )
            self._deserializers[name] = AvroDeserializer(self._client, schema)

    def schema(self, name: str) -> Any:
        return self._local.schema(name)

    def close(self) -> None:
        """Close the registry client's HTTP connections."""
        self._client.close()

    def __enter__(self) -> RegistryCodec:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subject(self, name: str) -> str:
        """The registry subject of schema ``name`` (record name strategy: ``pipeline.Call``)."""
        return self._subjects[name]

    def _register(self, name: str) -> None:
        if name in self._registered:
            return
        with self._lock:
            if name in self._registered:
                return
            subject = self._subjects[name]
            try:
                self._client.register_schema(subject, self._schemas[name])
            except _registry_error() as exc:
                raise SchemaRegistryUnavailable(
                    f"schema registry {self.url} refused the {name} schema "
                    f"(subject {subject}): {exc}"
                ) from None
            except Exception as exc:  # httpx (or httpx2) transport errors, bad answers
                raise self._unreachable(exc) from None
            self._registered.add(name)

    def _unreachable(self, exc: Exception) -> SchemaRegistryUnavailable:
        return SchemaRegistryUnavailable(
            f"schema registry {self.url} unreachable: {type(exc).__name__}: {exc}"
        )

    def encode(self, name: str, record: dict[str, Any]) -> bytes:
        self._register(name)
        # Registered and cached by the client: the serializer asks the registry nothing now, and
        # an error here is the record's (like ``Codec.encode``).
        data = self._serializers[name](record, None)
        assert data is not None
        return data

    def delivery_values(self, first: Delivery, destinations: Sequence[str]) -> list[bytes]:
        """``RecordCodec.delivery_values``: each encoded."""
        return [
            self.encode("Delivery", delivery_to_record(first._replace(destination_id=name)))
            for name in destinations
        ]

    def decode(self, name: str, data: bytes | None) -> dict[str, Any]:
        """The record as our current schema ``name`` sees it; ``UndecodableRecord`` when the bytes
        are not a record (or name a schema id the registry does not know)."""
        if data is not None and data[:2] == MAGIC:
            return self._local.decode(name, data)
        if data is None or len(data) <= _CONFLUENT_HEADER or data[0] != CONFLUENT_MAGIC:
            raise UndecodableRecord(
                "not an Avro record in the Confluent wire format (no 00 + schema id header) "
                "nor in single-object encoding (no C3 01 header)"
            )
        schema_id = int.from_bytes(data[1:_CONFLUENT_HEADER], "big")
        try:
            self._client.get_schema(schema_id)
        except _registry_error() as exc:
            if getattr(exc, "http_status_code", None) == _NOT_FOUND:
                raise UndecodableRecord(
                    f"schema id {schema_id} is unknown to the schema registry {self.url}"
                ) from None
            raise SchemaRegistryUnavailable(
                f"schema registry {self.url}: could not fetch schema id {schema_id}: {exc}"
            ) from None
        except Exception as exc:  # httpx (or httpx2) transport errors, bad answers
            raise self._unreachable(exc) from None
        try:
            record = self._deserializers[name](data, None)
        except Exception as exc:  # the writer schema is cached: this is about the bytes
            raise UndecodableRecord(
                f"corrupt {name} record (schema id {schema_id}): {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(record, dict):
            raise UndecodableRecord(f"corrupt {name} record: not a record")
        return record

"""The walk over a parsed Avro schema that the compiled writer and reader share
(``pipeline.kafka.avro_writer``, ``pipeline.kafka.avro_reader``): which part of a schema each of
their builders makes a function of, and what neither covers (logical types, fixed, recursive
named types), for which they leave the schema to fastavro."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, NamedTuple, TypeVar

__all__ = ["Builders", "Unsupported", "build", "compile_schema"]

T = TypeVar("T")


class Unsupported(Exception):
    """The schema uses something the compiled writer and reader do not cover."""


class Builders(NamedTuple, Generic[T]):
    """What makes a function (``T``) of each part of a schema. ``record`` and ``union`` get the
    schema with what ``build`` needs to build their parts (``named``, ``enclosing``)."""

    primitives: Mapping[str, T]
    record: Callable[[dict[str, Any], dict[str, Any], frozenset[str]], T]
    union: Callable[[list[Any], dict[str, Any], frozenset[str]], T]
    enum: Callable[[list[str]], T]
    array: Callable[[T], T]
    map: Callable[[T], T]


def build(
    schema: Any, named: dict[str, Any], enclosing: frozenset[str], builders: Builders[T]
) -> T:
    """The function ``builders`` make of ``schema``; ``named``: the named types it may use;
    ``enclosing``: the records it is inside (a reference to one is recursive: not covered).
    Raises ``Unsupported``."""
    if isinstance(schema, str):
        if schema in builders.primitives:
            return builders.primitives[schema]
        if schema in named and schema not in enclosing:
            return build(named[schema], named, enclosing, builders)
        raise Unsupported(f"named type {schema!r} (unknown or recursive)")
    if isinstance(schema, list):
        return builders.union(schema, named, enclosing)
    if not isinstance(schema, dict) or "logicalType" in schema:
        raise Unsupported(repr(schema))
    kind = schema.get("type")
    if kind == "record":
        return builders.record(schema, named, enclosing | {schema["name"]})
    if kind == "enum":
        return builders.enum(schema["symbols"])
    if kind == "array":
        return builders.array(build(schema["items"], named, enclosing, builders))
    if kind == "map":
        return builders.map(build(schema["values"], named, enclosing, builders))
    if isinstance(kind, str) and kind in builders.primitives:
        return builders.primitives[kind]
    raise Unsupported(repr(kind))


def compile_schema(schema: Any, builders: Builders[T]) -> T | None:
    """The function ``builders`` make of a whole parsed schema (as ``fastavro.parse_schema``
    returns it, its named types with it), or ``None`` when it uses something they do not
    cover (then use fastavro)."""
    named: dict[str, Any] = (
        dict(schema.get("__named_schemas", {})) if isinstance(schema, dict) else {}
    )
    try:
        return build(schema, named, frozenset(), builders)
    except Unsupported:
        return None

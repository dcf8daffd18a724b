"""The compiled Avro writer gives fastavro's bytes, for every schema of ``schemas/``.

Valid records are drawn from each schema; "wild" records put arbitrary values anywhere. For both,
``Codec.encode`` (compiled fast path, fastavro fallback) must equal fastavro alone: the same bytes,
or an error from both.
"""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.kafka.avro_writer import (
    LONGS,
    STRINGS,
    compile_writer,
    long_bytes,
    string_bytes,
    write_long,
    write_string,
)
from pipeline.kafka.codec import Codec

CODEC = Codec.default()
NAMES = sorted(CODEC._schemas)

_LONG = st.integers(-(1 << 63), (1 << 63) - 1)
_INT = st.integers(-(1 << 31), (1 << 31) - 1)
_TEXT = st.text(max_size=80)
_WILD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=10),
    st.binary(max_size=10),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
)


def fastavro_bytes(name: str, record: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, CODEC.schema(name), record)
    return CODEC._headers[name] + out.getvalue()


def values(schema: Any, named: dict[str, Any], wild: bool) -> st.SearchStrategy[Any]:
    """Values of ``schema``; with ``wild``, any value may be replaced by an arbitrary one."""
    strategy = _valid(schema, named, wild)
    return st.one_of(strategy, _WILD) if wild else strategy


def _valid(schema: Any, named: dict[str, Any], wild: bool) -> st.SearchStrategy[Any]:
    if isinstance(schema, list):
        return st.one_of(*(values(branch, named, wild) for branch in schema))
    if isinstance(schema, str) and schema in named:
        return _valid(named[schema], named, wild)
    kind = schema["type"] if isinstance(schema, dict) else schema
    primitives: dict[str, st.SearchStrategy[Any]] = {
        "null": st.none(),
        "boolean": st.booleans(),
        "int": _INT,
        "long": _LONG,
        "float": st.floats(width=32, allow_nan=False),
        "double": st.floats(allow_nan=False),
        "bytes": st.binary(max_size=80),
        "string": _TEXT,
    }
    if kind in primitives:
        return primitives[kind]
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "array":
        return st.lists(values(schema["items"], named, wild), max_size=4)
    if kind == "map":
        return st.dictionaries(_TEXT, values(schema["values"], named, wild), max_size=4)
    assert kind == "record", kind
    fields = {f["name"]: values(f["type"], named, wild) for f in schema["fields"]}
    if not wild:
        return st.fixed_dictionaries(fields)
    # Wild records may also miss fields (fastavro then writes the default, or refuses).
    return st.fixed_dictionaries({}, optional=fields)


def records(name: str, wild: bool) -> st.SearchStrategy[Any]:
    schema = CODEC.schema(name)
    return values(schema, schema["__named_schemas"], wild)


def test_every_schema_of_ours_is_compiled() -> None:
    assert all(CODEC._compiled[name] is not None for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_valid_records_encode_exactly_as_fastavro(name: str, data: st.DataObject) -> None:
    record = data.draw(records(name, wild=False))
    write = CODEC._compiled[name]
    assert write is not None
    out = bytearray(CODEC._headers[name])
    write(out, record)  # the fast path itself, not the fallback
    assert bytes(out) == fastavro_bytes(name, record)
    assert CODEC.decode(name, bytes(out)) == CODEC.decode(name, fastavro_bytes(name, record))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_record_encodes_as_fastavro_or_fails_as_it(name: str, data: st.DataObject) -> None:
    record = data.draw(records(name, wild=True))
    try:
        expected: bytes | None = fastavro_bytes(name, record)
    except Exception:  # noqa: BLE001 - fastavro refuses it, in its own words
        expected = None
    if expected is None:
        with pytest.raises(Exception):  # noqa: B017 - whatever fastavro raises
            CODEC.encode(name, record)
    else:
        assert CODEC.encode(name, record) == expected


def test_missing_fields_fall_back_to_fastavro_defaults() -> None:
    record = {"id": "web", "name": "Web"}  # writeKeys and the rest take their defaults
    assert CODEC.encode("Source", record) == fastavro_bytes("Source", record)


@pytest.mark.parametrize(
    ("schema", "value", "expected"),
    [
        ("long", 0, b"\x00"),
        ("long", -1, b"\x01"),
        ("long", 63, b"\x7e"),
        ("long", 64, b"\x80\x01"),
        ("long", (1 << 63) - 1, b"\xfe" + b"\xff" * 8 + b"\x01"),
        ("long", -(1 << 63), b"\xff" * 9 + b"\x01"),
        ("int", -(1 << 31), b"\xff\xff\xff\xff\x0f"),
        ("string", "é", b"\x04\xc3\xa9"),
        ("bytes", b"x" * 64, b"\x80\x01" + b"x" * 64),
        ("boolean", True, b"\x01"),
        ("double", 1.5, b"\x00\x00\x00\x00\x00\x00\xf8\x3f"),
        (["null", "string"], None, b"\x00"),
        (["string", "null"], None, b"\x02"),
        ({"type": "array", "items": "int"}, [1, 2], b"\x04\x02\x04\x00"),
        ({"type": "map", "values": "int"}, {"a": 1}, b"\x02\x02a\x02\x00"),
        ({"type": "enum", "name": "E", "symbols": ["a", "b"]}, "b", b"\x02"),
    ],
)
def test_known_encodings(schema: Any, value: Any, expected: bytes) -> None:
    """Byte values from the Avro specification's encoding rules, independent of fastavro."""
    write = compile_writer(fastavro.parse_schema(schema))
    assert write is not None
    out = bytearray()
    write(out, value)
    assert bytes(out) == expected


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ("long", 1 << 63),
        ("int", 1 << 31),
        ("long", 1.0),
        ("long", True),
        ("string", b"bytes"),
        ("bytes", "text"),
        ("boolean", 1),
        (["null", "string"], 5),
        ({"type": "enum", "name": "E", "symbols": ["a"]}, "z"),
        ({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}, {}),
    ],
)
def test_unexpected_values_raise_so_fastavro_decides(schema: Any, value: Any) -> None:
    write = compile_writer(fastavro.parse_schema(schema))
    assert write is not None
    with pytest.raises((TypeError, KeyError, OverflowError)):
        write(bytearray(), value)


@pytest.mark.parametrize(
    "schema",
    [
        ["null", "string", "long"],  # a union other than [null, X]
        {"type": "fixed", "name": "F", "size": 4},
        {"type": "long", "logicalType": "timestamp-millis"},
        {
            "type": "record",
            "name": "Node",
            "fields": [{"name": "next", "type": ["null", "Node"]}],
        },  # recursive
    ],
)
def test_schemas_it_does_not_cover_are_left_to_fastavro(schema: Any) -> None:
    assert compile_writer(fastavro.parse_schema(schema)) is None


# ---- the caches of encoded values, for writers of a known shape -------------------------------


@given(text=_TEXT, value=_LONG)
def test_remembered_values_are_the_writers_bytes(text: str, value: int) -> None:
    written = bytearray()
    write_string(written, text)
    assert string_bytes(text) == bytes(written) == STRINGS[text]
    written = bytearray()
    write_long(written, value)
    assert long_bytes(value) == bytes(written) == LONGS[value]


@pytest.mark.parametrize(
    ("value", "error"),
    [(1 << 63, OverflowError), (-(1 << 63) - 1, OverflowError), ("1", TypeError)],
)
def test_a_long_it_cannot_write_raises_and_is_not_remembered(value: Any, error: type) -> None:
    with pytest.raises(error):
        long_bytes(value)
    assert value not in LONGS


def test_the_caches_stay_bounded() -> None:
    for n in range(10_000):
        string_bytes(f"destination-{n}")
        long_bytes(1_800_000_000_000 + n)
    assert 0 < len(STRINGS) <= 4096
    assert 0 < len(LONGS) <= 4096

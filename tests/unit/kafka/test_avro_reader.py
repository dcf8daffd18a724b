"""The compiled Avro reader reads fastavro's values, for every schema of ``schemas/``.

Valid records are drawn from each schema (the writer's tests' strategies). From their bytes the
compiled reader must read what fastavro reads; from damaged bytes (cut short, a byte changed,
one added) it must read what fastavro reads or raise, so that ``Codec.decode`` (compiled fast
path, fastavro fallback) accepts and refuses exactly what fastavro alone does.
"""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.exceptions import UndecodableRecord
from pipeline.kafka.avro_reader import compile_reader
from pipeline.kafka.codec import Codec
from tests.unit.kafka.test_avro_writer import NAMES, fastavro_bytes, records

CODEC = Codec.default()
HEADER = 10


def compiled(name: str) -> Any:
    read = CODEC._readers[CODEC.header(name)[2:]]
    assert read is not None
    return read


def fastavro_read(name: str, data: bytes) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(data[HEADER:]), CODEC.schema(name), None)


def test_every_schema_of_ours_is_compiled() -> None:
    assert all(compiled(name) is not None for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_valid_records_read_exactly_as_fastavro_reads_them(name: str, data: st.DataObject) -> None:
    encoded = fastavro_bytes(name, data.draw(records(name, wild=False)))
    assert compiled(name)(encoded, HEADER) == fastavro_read(name, encoded)


def _damaged(encoded: bytes, data: st.DataObject) -> bytes:
    body = len(encoded) - HEADER
    how = data.draw(st.sampled_from(["cut", "change", "add", "append"]))
    at = HEADER + data.draw(st.integers(0, max(body - 1, 0)))
    byte = bytes([data.draw(st.integers(0, 255))])
    if how == "cut":
        return encoded[:at]
    if how == "change":
        return encoded[:at] + byte + encoded[at + 1 :]
    if how == "add":
        return encoded[:at] + byte + encoded[at:]
    return encoded + byte


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_bytes_read_as_fastavro_reads_them_or_raise(name: str, data: st.DataObject) -> None:
    damaged = _damaged(fastavro_bytes(name, data.draw(records(name, wild=False))), data)
    try:
        value = compiled(name)(damaged, HEADER)
    except Exception:  # noqa: BLE001 - the codec then asks fastavro
        return
    # By repr: a changed byte may make a double NaN, which equals nothing, not even itself.
    assert repr(value) == repr(fastavro_read(name, damaged))


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "index out of range"),  # nothing at all
        (b"\x02", "length out of range"),  # a messageId of one byte, then nothing
        (b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "ten bytes"),  # a varint too long
    ],
)
def test_bytes_it_cannot_read_raise(body: bytes, says: str) -> None:
    with pytest.raises(Exception, match=says):
        compiled("Delivery")(CODEC.header("Delivery") + body, HEADER)


def test_the_codec_still_names_what_is_wrong_with_a_record_it_cannot_read() -> None:
    with pytest.raises(UndecodableRecord, match="corrupt Delivery record"):
        CODEC.decode("Delivery", CODEC.header("Delivery") + b"\x02")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "fixed", "name": "F", "size": 4},
        {"type": "long", "logicalType": "timestamp-millis"},
        {"type": "record", "name": "N", "fields": [{"name": "next", "type": ["null", "N"]}]},
    ],
)
def test_schemas_it_does_not_cover_are_left_to_fastavro(schema: Any) -> None:
    assert compile_reader(fastavro.parse_schema(schema)) is None

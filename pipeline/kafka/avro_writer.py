"""A compiled Avro binary writer: fastavro's bytes for well-formed records, three times faster.

fastavro's ``schemaless_writer`` walks the schema again for every record, about half a
microsecond a field: 12 µs for a ``Call``, the largest single cost of the ingestion API.
``compile_writer`` walks a parsed schema once and returns a function made of one small writer per
field (4 µs for a ``Call``). It covers the types our schemas use (every primitive, enums, records,
arrays, maps and ``["null", X]`` unions); for a schema with anything else it returns ``None`` and
the codec keeps fastavro for it.

The compiled writer is a fast path, not a second set of rules. It raises on any value it does not
expect exactly (a missing field, a wrong type, a long out of range, an unknown enum symbol), and
``Codec.encode`` then hands the record to fastavro, which writes it (field defaults, the type
coercions it allows) or names the problem. ``tests/unit/test_avro_writer.py`` checks, for every
schema of ``schemas/``, that both give the same bytes for arbitrary records.

    >>> import fastavro
    >>> schema = fastavro.parse_schema({"type": "record", "name": "T", "fields": [
    ...     {"name": "id", "type": "string"}, {"name": "n", "type": ["null", "long"]}]})
    >>> write = compile_writer(schema)
    >>> out = bytearray()
    >>> write(out, {"id": "a", "n": -2})
    >>> bytes(out)
    b'\\x02a\\x02\\x03'
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from pipeline.kafka.avro_schema import Builders, Unsupported, build, compile_schema

__all__ = ["compile_writer", "Writer"]

#: Appends one value's Avro binary encoding to ``out``; raises on a value it does not expect.
Writer = Callable[[bytearray, Any], None]

_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
#: The zig-zag varint of 0..63 is one byte: 2 * n.
_SMALL = [bytes([n << 1]) for n in range(64)]
_DOUBLE = struct.Struct("<d").pack
_FLOAT = struct.Struct("<f").pack


#: Varints of values met lately, by value: timestamps repeat within a millisecond (a batch's
#: records share their ``now``) and sizes repeat. Bounded; a race between threads only costs a miss.
_VARINTS: dict[int, bytes] = {}
_VARINTS_MAX = 4096


def _varint(value: int) -> bytes:
    """The zig-zag varint of a value already checked to fit in 64 bits."""
    encoded = _VARINTS.get(value)
    if encoded is None:
        n = (value << 1) ^ (value >> 63)
        out = bytearray()
        while n > 0x7F:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        encoded = bytes(out)
        if len(_VARINTS) >= _VARINTS_MAX:
            _VARINTS.clear()
        _VARINTS[value] = encoded
    return encoded


def _integer_writer(kind: str, low: int, high: int) -> Writer:
    def write_integer(out: bytearray, value: Any) -> None:
        if type(value) is not int:
            raise TypeError(f"an Avro {kind} must be an int, got {type(value).__name__}")
        if 0 <= value < 64:
            out += _SMALL[value]
        elif low <= value <= high:
            out += _varint(value)
        else:
            raise OverflowError(f"{value} does not fit in an Avro {kind}")

    return write_integer


_write_long = _integer_writer("long", _LONG_MIN, _LONG_MAX)
_write_int = _integer_writer("int", _INT_MIN, _INT_MAX)


def _write_bytes(out: bytearray, value: Any) -> None:
    if type(value) is not bytes:
        raise TypeError(f"bytes must be bytes, got {type(value).__name__}")
    size = len(value)
    if size < 64:
        out += _SMALL[size]
    else:
        out += _varint(size)
    out += value


def _write_string(out: bytearray, value: Any) -> None:
    if type(value) is not str:
        raise TypeError(f"a string must be a str, got {type(value).__name__}")
    data = value.encode()
    size = len(data)
    if size < 64:
        out += _SMALL[size]
    else:
        out += _varint(size)
    out += data


def _write_boolean(out: bytearray, value: Any) -> None:
    if value is True:
        out.append(1)
    elif value is False:
        out.append(0)
    else:
        raise TypeError(f"a boolean must be True or False, got {type(value).__name__}")


def _write_double(out: bytearray, value: Any) -> None:
    if type(value) is not float and type(value) is not int:
        raise TypeError(f"a double must be a float, got {type(value).__name__}")
    out += _DOUBLE(value)


def _write_float(out: bytearray, value: Any) -> None:
    if type(value) is not float and type(value) is not int:
        raise TypeError(f"a float must be a float, got {type(value).__name__}")
    out += _FLOAT(value)


def _write_null(_out: bytearray, value: Any) -> None:
    if value is not None:
        raise TypeError(f"null must be None, got {type(value).__name__}")


_PRIMITIVES: dict[str, Writer] = {
    "null": _write_null,
    "boolean": _write_boolean,
    "int": _write_int,
    "long": _write_long,
    "float": _write_float,
    "double": _write_double,
    "bytes": _write_bytes,
    "string": _write_string,
}


def compile_writer(schema: Any) -> Writer | None:
    """A writer for ``schema`` (as ``fastavro.parse_schema`` returns it), or ``None`` when the
    schema uses something this module does not cover (then use fastavro)."""
    return compile_schema(schema, _BUILDERS)


def _compile(schema: Any, named: dict[str, Any], enclosing: frozenset[str]) -> Writer:
    return build(schema, named, enclosing, _BUILDERS)


#: Field writers ``_record`` writes inline, as Python source (the field's value in ``v``): a call
#: per field cost as much as the field's encoding (the log's entries have 16 fields, most empty).
_STRING = """\
if type(v) is not str:
    raise TypeError(f"a string must be a str, got {type(v).__name__}")
if v:
    data = v.encode()
    size = len(data)
    out += _SMALL[size] if size < 64 else _varint(size)
    out += data
else:
    out += _EMPTY"""
_INTEGER = """\
if type(v) is not int:
    raise TypeError(f"an Avro KIND must be an int, got {type(v).__name__}")
if 0 <= v < 64:
    out += _SMALL[v]
elif LOW <= v <= HIGH:
    out += _varint(v)
else:
    raise OverflowError(f"{v} does not fit in an Avro KIND")"""


def _integer_source(kind: str, low: int, high: int) -> str:
    return _INTEGER.replace("KIND", kind).replace("LOW", str(low)).replace("HIGH", str(high))


_INLINE: dict[Writer, str] = {
    _write_string: _STRING,
    _write_long: _integer_source("long", _LONG_MIN, _LONG_MAX),
    _write_int: _integer_source("int", _INT_MIN, _INT_MAX),
}


def _record(schema: dict[str, Any], named: dict[str, Any], enclosing: frozenset[str]) -> Writer:
    """A writer with each field's code in line, made once per record schema (``exec``: the
    schema's field names only appear as string literals, through ``repr``)."""
    lines = [
        "def write_record(out, value):",
        "    if type(value) is not dict:",
        '        raise TypeError(f"a record must be a dict, got {type(value).__name__}")',
    ]
    scope: dict[str, Any] = {"_SMALL": _SMALL, "_varint": _varint, "_EMPTY": _SMALL[0]}
    for number, field in enumerate(schema["fields"]):
        write = _compile(field["type"], named, enclosing)
        value = f"value[{field['name']!r}]"
        inline = _INLINE.get(write)
        if inline is None and (optional := getattr(write, "optional_string", None)):
            null_tag, other_tag = optional
            scope[f"null{number}"], scope[f"other{number}"] = null_tag, other_tag
            string = "".join("    " + line + "\n" for line in _STRING.splitlines())
            inline = f"if v is None:\n    out += null{number}\nelse:\n    out += other{number}\n"
            inline += string
        if inline is None:
            scope[f"write{number}"] = write
            lines.append(f"    write{number}(out, {value})")
            continue
        lines.append(f"    v = {value}")
        lines += ["    " + line for line in inline.splitlines()]
    exec("\n".join(lines), scope)  # noqa: S102 - our source, above
    record_writer: Writer = scope["write_record"]
    return record_writer


def _enum(symbols: list[str]) -> Writer:
    index = {symbol: _SMALL[i] if i < 64 else _varint(i) for i, symbol in enumerate(symbols)}

    def write_enum(out: bytearray, value: Any) -> None:
        out += index[value]

    return write_enum


def _union(branches: list[Any], named: dict[str, Any], enclosing: frozenset[str]) -> Writer:
    if len(branches) != 2 or "null" not in branches:
        raise Unsupported(f"union {branches!r}: only ['null', X] is compiled")
    null_index = branches.index("null")
    other = _compile(branches[1 - null_index], named, enclosing)
    null_tag, other_tag = _SMALL[null_index], _SMALL[1 - null_index]
    if other is _write_string:  # the commonest field of all: inlined

        def write_optional_string(out: bytearray, value: Any) -> None:
            if value is None:
                out += null_tag
            elif type(value) is str:
                data = value.encode()
                size = len(data)
                out += other_tag
                if size < 64:
                    out += _SMALL[size]
                else:
                    out += _varint(size)
                out += data
            else:
                raise TypeError(f"a string must be a str, got {type(value).__name__}")

        write_optional_string.optional_string = (null_tag, other_tag)  # type: ignore[attr-defined]
        return write_optional_string

    def write_optional(out: bytearray, value: Any) -> None:
        if value is None:
            out += null_tag
        else:
            out += other_tag
            other(out, value)

    return write_optional


def _array(items: Writer) -> Writer:
    def write_array(out: bytearray, value: Any) -> None:
        if type(value) is not list:
            raise TypeError(f"an array must be a list, got {type(value).__name__}")
        if value:
            _write_long(out, len(value))
            for item in value:
                items(out, item)
        out.append(0)

    return write_array


def _map(values: Writer) -> Writer:
    def write_map(out: bytearray, value: Any) -> None:
        if type(value) is not dict:
            raise TypeError(f"a map must be a dict, got {type(value).__name__}")
        if value:
            _write_long(out, len(value))
            for key, item in value.items():
                _write_string(out, key)
                values(out, item)
        out.append(0)

    return write_map


#: The writers of single values, for code that writes a known record shape straight to bytes
#: (``pipeline.kafka.log_batches``): the same checks and bytes as the compiled writers.
write_string = _write_string
write_long = _write_long
write_int = _write_int

#: Values such a writer meets again and again (a source, a destination, a URL, a millisecond, a
#: status), encoded: ``STRINGS.get(text) or string_bytes(text)`` is a look-up where the writer
#: is a call, a check, an encode and two appends (about half the time of a delivered call's two
#: log records). Values that seldom repeat (message ids, user ids) are not for these caches: they
#: would churn them and evict the ones that do.
STRINGS: dict[str, bytes] = {}
LONGS = _VARINTS


def string_bytes(text: str) -> bytes:
    """``text`` as an Avro string, remembered in ``STRINGS`` (bounded like ``_VARINTS``)."""
    out = bytearray()
    _write_string(out, text)
    encoded = bytes(out)
    if len(STRINGS) >= _VARINTS_MAX:
        STRINGS.clear()
    STRINGS[text] = encoded
    return encoded


def long_bytes(value: int) -> bytes:
    """``value`` as an Avro long, remembered in ``LONGS``; raises as ``write_long`` does. Also
    an int's bytes (the same varint), for ints of the pipeline's own making."""
    _write_long(bytearray(), value)  # its checks: an int, in range
    return _varint(value)


_BUILDERS = Builders(_PRIMITIVES, _record, _union, _enum, _array, _map)

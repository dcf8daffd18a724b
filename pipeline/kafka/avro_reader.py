"""A compiled Avro binary reader: fastavro's values for well-formed records, faster.

fastavro's ``schemaless_reader`` walks the schema again for every record: 8 µs for a ``Call``,
which the router reads once a call, and 5 µs for a ``Delivery``, which the delivery roles read.
``compile_reader`` walks a parsed schema once and returns a function made of one small reader per
field. It covers what ``pipeline.kafka.avro_writer`` covers (every primitive, enums, records,
arrays, maps and unions; no logical types) and reads records written with the same schema only:
resolving an older writer schema stays fastavro's.

The compiled reader is a fast path, not a second set of rules. It raises on anything it does not
expect exactly (bytes running short or left over, a length or index out of range, a boolean byte
other than 0 or 1, a varint over ten bytes, text that is not UTF-8), and ``Codec.decode`` then
hands the bytes to fastavro, which reads them or names the problem.
``tests/unit/kafka/test_avro_reader.py`` checks, for every schema of ``schemas/``, that both
read the same values from arbitrary records, and that from damaged bytes the compiled reader
reads what fastavro reads or raises.

    >>> import fastavro
    >>> schema = fastavro.parse_schema({"type": "record", "name": "T", "fields": [
    ...     {"name": "id", "type": "string"}, {"name": "n", "type": ["null", "long"]}]})
    >>> read = compile_reader(schema)
    >>> read(b'\\x02a\\x02\\x03', 0)
    {'id': 'a', 'n': -2}
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from pipeline.kafka.avro_schema import Builders, build, compile_schema

__all__ = ["compile_reader", "Reader"]

#: The value of a whole record read from ``data`` at ``start``; raises on what it does not expect.
Reader = Callable[[bytes, int], Any]
#: One value read from ``data`` at ``pos``: (the value, the position after it).
_Read = Callable[[bytes, int], tuple[Any, int]]

_DOUBLE = struct.Struct("<d").unpack_from
_FLOAT = struct.Struct("<f").unpack_from


class _Corrupt(ValueError):
    """The bytes are not what the schema says (fastavro then reads them, or names the
    problem)."""


def _indent(code: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in code.splitlines())


#: Field readers ``_record`` writes inline, as Python source (the value goes to ``v``): a call per
#: field cost more than the field's decoding (0.3 µs a field, 5.4 µs a ``Call``).
_LONG = """\
b = data[pos]
pos += 1
if b < 0x80:
    v = (b >> 1) ^ -(b & 1)
else:
    v, shift = b & 0x7F, 7
    while True:
        b = data[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise _Corrupt("a varint of more than ten bytes")
    if v >> 64:
        raise _Corrupt("a varint over 64 bits")
    v = (v >> 1) ^ -(v & 1)"""
_SPAN = f"""\
{_LONG}
end = pos + v
if v < 0 or end > size:
    raise _Corrupt("a length out of range")"""
_STRING = f"""\
{_SPAN}
v = data[pos:end].decode()
pos = end"""
_BYTES = f"""\
{_SPAN}
v = data[pos:end]
pos = end"""


def _from_source(name: str, code: str, result: str, names: dict[str, Any] | None = None) -> Any:
    """A function ``name(data, pos)`` made of the inline reader ``code`` (which may call
    ``names``): returns ``result``."""
    scope: dict[str, Any] = {"_Corrupt": _Corrupt, **(names or {})}
    source = f"def {name}(data, pos):\n{_indent(code, '    ')}\n    return {result}"
    exec(source, scope)  # noqa: S102 - our own source
    return scope[name]


#: The readers called where a value is not inline (a union's index, an enum's, a block's count,
#: a map's keys, a field of a record that is not inline): made of the same source as the inline
#: ones, so the two cannot part.
_read_long: Callable[[bytes, int], tuple[int, int]] = _from_source("read_long", _LONG, "v, pos")
_read_string: Callable[[bytes, int], tuple[str, int]] = _from_source(
    "read_string", "size = len(data)\n" + _STRING, "v, pos"
)
_read_bytes: Callable[[bytes, int], tuple[bytes, int]] = _from_source(
    "read_bytes", "size = len(data)\n" + _BYTES, "v, pos"
)


def _read_boolean(data: bytes, pos: int) -> tuple[bool, int]:
    byte = data[pos]
    if byte > 1:
        raise _Corrupt("a boolean byte other than 0 or 1")
    return byte == 1, pos + 1


def _read_double(data: bytes, pos: int) -> tuple[float, int]:
    return _DOUBLE(data, pos)[0], pos + 8


def _read_float(data: bytes, pos: int) -> tuple[float, int]:
    return _FLOAT(data, pos)[0], pos + 4


def _read_null(_data: bytes, pos: int) -> tuple[None, int]:
    return None, pos


_PRIMITIVES: dict[str, _Read] = {
    "null": _read_null,
    "boolean": _read_boolean,
    "int": _read_long,
    "long": _read_long,
    "float": _read_float,
    "double": _read_double,
    "bytes": _read_bytes,
    "string": _read_string,
}


def compile_reader(schema: Any) -> Reader | None:
    """A reader for records written with ``schema`` (as ``fastavro.parse_schema`` returns it),
    or ``None`` when the schema uses something this module does not cover (then use
    fastavro)."""
    read = compile_schema(schema, _BUILDERS)
    if read is None:
        return None

    def read_all(data: bytes, start: int) -> Any:
        value, end = read(data, start)
        if end != len(data):
            raise _Corrupt("bytes left over after the record")
        return value

    return read_all


def _compile(schema: Any, named: dict[str, Any], enclosing: frozenset[str]) -> _Read:
    return build(schema, named, enclosing, _BUILDERS)


_INLINE = {"string": _STRING, "bytes": _BYTES, "long": _LONG, "int": _LONG}


def _record(schema: dict[str, Any], named: dict[str, Any], enclosing: frozenset[str]) -> _Read:
    """One function reading the record's fields in order: strings, longs and ``["null", X]``
    of them inline, the others through their readers."""
    readers: dict[str, _Read] = {}
    lines = ["size = len(data)", "r = {}"]
    for index, field in enumerate(schema["fields"]):
        kind, optional = field["type"], False
        if isinstance(kind, list) and len(kind) == 2 and kind[0] == "null":
            kind, optional = kind[1], True
        inline = _INLINE.get(kind) if isinstance(kind, str) else None
        if inline is None:
            readers[f"_r{index}"] = _compile(field["type"], named, enclosing)
            code = f"v, pos = _r{index}(data, pos)"
        elif optional:
            code = "\n".join(
                [
                    "b = data[pos]",
                    "pos += 1",
                    "if b == 0:",
                    "    v = None",
                    "elif b == 2:",
                    _indent(inline, "    "),
                    "else:",
                    '    raise _Corrupt("a union index out of range")',
                ]
            )
        else:
            code = inline
        lines += [code, f"r[{field['name']!r}] = v"]
    read: _Read = _from_source("read_record", "\n".join(lines), "r, pos", readers)
    return read


def _union(schema: list[Any], named: dict[str, Any], enclosing: frozenset[str]) -> _Read:
    branches = [_compile(branch, named, enclosing) for branch in schema]
    if len(branches) == 2 and branches[0] is _read_null:  # ["null", X], most of ours
        other = branches[1]

        def read_optional(data: bytes, pos: int) -> tuple[Any, int]:
            index = data[pos]
            if index == 0:
                return None, pos + 1
            if index == 2:
                return other(data, pos + 1)
            raise _Corrupt("a union index out of range")

        return read_optional

    count = len(branches)

    def read_union(data: bytes, pos: int) -> tuple[Any, int]:
        index, pos = _read_long(data, pos)
        if not 0 <= index < count:
            raise _Corrupt("a union index out of range")
        return branches[index](data, pos)

    return read_union


def _enum(names: list[str]) -> _Read:
    symbols = tuple(names)
    count = len(symbols)

    def read_enum(data: bytes, pos: int) -> tuple[str, int]:
        index, pos = _read_long(data, pos)
        if not 0 <= index < count:
            raise _Corrupt("an enum index out of range")
        return symbols[index], pos

    return read_enum


def _blocks(data: bytes, pos: int, read_item: Callable[[bytes, int], int]) -> int:
    """Read an array's or a map's blocks, each item by ``read_item``; the position after."""
    while True:
        count, pos = _read_long(data, pos)
        if count == 0:
            return pos
        if count < 0:  # a block that says its size in bytes too
            count = -count
            _, pos = _read_long(data, pos)
        for _ in range(count):
            pos = read_item(data, pos)


def _array(read: _Read) -> _Read:
    def read_array(data: bytes, pos: int) -> tuple[list[Any], int]:
        items: list[Any] = []

        def item(data: bytes, pos: int) -> int:
            value, pos = read(data, pos)
            items.append(value)
            return pos

        return items, _blocks(data, pos, item)

    return read_array


def _map(read: _Read) -> _Read:
    def read_map(data: bytes, pos: int) -> tuple[dict[str, Any], int]:
        entries: dict[str, Any] = {}

        def entry(data: bytes, pos: int) -> int:
            key, pos = _read_string(data, pos)
            entries[key], pos = read(data, pos)
            return pos

        return entries, _blocks(data, pos, entry)

    return read_map


_BUILDERS = Builders(_PRIMITIVES, _record, _union, _enum, _array, _map)

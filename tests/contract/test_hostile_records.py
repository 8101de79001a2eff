"""Hostile records are records (issue #51): values built to exhaust a staging task's stack or memory are
quarantined with the reason, their neighbours staged."""
from __future__ import annotations

import json
import struct

import pytest
from fastavro import parse_schema

from ledgerbatch.formats.bad_value import BadValue
from ledgerbatch.formats.decoders.avro import AvroDecoder, unbounded_items
from ledgerbatch.formats.parse import make_parser
from ledgerbatch.formats.schema import parse_schema as parse_columns
from ledgerbatch.source.reader import Records


def staged_errors(parser, values: list[bytes]) -> list:
    batch = parser.parse("t", 0, Records(list(range(len(values))), [None] * len(values), values))
    return batch.column("_error").to_pylist()


@pytest.mark.parametrize("depth, bad", [(150, False), (200, False), (201, True), (450, True), (900, True)])
def test_a_deeply_nested_json_value_is_quarantined(depth, bad):
    parser = make_parser(parse_columns("id STRING, doc VARIANT"), (), "json", None, ())
    good = b'{"id": "a", "doc": {"x": 1}}'
    hostile = b'{"id": "h", "doc": ' + b"[" * depth + b"]" * depth + b"}"
    errors = staged_errors(parser, [good, hostile, good])
    assert errors[0] is errors[2] is None
    assert (errors[1] == "field doc: nested too deeply (more than 200 levels)") if bad else errors[1] is None


def zigzag(n: int) -> bytes:
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while True:
        out.append((z & 0x7F) | (0x80 if z >> 7 else 0))
        z >>= 7
        if not z:
            return bytes(out)


def register(url: str, subject: str, schema: dict) -> int:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    return SchemaRegistryClient({"url": url}).register_schema(subject, Schema(json.dumps(schema), "AVRO"))


def test_an_avro_value_claiming_2_40_zero_size_items_is_quarantined(registry):
    schema = {"type": "record", "name": "Evil", "fields": [
        {"name": "id", "type": "string"}, {"name": "pad", "type": {"type": "array", "items": "null"}}]}
    sid = register(registry.url, "hostile_zero_items-value", schema)
    bomb = b"\0" + struct.pack(">I", sid) + zigzag(1) + b"x" + zigzag(2 ** 40) + zigzag(0)
    assert len(bomb) == 14
    with pytest.raises(BadValue, match=rf"writer schema id {sid} is not read: pad is an array of items that take "
                                        r"no bytes \(null\)"):
        AvroDecoder({"url": registry.url}).decode(bomb)
    # a whole chunk of them (the chunk path reads flat columns from whole records): quarantined as well
    parser = make_parser(parse_columns("id STRING"), (), "avro", {"url": registry.url}, ())
    assert all("claim any number of them" in e for e in staged_errors(parser, [bomb, bomb]))


def test_items_that_take_bytes_are_read():
    def reason(t):
        return unbounded_items(parse_schema({"type": "record", "name": "R", "fields": [{"name": "f", "type": t}]}))

    empty = {"type": "record", "name": "Empty", "fields": []}
    assert reason({"type": "array", "items": empty}) == "f is an array of items that take no bytes (Empty)"
    assert reason({"type": "map", "values": {"type": "array", "items": {"type": "fixed", "name": "Z", "size": 0}}})
    assert reason({"type": "array", "items": {"type": "record", "name": "N", "fields": [{"name": "n", "type": "null"}]}})
    for fine in ({"type": "array", "items": "boolean"}, {"type": "array", "items": ["null", "int"]},
                 {"type": "map", "values": "null"}, {"type": "array", "items": {"type": "array", "items": "int"}},
                 {"type": "array", "items": {"type": "enum", "name": "E", "symbols": ["a"]}}):
        assert reason(fine) is None, fine


def test_an_avro_value_nested_deep_under_a_recursive_schema_is_quarantined(registry):
    """fastavro's compiled reader recursed in C and crashed the process (SIGSEGV) on a 5 KB value."""
    schema = {"type": "record", "name": "Node", "fields": [
        {"name": "id", "type": "string"}, {"name": "next", "type": ["null", "Node"]}]}
    sid = register(registry.url, "hostile_recursive-value", schema)

    def value(depth: int) -> bytes:
        return b"\0" + struct.pack(">I", sid) + (zigzag(1) + b"x" + zigzag(1)) * depth + zigzag(1) + b"x" + zigzag(0)

    decoder = AvroDecoder({"url": registry.url})
    assert decoder.decode(value(3))["next"]["next"]["next"] == {"id": "x", "next": None}
    with pytest.raises(BadValue, match=rf"value nested too deeply for writer schema id {sid} \(a recursive type\)"):
        decoder.decode(value(5000))
    parser = make_parser(parse_columns("id STRING"), (), "avro", {"url": registry.url}, ())
    shallow, deep = staged_errors(parser, [value(2), value(5000)])
    assert shallow is None and deep.startswith("value nested too deeply")

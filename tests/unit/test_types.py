"""Nested, binary and native values: parsing the DDL, strict conversion, the staged text forms."""
import datetime as dt
import uuid
from decimal import Decimal

import pytest

from ledgerbatch.formats.bad_value import BadValue
from ledgerbatch.formats.convert import converter
from ledgerbatch.formats.decoders.catalog import make_decoder
from ledgerbatch.errors import SpecError
from ledgerbatch.commit.evolve import plan_evolution
from ledgerbatch.formats.parse import headers_json, parse_value
from ledgerbatch.formats.schema import parse_schema

COLUMNS = parse_schema("id BIGINT, customer STRUCT<name: STRING, tier: INT>, tags ARRAY<STRING>, "
                       "scores MAP<STRING, DECIMAL(5,2)>, extra VARIANT, blob BINARY, "
                       "items ARRAY<STRUCT<sku: STRING, qty: INT>>, amounts ARRAY<DECIMAL(6,2)>, "
                       "ts TIMESTAMP, day DATE, ratio DOUBLE, ref STRING")


def convert(name, value):
    col = next(c for c in COLUMNS if c.name == name)
    return converter(col)(value)


def test_ddl_maps_to_postgresql_types():
    assert [c.pg_type for c in COLUMNS] == [
        "bigint", "jsonb", "text[]", "jsonb", "jsonb", "bytea", "jsonb", "numeric(6,2)[]",
        "timestamptz", "date", "double precision", "text"]
    assert COLUMNS[1].spark_ddl == "STRUCT<name: STRING, tier: INT>"
    assert parse_schema("m MAP<INT, ARRAY<BIGINT>>")[0].spark_ddl == "MAP<INT, ARRAY<BIGINT>>"
    assert parse_schema("s STRUCT<a INT, b: STRUCT<c: DATE>>")[0].children[1].children[0].type == "DATE"


@pytest.mark.parametrize("ddl, message", [
    ("m MAP<STRING>", "MAP needs a key and a value type"),
    ("s STRUCT<a INT, a STRING>", "appears twice"),
    ("a ARRAY<INTERVAL>", "is not supported"),
    ("s STRUCT<a-b: INT>", "not a valid identifier"),
])
def test_bad_nested_ddl(ddl, message):
    with pytest.raises(SpecError, match=message):
        parse_schema(ddl)


def test_struct_keeps_declared_fields_in_order_and_converts_them():
    assert convert("customer", {"tier": 2, "name": "Ann", "other": 1}) == '{"name":"Ann","tier":2}'
    assert convert("customer", {"name": "Ann"}) == '{"name":"Ann","tier":null}'
    with pytest.raises(BadValue, match="expected an integer") as bad:
        convert("customer", {"name": "Ann", "tier": "gold"})
    assert bad.value.path == (".tier",)
    with pytest.raises(BadValue, match=r"expected an object \(STRUCT\)"):
        convert("customer", ["Ann", 2])


def test_scalar_arrays_become_array_literals():
    assert convert("tags", ["a", 'b"c', "d\\e", None, "x,y"]) == '{"a","b\\"c","d\\\\e",NULL,"x,y"}'
    assert convert("amounts", [Decimal("1.005"), 2]) == '{"1.01","2.00"}'
    assert convert("tags", []) == "{}"
    with pytest.raises(BadValue, match="expected an array"):
        convert("tags", "a")
    with pytest.raises(BadValue, match="is not a decimal number") as bad:
        convert("amounts", [1, "x"])
    assert bad.value.path == ("[1]",)


def test_maps_variants_and_arrays_of_structs_are_exact_json():
    assert convert("scores", {"math": Decimal("9.5"), "art": None}) == '{"math":9.50,"art":null}'
    assert convert("extra", {"n": [1, Decimal("2.10")], "t": dt.date(2026, 1, 2), "b": b"\x00\x01"}) == \
        '{"n":[1,2.10],"t":"2026-01-02","b":"AAE="}'
    assert convert("items", [{"sku": "a", "qty": 1}]) == '[{"sku":"a","qty":1}]'
    with pytest.raises(BadValue) as bad:
        convert("items", [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 1.5}])
    assert bad.value.path == ("[1]", ".qty")
    with pytest.raises(BadValue, match="NUL character"):
        convert("extra", {"s": "a\x00b"})


def test_binary_from_bytes_or_base64():
    assert convert("blob", b"\x00\xff") == "\\x00ff"
    assert convert("blob", "AP8=") == "\\x00ff"
    with pytest.raises(BadValue, match="not base64"):
        convert("blob", "not base64!")


def test_native_values_of_registry_formats():
    utc = dt.timezone.utc
    assert convert("ts", dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=utc)) == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=utc)
    assert convert("ts", dt.datetime(2026, 1, 2, 3, 4, 5)).tzinfo == utc
    assert convert("day", dt.date(2026, 1, 2)) == dt.date(2026, 1, 2)
    assert convert("ratio", 0.25) == 0.25
    assert convert("ref", uuid.UUID(int=1)) == "00000000-0000-0000-0000-000000000001"
    assert convert("ref", dt.time(10, 30, 0, 250)) == "10:30:00.000250"  # Avro time-millis/micros
    with pytest.raises(BadValue, match="expected an ISO-8601 date"):
        convert("day", 20260102)


def test_nested_errors_name_the_path_and_whole_records_parse():
    decoder = make_decoder("json")
    converters = [converter(c) for c in COLUMNS]
    with pytest.raises(BadValue, match=r"^field customer\.tier: expected an integer"):
        parse_value(b'{"customer": {"tier": "x"}}', decoder, COLUMNS, converters)
    row = parse_value(b'{"id": 1, "tags": ["a"], "blob": "AP8=", "ratio": 1.5}', decoder, COLUMNS, converters)
    assert row[:3] == (1, None, '{"a"}') and row[5] == "\\x00ff" and row[10] == 1.5


def test_headers_as_json():
    assert headers_json(None) == "[]"
    assert headers_json([("trace", b"abc"), ("bin", b"\xff\x00"), ("none", None)]) == \
        '[{"key":"trace","value":"abc"},{"key":"bin","value_base64":"/wA="},{"key":"none","value":null}]'


def test_evolution_adds_widens_and_refuses_the_rest():
    cols = parse_schema("a INT, b BIGINT, c DECIMAL(12,2), d STRING, e DOUBLE")
    actual = {"a": "integer", "b": "integer", "c": "numeric(10,2)", "e": "real"}
    change = plan_evolution(actual, cols, additive=True)
    assert [c.name for c in change.add] == ["d"] and [c.name for c in change.widen] == ["b", "c", "e"]
    assert not change.problems
    assert plan_evolution(actual, cols, additive=False).problems[0] == "b is integer, the spec says bigint"
    narrowing = plan_evolution({"a": "bigint", "c": "numeric(12,4)"}, parse_schema("a INT, c DECIMAL(12,2)"), True)
    assert narrowing.problems == ("a is bigint, the spec says integer", "c is numeric(12,4), the spec says numeric(12,2)")


def test_protobuf_columns_of_a_message_that_contains_itself():
    from google.protobuf import descriptor_pb2

    from ledgerbatch.formats.decoders.protobuf import _field_type

    from ..serde import add_fields, message_class

    proto = descriptor_pb2.FileDescriptorProto(name="tree.proto", package="t", syntax="proto3")
    add_fields(proto.message_type.add(name="Node"), ("name", 1, "string"), ("children", 2, ".t.Node", "repeated"),
               ("sizes", 3, "uint64", "repeated"))
    node = message_class("t.Node", proto).DESCRIPTOR
    assert [_field_type(f) for f in node.fields] == ["STRING", "ARRAY<STRUCT<name: STRING, children: ARRAY<VARIANT>, "
                                                     "sizes: ARRAY<DECIMAL(20,0)>>>", "ARRAY<DECIMAL(20,0)>"]


def test_map_keys_past_decimal_range_are_bad_records():
    col = parse_schema("m MAP<DECIMAL(5,2), INT>")[0]
    assert converter(col)({"1.5": 2}) == '{"1.50":2}'
    with pytest.raises(BadValue, match="map key .* is not of type DECIMAL"):
        converter(col)({"1e-99999999999999999999": 1})

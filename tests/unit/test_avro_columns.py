"""The chunk path of `format: avro` (avro_columns.py) against the per-record path: wherever it answers, its
columns equal the per-record path's, and it never answers for a chunk that holds a bad record. Values
are in the Confluent wire format, their writer schemas in the dev registry (a real HTTP server)."""
import datetime as dt
import io
import json
import random
from decimal import Decimal

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from fastavro import parse_schema, schemaless_writer

from ledgerbatch.formats.avro_columns import AvroColumns, _framed
from ledgerbatch.formats.parse import make_parser
from ledgerbatch.formats.schema import parse_schema as parse_columns
from ledgerbatch.source.reader import Records

WIDE = {"type": "record", "name": "Wide", "namespace": "t", "fields": [
    {"name": "s", "type": ["null", "string"]},
    {"name": "i", "type": "int"},
    {"name": "b", "type": "long"},
    {"name": "h", "type": "int"},
    {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "w", "type": ["null", {"type": "fixed", "name": "W", "size": 16, "logicalType": "decimal",
                                    "precision": 38, "scale": 10}]},
    {"name": "f", "type": "double"},
    {"name": "r", "type": "float"},
    {"name": "ok", "type": "boolean"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "tm", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "extra", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
]}
COLUMNS = "s STRING, i INT, b BIGINT, h SMALLINT, d DECIMAL(12,2), w DECIMAL(38,10), f DOUBLE, r DOUBLE, " \
          "ok BOOLEAN, ts TIMESTAMP, tm TIMESTAMP, day DATE, absent BIGINT"
UTC = dt.timezone.utc


@pytest.fixture(scope="module")
def wire(registry):
    """encode(schema, record) -> the value in the wire format, its schema registered once."""
    client = SchemaRegistryClient({"url": registry.url})
    ids = {}

    def encode(schema: dict, record: dict) -> bytes:
        key = json.dumps(schema, sort_keys=True)
        if key not in ids:
            ids[key] = client.register_schema(f"s{len(ids)}-value", Schema(json.dumps(schema), "AVRO"))
        out = io.BytesIO()
        schemaless_writer(out, parse_schema(json.loads(key)), record)
        return b"\0" + ids[key].to_bytes(4, "big") + out.getvalue()

    encode.url = registry.url
    return encode


def compare(wire, values, ddl=COLUMNS, required=()) -> str | bool:
    """Each chunk way over one chunk against record by record: the whole chunk field by field
    (avro_vectors.py), then value by value with fastavro; returns the first way that answered ("vectors" or
    "fastavro"; each that answered agreed), or False."""
    cols = parse_columns(ddl)
    each = make_parser(cols, required, "avro", {"url": wire.url}, ())
    assert isinstance(each.chunked, AvroColumns)
    chunk = each.chunked
    each.chunked = None
    expected = each.parse("t", 0, Records(list(range(len(values))), [None] * len(values), values))
    chunk.arrays(values)  # makes the writer schema's plan
    framed = _framed(values)
    plan = chunk.plans.get(int.from_bytes(values[0][1:5], "big")) if framed else None
    vectors = plan.vectors if plan else None
    ways = {"vectors": chunk._from_vectors(plan, framed, pa) if vectors else None}
    if plan:
        plan.vectors = None
    ways["fastavro"] = chunk.arrays(values)
    if plan:
        plan.vectors = vectors
    for way, got in ways.items():
        if got is None:
            continue
        assert expected.column("_error").null_count == len(values), \
            f"{way}: took a chunk with a bad record: {expected.column('_error').drop_null().to_pylist()[:3]}"
        for col, array in zip(cols, got):
            assert array.type == expected.column(col.name).type, (way, col.name)
            # repr: NaN equals NaN, and -0.0 is not 0.0
            assert list(map(repr, array.to_pylist())) == list(map(repr, expected.column(col.name).to_pylist())), \
                (way, col.name)
    return next((way for way, got in ways.items() if got is not None), False)


def wide(rng: random.Random, **fields) -> dict:
    record = {
        "s": rng.choice([None, "", "plain", "ünïcödé ✓", "tab\there", "x" * 300]),
        "i": rng.choice([0, -1, 2 ** 31 - 1, -2 ** 31, rng.randrange(-1000, 1000)]),
        "b": rng.choice([0, 2 ** 63 - 1, -2 ** 63, rng.randrange(-10 ** 12, 10 ** 12)]),
        "h": rng.choice([0, 2 ** 15 - 1, -2 ** 15, rng.randrange(-300, 300)]),
        "d": Decimal(rng.randrange(-10 ** 12 + 1, 10 ** 12)).scaleb(-2),
        "w": rng.choice([None, Decimal(rng.randrange(-10 ** 38 + 1, 10 ** 38)).scaleb(-10), Decimal("0E-10")]),
        "f": rng.choice([0.0, -0.0, 1e308, -2.5e-308, float("nan"), float("inf"), rng.random()]),
        "r": rng.choice([0.0, 3.25, -1.5e38, rng.random()]),
        "ok": rng.random() < 0.5,
        "ts": rng.choice([dt.datetime(1, 1, 1, tzinfo=UTC), dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                          dt.datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC),
                          dt.datetime(2026, 11, 25, 3, 4, 5, rng.randrange(10 ** 6), tzinfo=UTC)]),
        "tm": rng.choice([None, dt.datetime(2026, 2, 28, 23, 0, 0, 123000, tzinfo=UTC),
                          dt.datetime(1900, 1, 1, tzinfo=UTC)]),
        "day": rng.choice([dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1970, 1, 1), dt.date(2024, 2, 29)]),
        "extra": None,
    }
    return {**record, **fields}


def test_the_bench_orders_take_the_chunk_path(wire):
    from bench.avro import ORDER

    from ledgerbatch.dev.demodata import order

    values = []
    for i in range(5_000):
        o = json.loads(order(i))
        values.append(wire(ORDER, {**o, "amount": Decimal(o["amount"]), "ts": dt.datetime.fromisoformat(o["ts"])}))
    assert compare(wire, values, "order_id STRING, customer STRING, amount DECIMAL(12,2), ts TIMESTAMP",
                   required=("order_id",)) == "vectors"


def test_random_chunks_of_good_records_take_it_and_agree(wire):
    rng = random.Random(25)
    for _ in range(20):
        assert compare(wire, [wire(WIDE, wide(rng)) for _ in range(200)])


def test_a_chunk_with_one_bad_or_doubtful_value_goes_record_by_record(wire):
    rng = random.Random(7)
    narrow = {**WIDE, "fields": [{**f, "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}}
                                 if f["name"] == "d" else f for f in WIDE["fields"]]}
    unmapped = {**WIDE, "fields": [f for f in WIDE["fields"] if f["name"] != "extra"] +
                [{"name": "extra", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
    fits = {"d": Decimal("12.34"), "extra": dt.datetime(2026, 1, 1, tzinfo=UTC)}
    odd = [  # (the writer schema of the chunk's other values, the odd value)
        (WIDE, wire(WIDE, wide(rng, s="nul\x00inside"))),  # text PostgreSQL cannot store
        (WIDE, wire(WIDE, wide(rng, h=2 ** 15))),  # past SMALLINT
        (WIDE, wire(WIDE, wide(rng))[:-3]),  # truncated
        (WIDE, wire(WIDE, wide(rng))[:1] + (99999).to_bytes(4, "big") + wire(WIDE, wide(rng))[5:]),  # unknown id
        (WIDE, b'{"s": "json"}'),  # not in the wire format
        (WIDE, None),  # a tombstone
        (WIDE, wire({**WIDE, "name": "Other"}, wide(rng))),  # a second writer schema
        # past the writer's precision (4): fastavro rounds 123.45 to 123.4 when it reads it
        (narrow, forged(wire, narrow, "d", "bytes", wide(rng, d=(12345).to_bytes(2, "big", signed=True)))),
        # a field the spec does not map keeps its logical type, and its failure: 10^15 ms is past year 9999
        (unmapped, forged(wire, unmapped, "extra", "long", wide(rng, extra=10 ** 15))),
    ]
    for schema, value in odd:
        good = [wire(schema, wide(rng, **fits)) for _ in range(20)]
        assert compare(wire, good)
        assert not compare(wire, good[:10] + [value] + good[10:]), value
    good = [wire(WIDE, wide(rng, s="key")) for _ in range(20)]
    assert compare(wire, good, required=("s",))
    assert not compare(wire, good + [wire(WIDE, wide(rng, s=None))], required=("s",))  # a key is null


def forged(wire, schema: dict, name: str, plain_type: str, record: dict) -> bytes:
    """A value no writer would write: `record` encoded with field `name` of `plain_type`, framed with the
    schema id of `schema` (whose field `name` has a logical type over that plain type)."""
    plain = {**schema, "fields": [f if f["name"] != name else {"name": name, "type": plain_type}
                                  for f in schema["fields"]]}
    schema_id = wire(schema, {**record, name: _any_of(schema, name)})[1:5]
    return b"\0" + schema_id + wire(plain, record)[5:]


def _any_of(schema: dict, name: str):
    logical = next(f["type"]["logicalType"] for f in schema["fields"] if f["name"] == name)
    return Decimal("1.00") if logical == "decimal" else dt.datetime(2026, 1, 1, tzinfo=UTC)


def test_the_parser_takes_it_for_flat_avro_records_only(wire):
    options = {"url": wire.url}
    assert isinstance(make_parser(parse_columns(COLUMNS), (), "avro", options, ()).chunked, AvroColumns)
    assert make_parser(parse_columns("s STRING, tags ARRAY<STRING>"), (), "avro", options, ()).chunked is None
    assert make_parser(parse_columns("s STRING"), ("s",), "avro", options, (), changes=True).chunked is None


@pytest.mark.parametrize("field_type, ddl, value", [
    (["null", "string", "long"], "u STRING", "a"),  # a union of two types
    ("string", "u BIGINT", "12"),  # text into a number: convert.py's business
    ({"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}, "u DECIMAL(12,2)", Decimal("1.505")),
    ({"type": "long", "logicalType": "local-timestamp-micros"}, "u TIMESTAMP", dt.datetime(2026, 1, 1)),
    ({"type": "string", "logicalType": "uuid"}, "u STRING", "0b5fc5a6-1b1a-4c9a-9d64-4b3e5c0e6a2f"),
])
def test_writer_schemas_it_does_not_map_go_record_by_record(wire, field_type, ddl, value):
    schema = {"type": "record", "name": "U", "fields": [{"name": "u", "type": field_type}]}
    assert not compare(wire, [wire(schema, {"u": value})] * 3, ddl)


# WIDE without what whole-chunk reading leaves to fastavro: a 16-byte decimal, an unmapped logical type.
FLAT = {**WIDE, "name": "Flat", "fields": [f for f in WIDE["fields"] if f["name"] not in ("w", "extra")] + [
    {"name": "unmapped", "type": ["string", "null"]}, {"name": "raw", "type": ["null", "bytes"]},
    {"name": "e18", "type": {"type": "bytes", "logicalType": "decimal", "precision": 18, "scale": 0}},
    {"name": "fx", "type": ["null", {"type": "fixed", "name": "F8", "size": 8, "logicalType": "decimal",
                                     "precision": 18, "scale": 4}]}]}
FLAT_COLUMNS = COLUMNS.replace(", w DECIMAL(38,10)", "") + ", e18 DECIMAL(18,0), fx DECIMAL(18,4)"


def flat(rng: random.Random, **fields) -> dict:
    record = {k: v for k, v in wide(rng).items() if k not in ("w", "extra")}
    record |= {"unmapped": rng.choice([None, "", "späť"]), "raw": rng.choice([None, b"", b"\x00\xff"]),
               "e18": Decimal(rng.choice([0, -1, 1, 127, -128, 255, -256, 10 ** 18 - 1, -10 ** 18 + 1,
                                          rng.randrange(-10 ** 18 + 1, 10 ** 18)])),
               "fx": rng.choice([None, Decimal("0.0000"), Decimal(rng.randrange(-10 ** 14 + 1, 10 ** 14)).scaleb(-4)])}
    return record | fields


def test_random_flat_chunks_are_read_field_by_field_and_agree(wire):
    rng = random.Random(2511)
    for _ in range(20):
        assert compare(wire, [wire(FLAT, flat(rng)) for _ in range(300)], FLAT_COLUMNS) == "vectors"
    # a decimal written in more than 8 bytes (1 as 00..01): fastavro reads it, whole-chunk reading leaves it
    long_one = plain_bytes(wire, FLAT, flat(rng), "e18", "bytes", b"\x00" * 8 + b"\x01")
    assert compare(wire, [wire(FLAT, flat(rng)) for _ in range(5)] + [long_one], FLAT_COLUMNS) == "fastavro"


def plain_bytes(wire, schema: dict, record: dict, name: str, plain_type, value) -> bytes:
    """`record` as `schema`'s writer would frame it, but field `name` written as `plain_type` with `value`."""
    plain = {**schema, "name": schema["name"] + "Plain", "fields": [
        f if f["name"] != name else {"name": name, "type": plain_type} for f in schema["fields"]]}
    return wire(schema, record)[:5] + wire(plain, {**record, name: value})[5:]


def test_a_chunk_with_a_value_whole_chunk_reading_cannot_vouch_for_is_not_read_whole(wire):
    rng = random.Random(11)
    good = [wire(FLAT, flat(rng)) for _ in range(30)]
    base = flat(rng)
    odd = {
        "text that is not UTF-8, in an unmapped field": plain_bytes(wire, FLAT, base, "unmapped", ["bytes", "null"],
                                                                     b"\xff\xfe"),
        "a boolean byte of 2": plain_bytes(wire, FLAT, base, "ok", "int", 1),
        "a union branch that does not exist": plain_bytes(wire, FLAT, base, "raw", "int", 2),
        "a varint of 11 bytes": _long_varint(wire(FLAT, {**base, "s": None, "i": 0})),
        "trailing bytes": wire(FLAT, base) + b"\x00",
        "truncated": wire(FLAT, base)[:-1],
        "NUL in mapped text": wire(FLAT, flat(rng, s="a\x00b")),
        "past SMALLINT": wire(FLAT, flat(rng, h=-2 ** 15 - 1)),
        "past the last day": plain_bytes(wire, FLAT, base, "day", "int", 2_932_897 + 1),
        "a millisecond timestamp past year 9999": plain_bytes(wire, FLAT, base, "tm", ["null", "long"], 253_402_300_800_000),
    }
    for what, value in odd.items():
        assert compare(wire, good[:15] + [value] + good[15:], FLAT_COLUMNS) != "vectors", what
    assert compare(wire, good, FLAT_COLUMNS, required=("s",)) in ("vectors", False)
    with_null = [wire(FLAT, flat(rng, s="k")) for _ in range(5)] + [wire(FLAT, flat(rng, s=None))]
    assert not compare(wire, with_null, FLAT_COLUMNS, required=("s",))


def _long_varint(value: bytes) -> bytes:
    """`value` (FLAT, s null, i 0) with i's one-byte varint written in 11 bytes."""
    assert value[5:7] == b"\x00\x00"  # s: the null branch; i: 0
    return value[:6] + b"\x80" * 10 + b"\x00" + value[7:]


def test_a_writer_schema_that_is_not_a_record_goes_record_by_record(wire):
    assert not compare(wire, [wire("string", "plain")] * 3, "u STRING")

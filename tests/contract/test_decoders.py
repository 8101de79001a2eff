"""The decoder contract: one suite every record format of decoders/ passes (Dagster's storage tests
are the model). Values come from confluent-kafka's real serializers against the dev registry; a
new format adds a subclass that says how to encode an order."""
from __future__ import annotations

import pytest

from ledgerbatch.formats.bad_value import BadValue
from ledgerbatch.formats.convert import converter
from ledgerbatch.formats.decoders.catalog import DECODERS, REGISTRY_FORMATS, make_decoder
from ledgerbatch.formats.decoders.confluent_wire import RegistryUnavailable
from ledgerbatch.formats.parse import parse_value
from ledgerbatch.formats.schema import parse_schema

from ..serde import (ORDER, ORDER_COLUMNS, ORDER_ROW, avro_encoder, debezium_avro_encoder, json_schema_encoder,
                     protobuf_encoder)

COLUMNS = parse_schema(ORDER_COLUMNS)
CONVERTERS = [converter(c) for c in COLUMNS]


class DecoderContract:
    __test__ = False
    FORMAT: str

    @pytest.fixture
    def codec(self):
        """(decoder, encode): encode(order dict) -> the bytes of a Kafka value in this format."""
        raise NotImplementedError

    def parse(self, decoder, raw: bytes) -> tuple:
        return parse_value(raw, decoder, COLUMNS, CONVERTERS)

    def test_fields_by_name(self, codec):
        decoder, encode = codec
        assert self.parse(decoder, encode(ORDER)) == ORDER_ROW

    def test_absent_fields_are_null(self, codec):
        decoder, encode = codec
        assert self.parse(decoder, encode({**ORDER, "customer": None}))[4] is None

    @pytest.mark.parametrize("raw, reason", [(None, "tombstone"), (b"", "empty value|wire format")])
    def test_tombstone_and_empty_values_are_bad(self, codec, raw, reason):
        decoder, _ = codec
        with pytest.raises(BadValue, match=reason):
            decoder.decode(raw)

    def test_garbage_and_truncated_values_are_bad(self, codec):
        decoder, encode = codec
        for raw in (b"\x07garbage", b"{not json", encode(ORDER)[:-4], encode(ORDER)[:6]):
            with pytest.raises(BadValue) as bad:
                decoder.decode(raw)
            assert not str(bad.value).rstrip().endswith(":"), f"a reason that says nothing: {bad.value}"


class RegistryDecoderContract(DecoderContract):
    """What every registry format adds: unknown schema ids are bad records, an outage is not."""
    __test__ = False

    @pytest.fixture
    def codec(self, registry):
        topic = f"contract_{self.FORMAT}"
        return make_decoder(self.FORMAT, {"url": registry.url}), self.encoder(registry.url, topic)

    def test_not_in_wire_format_is_bad(self, codec):
        decoder, _ = codec
        with pytest.raises(BadValue, match="not in the Confluent wire format.*starts with 0x7b"):
            decoder.decode(b'{"id": 1}')

    def test_unknown_schema_id_is_bad(self, codec):
        decoder, encode = codec
        raw = encode(ORDER)
        with pytest.raises(BadValue, match="schema id 99999 is unknown to the registry"):
            decoder.decode(raw[:1] + (99999).to_bytes(4, "big") + raw[5:])

    def test_registry_errors_and_outages_fail_instead_of_quarantining(self, codec, registry):
        _, encode = codec
        raw = encode(ORDER)
        registry.fail(503)
        try:
            with pytest.raises(RegistryUnavailable, match="503"):
                make_decoder(self.FORMAT, {"url": registry.url, "max.retries": "0"}).decode(raw)
        finally:
            registry.heal()
        registry.stop()
        try:
            with pytest.raises(RegistryUnavailable, match="unreachable"):
                make_decoder(self.FORMAT, {"url": registry.url, "max.retries": "0"}).decode(raw)
        finally:
            registry.start()

    def test_one_registry_request_per_schema_id(self, codec, registry):
        decoder, encode = codec
        values = [encode({**ORDER, "id": i}) for i in range(50)]
        before = sum(registry.requests.values())
        assert [self.parse(decoder, v)[0] for v in values] == list(range(50))
        assert sum(registry.requests.values()) - before <= 1 + self.EXTRA_LOOKUPS


def test_every_format_runs_the_contract():
    formats = {cls.FORMAT for cls in DecoderContract.__subclasses__() + RegistryDecoderContract.__subclasses__()
               if hasattr(cls, "FORMAT")}
    assert formats == set(DECODERS) and set(REGISTRY_FORMATS) <= formats


class TestJson(DecoderContract):
    __test__ = True
    FORMAT = "json"

    @pytest.fixture
    def codec(self):
        import json

        return make_decoder("json"), lambda order: json.dumps(order, default=str).encode()


class TestAvro(RegistryDecoderContract):
    __test__ = True
    FORMAT = "avro"
    EXTRA_LOOKUPS = 0
    encoder = staticmethod(avro_encoder)


class TestProtobuf(RegistryDecoderContract):
    __test__ = True
    FORMAT = "protobuf"
    EXTRA_LOOKUPS = 0
    encoder = staticmethod(protobuf_encoder)


class TestJsonSchema(RegistryDecoderContract):
    __test__ = True
    FORMAT = "json_schema"
    EXTRA_LOOKUPS = 0
    encoder = staticmethod(json_schema_encoder)

    def test_nan_is_bad_as_in_format_json(self, codec):
        decoder, encode = codec
        raw = encode(ORDER)
        with pytest.raises(BadValue, match="NaN is not a JSON number"):
            decoder.decode(raw[:5] + raw[5:].replace(b"12.5", b"NaN"))


class TestDebezium(DecoderContract):
    """Debezium envelopes: an order as the row image `after` of a create event (JsonConverter without the
    schema block, decimals as strings); plus every real captured sample (tests/cdc/samples/)."""
    __test__ = True
    FORMAT = "debezium"

    @pytest.fixture
    def codec(self):
        import json

        def encode(order):
            envelope = {"before": None, "after": order, "op": "c", "ts_ms": 1,
                        "source": {"connector": "postgresql", "table": "orders"}}
            return json.dumps(envelope, default=str).encode()
        return make_decoder("debezium"), encode

    @pytest.mark.parametrize("sample", ["schemas-precise", "schemas-string", "noschemas-string", "noschemas-precise"])
    def test_real_samples(self, sample):
        """Without the schema block, epoch dates and timestamps (and `precise` decimals) have no meaning to
        decode them by: they are bad records that say so; everything else decodes the same."""
        from tests.cdc.test_samples import load

        opaque = set() if sample.startswith("schemas") else {"updated", "opened"} | (
            {"balance"} if sample.endswith("precise") else set())
        check_samples(make_decoder("debezium"), load(f"{sample}.jsonl"), opaque)

    def test_delete_without_before_takes_the_kafka_key(self, codec):
        from ledgerbatch.formats.decoders.base import DELETE

        decoder, _ = codec
        key = b'{"schema": {"type": "struct", "fields": [{"type": "int32", "field": "id"}]}, "payload": {"id": 9}}'
        no_positions = {"_source_lsn": None, "_source_ts_ms": None, "_ts_ms": None}  # (the envelope has no source)
        assert decoder.decode_change(key, b'{"before": null, "after": null, "op": "d"}') == (DELETE, {"id": 9,
                                                                                                   **no_positions})
        with pytest.raises(BadValue, match="without a Kafka key"):
            decoder.decode_change(None, b'{"before": null, "after": null, "op": "d"}')

    def test_other_ops_and_other_json_are_bad(self, codec):
        decoder, _ = codec
        with pytest.raises(BadValue, match="op 't' is not a row change"):
            decoder.decode_change(None, b'{"op": "t", "before": null, "after": null}')
        with pytest.raises(BadValue, match="no op field"):
            decoder.decode_change(None, b'{"id": 1}')
        with pytest.raises(BadValue, match="after is null"):
            decoder.decode_change(None, b'{"op": "c", "after": null}')

    def test_time_encodings_named_by_the_schema_block(self):
        import base64
        import json

        fields = [{"field": "ts_ms", "type": "int64", "name": "io.debezium.time.Timestamp"},
                  {"field": "ts_ns", "type": "int64", "name": "io.debezium.time.NanoTimestamp"},
                  {"field": "t_us", "type": "int64", "name": "io.debezium.time.MicroTime"},
                  {"field": "d", "type": "int32", "name": "io.debezium.time.Date"},
                  {"field": "amount", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                   "parameters": {"scale": "3"}},
                  {"field": "z", "type": "string", "name": "io.debezium.time.ZonedTimestamp"}]
        after = {**SEMANTIC_AFTER, "amount": base64.b64encode((-12345).to_bytes(2, "big", signed=True)).decode()}
        value = {"schema": {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": fields}]},
                 "payload": {"before": None, "after": after, "op": "u"}}
        _, got = make_decoder("debezium").decode_change(None, json.dumps(value).encode())
        check_semantic(got)


# A row image of the semantic types Debezium writes (the `precise` decimal `amount` as each converter has it),
# and what each field decodes to.
SEMANTIC_AFTER = {"ts_ms": -1, "ts_ns": 1_500_000_001, "t_us": 3_723_000_004, "d": 1, "z": "2026-01-01T00:00:00Z"}


def check_semantic(got: dict) -> None:
    import datetime as dt
    from decimal import Decimal

    assert got["ts_ms"] == dt.datetime(1969, 12, 31, 23, 59, 59, 999000)
    assert got["ts_ns"] == dt.datetime(1970, 1, 1, 0, 0, 1, 500000)
    assert got["t_us"] == dt.time(1, 2, 3, 4)
    assert got["d"] == dt.date(1970, 1, 2)
    assert got["amount"] == Decimal("-12.345")
    assert got["z"] == "2026-01-01T00:00:00Z"


SAMPLE_COLUMNS = parse_schema("id INT, owner STRING, balance DECIMAL(12,2), active BOOLEAN, updated TIMESTAMP, "
                              "opened DATE, seen TIMESTAMP")


def check_samples(decoder, lines: list[dict], opaque: set[str]) -> None:
    """Each captured event (tests/cdc/samples/) decodes to its change: c/r/u the image `after` (the columns
    in `opaque` refused by their converter), d the key, a tombstone skipped."""
    import datetime as dt
    from decimal import Decimal

    from ledgerbatch.formats.decoders.base import DELETE, SKIP, UPSERT

    converters = {c.name: converter(c) for c in SAMPLE_COLUMNS}
    ops = []
    for line in lines:
        change, fields = decoder.decode_change(line["key"], line["value"])
        ops.append(change)
        if line["op"] is None:
            assert change == SKIP
            continue
        if line["op"] == "d":
            assert change == DELETE and fields["id"] == line["expect_key"]["id"]
            continue
        assert change == UPSERT
        want = line["expect_after"]
        for name, convert in converters.items():
            if name in opaque and fields[name] is not None:
                with pytest.raises(BadValue):
                    convert(fields[name])
                continue
            got = None if fields[name] is None else convert(fields[name])
            expected = want[name]
            if expected is not None and name == "balance":
                expected = Decimal(expected)
            elif expected is not None and name in ("updated", "seen"):
                expected = dt.datetime.fromisoformat(expected)
                expected = expected.replace(tzinfo=dt.timezone.utc) if expected.tzinfo is None else expected
            elif expected is not None and name == "opened":
                expected = dt.date.fromisoformat(expected)
            assert got == expected, (line["offset"], name, fields[name])
        assert fields.get("note") == want.get("note")  # the column the Avro capture's source table gained
    assert {UPSERT, DELETE, SKIP} <= set(ops)


class TestDebeziumAvro(RegistryDecoderContract):
    """Debezium envelopes through Confluent's AvroConverter (`format: debezium` with `converter: avro`): an order as
    the row image `after`; plus the real captured AvroConverter events (tests/cdc/samples/avro-precise.jsonl)."""
    __test__ = True
    FORMAT = "debezium_avro"
    EXTRA_LOOKUPS = 0
    encoder = staticmethod(debezium_avro_encoder)

    def test_real_samples(self, registry):
        from tests.cdc.avro_samples import load_avro

        check_samples(make_decoder(self.FORMAT, {"url": registry.url}), load_avro(registry.url), set())

    def test_delete_without_before_takes_the_avro_key(self, registry):
        from ledgerbatch.formats.decoders.base import DELETE
        from tests.cdc.avro_samples import edited, load_avro

        decoder = make_decoder(self.FORMAT, {"url": registry.url})
        delete = next(x for x in load_avro(registry.url) if x["op"] == "d")
        value = edited(registry.url, delete["value"], before=None)  # as under REPLICA IDENTITY NOTHING
        change, fields = decoder.decode_change(delete["key"], value)
        positions = {k: fields.pop(k) for k in ("_source_lsn", "_source_ts_ms", "_ts_ms")}  # target.version's
        assert (change, fields) == (DELETE, delete["expect_key"]) and isinstance(positions["_source_lsn"], int)
        with pytest.raises(BadValue, match="without a Kafka key"):
            decoder.decode_change(None, value)
        with pytest.raises(BadValue, match="^key: value is not in the Confluent wire format"):
            decoder.decode_change(b'{"id": 1}', value)

    def test_other_ops_are_bad(self, registry):
        from tests.cdc.avro_samples import edited, load_avro

        decoder = make_decoder(self.FORMAT, {"url": registry.url})
        created = next(x for x in load_avro(registry.url) if x["op"] == "c")
        with pytest.raises(BadValue, match="op 't' is not a row change"):
            decoder.decode_change(None, edited(registry.url, created["value"], op="t"))
        with pytest.raises(BadValue, match="after is null"):
            decoder.decode_change(None, edited(registry.url, created["value"], after=None))
        with pytest.raises(BadValue, match="value is an Avro str, not a record"):
            decoder.decode(avro_encoder(registry.url, "contract_debezium_avro_str", {"type": "string"})("c"))

    def test_semantic_types_as_avroconverter_writes_them(self, registry):
        """Debezium's own types are plain int/long with `connect.name`; Connect's Decimal, Date and Timestamp
        carry an Avro logicalType too (fastavro decodes those, and they are not decoded twice);
        VariableScaleDecimal is a record of scale and unscaled bytes."""
        import datetime as dt
        import json
        from decimal import Decimal

        from confluent_kafka.schema_registry.avro import AvroSerializer

        from ..serde import client, context, debezium_avro_envelope

        def semantic(avro_type: str, name: str, **more):
            return ["null", {"type": avro_type, "connect.version": 1, "connect.name": name, **more}]
        value = {"type": "record", "name": "Value", "namespace": "shop.public.kinds", "fields": [
            {"name": "ts_ms", "type": semantic("long", "io.debezium.time.Timestamp"), "default": None},
            {"name": "ts_ns", "type": semantic("long", "io.debezium.time.NanoTimestamp"), "default": None},
            {"name": "t_us", "type": semantic("long", "io.debezium.time.MicroTime"), "default": None},
            {"name": "d", "type": semantic("int", "io.debezium.time.Date"), "default": None},
            {"name": "amount", "type": semantic("bytes", "org.apache.kafka.connect.data.Decimal", scale=3, precision=10,
                                                **{"connect.parameters": {"scale": "3", "connect.decimal.precision": "10"},
                                                   "logicalType": "decimal"}), "default": None},
            {"name": "z", "type": semantic("string", "io.debezium.time.ZonedTimestamp"), "default": None},
            {"name": "c_ts", "type": semantic("long", "org.apache.kafka.connect.data.Timestamp",
                                              logicalType="timestamp-millis"), "default": None},
            {"name": "c_date", "type": semantic("int", "org.apache.kafka.connect.data.Date", logicalType="date"),
             "default": None},
            {"name": "vsd", "type": ["null", {"type": "record", "name": "VariableScaleDecimal",
                                              "namespace": "io.debezium.data", "fields": [
                                                  {"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
                                              "connect.doc": "Variable scaled decimal", "connect.version": 1,
                                              "connect.name": "io.debezium.data.VariableScaleDecimal"}], "default": None},
        ]}
        serialize = AvroSerializer(client(registry.url), json.dumps(debezium_avro_envelope(value)))
        after = {**SEMANTIC_AFTER, "amount": Decimal("-12.345"), "c_ts": dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=dt.timezone.utc),
                 "c_date": dt.date(1969, 12, 31), "vsd": {"scale": 4, "value": (-1).to_bytes(1, "big", signed=True)}}
        raw = serialize({"before": None, "after": after, "op": "r"}, context("contract_debezium_avro_kinds"))
        _, got = make_decoder(self.FORMAT, {"url": registry.url}).decode_change(None, raw)
        check_semantic(got)
        assert got["c_ts"] == dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=dt.timezone.utc)
        assert got["c_date"] == dt.date(1969, 12, 31)
        assert got["vsd"] == Decimal("-0.0001")


def test_tombstones_delete_by_key_with_target_deletes():
    from ledgerbatch.formats.decoders.base import DELETE, UPSERT
    from ledgerbatch.formats.decoders.catalog import make_change_decoder

    decoder = make_change_decoder("json")
    assert decoder.decode_change(b'{"id": 3}', None) == (DELETE, {"id": 3})
    assert decoder.decode_change(b'{"id": 3}', b'{"id": 3, "name": "x"}') == (UPSERT, {"id": 3, "name": "x"})
    with pytest.raises(BadValue, match="without a key"):
        decoder.decode_change(None, None)
    with pytest.raises(BadValue, match="key is not a JSON object"):
        decoder.decode_change(b"\xff", None)

"""The decoder contract: one suite every record format of decoders/ passes (Dagster's storage tests
are the model). Values come from confluent-kafka's real serializers against the dev registry; a
new format adds a subclass that says how to encode an order."""
from __future__ import annotations

import pytest

from ledgerbatch.convert import BadValue, converter
from ledgerbatch.decoders import DECODERS, REGISTRY_FORMATS, make_decoder
from ledgerbatch.decoders.registry import RegistryUnavailable
from ledgerbatch.parse import parse_value
from ledgerbatch.schema import parse_schema

from ..serde import (ORDER, ORDER_COLUMNS, ORDER_ROW, avro_encoder, json_schema_encoder, protobuf_encoder)

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

    SAMPLE_COLUMNS = parse_schema("id INT, owner STRING, balance DECIMAL(12,2), active BOOLEAN, updated TIMESTAMP, "
                                  "opened DATE, seen TIMESTAMP")

    @pytest.mark.parametrize("sample", ["schemas-precise", "schemas-string", "noschemas-string", "noschemas-precise"])
    def test_real_samples(self, sample):
        """Each captured event decodes to its change: c/r/u the image `after`, d the key, a tombstone skipped.
        Without the schema block, epoch dates and timestamps (and `precise` decimals) have no meaning to
        decode them by: they are bad records that say so; everything else decodes the same."""
        import datetime as dt
        from decimal import Decimal

        from ledgerbatch.decoders import DELETE, SKIP, UPSERT
        from tests.cdc.test_samples import load

        decoder = make_decoder("debezium")
        converters = {c.name: converter(c) for c in self.SAMPLE_COLUMNS}
        opaque = set() if sample.startswith("schemas") else {"updated", "opened"} | (
            {"balance"} if sample.endswith("precise") else set())
        ops = []
        for line in load(f"{sample}.jsonl"):
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
        assert {UPSERT, DELETE, SKIP} <= set(ops)

    def test_delete_without_before_takes_the_kafka_key(self, codec):
        from ledgerbatch.decoders import DELETE

        decoder, _ = codec
        key = b'{"schema": {"type": "struct", "fields": [{"type": "int32", "field": "id"}]}, "payload": {"id": 9}}'
        assert decoder.decode_change(key, b'{"before": null, "after": null, "op": "d"}') == (DELETE, {"id": 9})
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
        import datetime as dt
        import json
        from decimal import Decimal

        fields = [{"field": "ts_ms", "type": "int64", "name": "io.debezium.time.Timestamp"},
                  {"field": "ts_ns", "type": "int64", "name": "io.debezium.time.NanoTimestamp"},
                  {"field": "t_us", "type": "int64", "name": "io.debezium.time.MicroTime"},
                  {"field": "d", "type": "int32", "name": "io.debezium.time.Date"},
                  {"field": "amount", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                   "parameters": {"scale": "3"}},
                  {"field": "z", "type": "string", "name": "io.debezium.time.ZonedTimestamp"}]
        after = {"ts_ms": -1, "ts_ns": 1_500_000_001, "t_us": 3_723_000_004, "d": 1,
                 "amount": base64.b64encode((-12345).to_bytes(2, "big", signed=True)).decode(), "z": "2026-01-01T00:00:00Z"}
        value = {"schema": {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": fields}]},
                 "payload": {"before": None, "after": after, "op": "u"}}
        _, got = make_decoder("debezium").decode_change(None, json.dumps(value).encode())
        assert got["ts_ms"] == dt.datetime(1969, 12, 31, 23, 59, 59, 999000)
        assert got["ts_ns"] == dt.datetime(1970, 1, 1, 0, 0, 1, 500000)
        assert got["t_us"] == dt.time(1, 2, 3, 4)
        assert got["d"] == dt.date(1970, 1, 2)
        assert got["amount"] == Decimal("-12.345")
        assert got["z"] == "2026-01-01T00:00:00Z"


def test_tombstones_delete_by_key_with_target_deletes():
    from ledgerbatch.decoders import DELETE, UPSERT, make_change_decoder

    decoder = make_change_decoder("json")
    assert decoder.decode_change(b'{"id": 3}', None) == (DELETE, {"id": 3})
    assert decoder.decode_change(b'{"id": 3}', b'{"id": 3, "name": "x"}') == (UPSERT, {"id": 3, "name": "x"})
    with pytest.raises(BadValue, match="without a key"):
        decoder.decode_change(None, None)
    with pytest.raises(BadValue, match="key is not a JSON object"):
        decoder.decode_change(b"\xff", None)

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

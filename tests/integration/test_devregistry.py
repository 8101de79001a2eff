"""The dev schema registry, driven only through confluent-kafka's own client, serializers and deserializers."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from confluent_kafka.schema_registry import (Metadata, MetadataProperties, Schema, SchemaReference,
                                             SchemaRegistryClient, SchemaRegistryError)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2

from ledgerbatch.dev.registry import DevRegistry

from ..serde import add_fields, message_class
from .helpers import REPO

TOPIC = "payments"
SUBJECT = f"{TOPIC}-value"
CTX = SerializationContext(TOPIC, MessageField.VALUE)
ORDER_V1 = json.dumps({"type": "record", "name": "Order", "namespace": "ledgerbatch.test", "fields": [
    {"name": "id", "type": "long"}, {"name": "customer", "type": "string"}]})
ORDER_V2 = json.dumps({"type": "record", "name": "Order", "namespace": "ledgerbatch.test", "fields": [
    {"name": "id", "type": "long"}, {"name": "customer", "type": "string"},
    {"name": "note", "type": ["null", "string"], "default": None}]})


@pytest.fixture
def registry():
    with DevRegistry() as reg:
        yield reg


def client(reg: DevRegistry, **conf) -> SchemaRegistryClient:
    # No retries unless a test asks: a failure must surface at once, not after the client's backoff.
    return SchemaRegistryClient({"url": reg.url, "max.retries": 0, **conf})


def schema_id(payload: bytes) -> int:
    assert payload[0] == 0, "Confluent wire format: magic byte 0"
    return int.from_bytes(payload[1:5], "big")


def test_avro_evolution_round_trip_and_versions(registry):
    sr = client(registry)
    v1 = AvroSerializer(sr, ORDER_V1)(dict(id=1, customer="ann"), CTX)
    v2 = AvroSerializer(sr, ORDER_V2)(dict(id=2, customer="bob", note="rush"), CTX)
    id1, id2 = schema_id(v1), schema_id(v2)
    assert id1 != id2 and sr.get_versions(SUBJECT) == [1, 2]

    # A fresh client deserializes each record with its writer schema, looked up by id.
    reader = AvroDeserializer(client(registry))
    assert reader(v1, CTX) == {"id": 1, "customer": "ann"}
    assert reader(v2, CTX) == {"id": 2, "customer": "bob", "note": "rush"}
    assert AvroDeserializer(client(registry), ORDER_V2)(v1, CTX) == {"id": 1, "customer": "ann", "note": None}

    latest = client(registry).get_latest_version(SUBJECT)
    assert (latest.version, latest.schema_id, latest.subject) == (2, id2, SUBJECT)
    assert json.loads(latest.schema.schema_str) == json.loads(ORDER_V2) and latest.schema.schema_type == "AVRO"
    assert client(registry).get_version(SUBJECT, 1).schema_id == id1
    # use.latest.version without auto-registering: writes with the subject's latest id.
    pinned = AvroSerializer(client(registry), ORDER_V2, conf={"auto.register.schemas": False, "use.latest.version": True})
    assert schema_id(pinned(dict(id=3, customer="cy", note=None), CTX)) == id2

    # Same schema again: same id and no new version; under another subject: the same id too.
    assert sr.register_schema(SUBJECT, Schema(ORDER_V1)) == id1 and sr.get_versions(SUBJECT) == [1, 2]
    other = client(registry)
    assert other.register_schema("archive-value", Schema(json.dumps(json.loads(ORDER_V1), indent=2))) == id1
    assert other.lookup_schema("archive-value", Schema(ORDER_V1)).version == 1
    assert sorted((v.subject, v.version) for v in other.get_schema_versions(id1)) == [("archive-value", 1), (SUBJECT, 1)]
    assert other.get_subjects() == ["archive-value", SUBJECT]


def test_requests_counter_one_lookup_per_schema_id(registry):
    writer = AvroSerializer(client(registry), ORDER_V1)
    payloads = [writer(dict(id=i, customer="c"), CTX) for i in range(20)]
    reader = AvroDeserializer(client(registry))
    assert [reader(p, CTX)["id"] for p in payloads] == list(range(20))
    assert (registry.requests["register"], registry.requests["schemas/ids"]) == (1, 1)


def test_concurrent_registrations_share_ids(registry):
    schemas = [ORDER_V1, ORDER_V2] * 8
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda i: client(registry).register_schema(f"s{i % 3}", Schema(schemas[i])), range(16)))
    assert len({ids[i] for i in range(0, 16, 2)}) == 1 and len({ids[i] for i in range(1, 16, 2)}) == 1
    assert sorted(set(ids)) == [1, 2] and all(client(registry).get_versions(f"s{k}") == [1, 2] for k in range(3))


def order_message_class():
    """Order (importing Money from another file) built at runtime."""
    money = descriptor_pb2.FileDescriptorProto(name="ledgerbatch/money.proto", package="ledgerbatch", syntax="proto3")
    add_fields(money.message_type.add(name="Money"), ("currency", 1, "string"), ("units", 2, "int64"))
    order = descriptor_pb2.FileDescriptorProto(name="ledgerbatch/order.proto", package="ledgerbatch",
                                               syntax="proto3", dependency=[money.name])
    add_fields(order.message_type.add(name="Order"), ("id", 1, "int64"), ("amount", 2, ".ledgerbatch.Money"),
               ("tags", 3, "string", "repeated"))
    return message_class("ledgerbatch.Order", money, order)


def test_protobuf_round_trip_with_reference(registry):
    Order = order_message_class()
    msg = Order(id=7, tags=["a", "b"])
    msg.amount.currency, msg.amount.units = "EUR", 1250
    payload = ProtobufSerializer(Order, client(registry))(msg, CTX)

    sr = client(registry)
    assert sr.get_subjects() == ["ledgerbatch/money.proto", SUBJECT]  # the import went in as a reference
    value = sr.get_latest_version(SUBJECT)
    assert value.schema_id == schema_id(payload) and value.schema.schema_type == "PROTOBUF"
    assert [(r.name, r.subject, r.version) for r in value.schema.references] == [
        ("ledgerbatch/money.proto", "ledgerbatch/money.proto", 1)]
    assert ProtobufDeserializer(Order, schema_registry_client=client(registry))(payload, CTX) == msg
    assert registry.requests["subjects/version"] >= 1  # the deserializer fetched the reference by version


def test_json_schema_round_trip(registry):
    schema = json.dumps({"title": "Payment", "type": "object", "required": ["id"], "properties": {
        "id": {"type": "integer"}, "amount": {"type": "string"}}})
    payload = JSONSerializer(schema, client(registry))({"id": 5, "amount": "9.99"}, CTX)
    assert client(registry).get_schema(schema_id(payload)).schema_type == "JSON"
    assert JSONDeserializer(None, schema_registry_client=client(registry))(payload, CTX) == {"id": 5, "amount": "9.99"}


def test_not_found_and_invalid_errors(registry):
    sr = client(registry)
    unknown = b"\x00" + (999).to_bytes(4, "big") + b"\x02"
    with pytest.raises(SchemaRegistryError) as err:
        AvroDeserializer(sr)(unknown, CTX)
    assert (err.value.http_status_code, err.value.error_code) == (404, 40403)

    sr.register_schema(SUBJECT, Schema(ORDER_V1))
    cases = [(lambda: sr.get_version("nope-value", 1), 404, 40401),
             (lambda: sr.get_version(SUBJECT, 9), 404, 40402),
             (lambda: sr.lookup_schema(SUBJECT, Schema(ORDER_V2)), 404, 40403),
             (lambda: sr.register_schema(SUBJECT, Schema('{"type": "recrod", "name": "X"}')), 422, 42201),
             (lambda: sr.register_schema(SUBJECT, Schema('{"type": 12}', "JSON")), 422, 42201),
             (lambda: sr.register_schema(SUBJECT, Schema("{}", "XML")), 422, 42201),
             (lambda: sr.get_compatibility(SUBJECT), 404, 40408)]
    for call, status, code in cases:
        with pytest.raises(SchemaRegistryError) as err:
            call()
        assert (err.value.http_status_code, err.value.error_code) == (status, code)


def test_avro_reference_must_exist_and_resolves(registry):
    sr = client(registry)
    money = json.dumps({"type": "record", "name": "Money", "namespace": "ledgerbatch.test",
                        "fields": [{"name": "units", "type": "long"}]})
    order = json.dumps({"type": "record", "name": "Order", "namespace": "ledgerbatch.test",
                        "fields": [{"name": "amount", "type": "ledgerbatch.test.Money"}]})
    ref = [SchemaReference("ledgerbatch.test.Money", "money", 1)]
    with pytest.raises(SchemaRegistryError) as err:
        sr.register_schema(SUBJECT, Schema(order, "AVRO", ref))
    assert (err.value.http_status_code, err.value.error_code) == (422, 42201)
    sr.register_schema("money", Schema(money))
    payload = AvroSerializer(sr, Schema(order, "AVRO", ref))({"amount": {"units": 3}}, CTX)
    assert AvroDeserializer(client(registry))(payload, CTX) == {"amount": {"units": 3}}


def test_config_and_latest_with_metadata(registry):
    sr = client(registry)
    assert sr.get_compatibility() == "BACKWARD"
    sr.set_compatibility(SUBJECT, "full")
    assert sr.get_compatibility(SUBJECT) == "FULL" and sr.get_compatibility() == "BACKWARD"
    tagged = Schema(ORDER_V2, metadata=Metadata(None, MetadataProperties({"owner": "ledger"}), None))
    sr.register_schema(SUBJECT, tagged)
    sr.register_schema(SUBJECT, Schema(ORDER_V1))
    assert sr.get_latest_with_metadata(SUBJECT, {"owner": "ledger"}).version == 1
    assert sr.get_latest_version(SUBJECT).version == 2


def test_injected_failures(registry):
    registry.fail(503)
    with pytest.raises(SchemaRegistryError) as err:
        client(registry).get_subjects()
    assert err.value.http_status_code == 503
    registry.heal()
    assert client(registry).get_subjects() == []

    registry.fail(503, times=2)  # the client's own retries get through the third time
    before = registry.requests["subjects"]
    assert client(registry, **{"max.retries": 3, "retries.wait.ms": 10}).get_subjects() == []
    assert registry.requests["subjects"] - before == 3

    registry.fail(500, seconds=0.3)
    with pytest.raises(SchemaRegistryError) as err:
        client(registry).get_subjects()
    assert err.value.http_status_code == 500
    time.sleep(0.35)
    assert client(registry).get_subjects() == []


def test_stop_refuses_connections_and_start_keeps_state(registry):
    sid = client(registry).register_schema(SUBJECT, Schema(ORDER_V1))
    port = registry.port
    registry.stop()
    with pytest.raises(Exception) as err:
        client(registry).get_schema(sid)
    assert err.typename == "ConnectError"
    registry.start()
    assert registry.port == port
    assert json.loads(client(registry).get_schema(sid).schema_str) == json.loads(ORDER_V1)


def test_basic_auth():
    with DevRegistry(user_info="u:p") as reg:
        for conf in ({}, {"basic.auth.user.info": "u:wrong"}):
            with pytest.raises(SchemaRegistryError) as err:
                client(reg, **conf).get_subjects()
            assert err.value.http_status_code == 401
        assert client(reg, **{"basic.auth.user.info": "u:p"}).get_subjects() == []


def test_main_serves_in_the_foreground():
    proc = subprocess.Popen([sys.executable, "-m", "ledgerbatch.dev.registry", "--port", "0"],
                            cwd=REPO / "plugins", stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert SchemaRegistryClient({"url": url}).get_compatibility() == "BACKWARD"
    finally:
        proc.terminate()
        assert proc.wait(10) == 0

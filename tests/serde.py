"""Record values made by confluent-kafka's real serializers against the dev registry: the shapes the
decoder contract and the format tests share (an order with nested, repeated and logical-typed fields)."""
from __future__ import annotations

import json
from decimal import Decimal

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

# The columns every format's order maps onto, and one order as each format decodes it.
ORDER_COLUMNS = "id BIGINT, name STRING, amount DECIMAL(12,2), tags ARRAY<STRING>, customer STRUCT<name: STRING, tier: INT>"
ORDER = {"id": 7, "name": "Ann", "amount": Decimal("12.50"), "tags": ["a", "b"], "customer": {"name": "Bo", "tier": 2}}
ORDER_ROW = (7, "Ann", Decimal("12.50"), '{"a","b"}', '{"name":"Bo","tier":2}')

CUSTOMER_AVRO = {"type": "record", "name": "Customer", "fields": [
    {"name": "name", "type": "string"}, {"name": "tier", "type": "int"}]}
ORDER_AVRO_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "customer", "type": ["null", CUSTOMER_AVRO], "default": None},
]}
# v2 adds fields with defaults (a logical-typed time and an enum) and removes `name`.
ORDER_AVRO_V2 = {**ORDER_AVRO_V1, "fields": [f for f in ORDER_AVRO_V1["fields"] if f["name"] != "name"] + [
    {"name": "placed", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": None},
    {"name": "channel", "type": {"type": "enum", "name": "Channel", "symbols": ["WEB", "SHOP"]}, "default": "WEB"},
]}
ORDER_JSON_SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer"}, "name": {"type": "string"}, "amount": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "customer": {"type": "object", "properties": {"name": {"type": "string"}, "tier": {"type": "integer"}}},
}, "required": ["id"]}


def client(url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": url})


def context(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def avro_encoder(url: str, topic: str, schema: dict = ORDER_AVRO_V1):
    serialize = AvroSerializer(client(url), json.dumps(schema))
    return lambda record: serialize(record, context(topic))


def json_schema_encoder(url: str, topic: str):
    serialize = JSONSerializer(json.dumps(ORDER_JSON_SCHEMA), client(url))
    return lambda record: serialize({k: float(v) if isinstance(v, Decimal) else v
                                     for k, v in record.items() if v is not None}, context(topic))


def order_message_class():
    """shop.Order built at run time from a descriptor (no protoc here): amount is a decimal string."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop", syntax="proto3")
    customer = proto.message_type.add(name="Customer")
    customer.field.add(name="name", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    customer.field.add(name="tier", number=2, type=field.TYPE_INT32, label=field.LABEL_OPTIONAL)
    order = proto.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    order.field.add(name="name", number=2, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    order.field.add(name="amount", number=3, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    order.field.add(name="tags", number=4, type=field.TYPE_STRING, label=field.LABEL_REPEATED)
    order.field.add(name="customer", number=5, type=field.TYPE_MESSAGE, type_name=".shop.Customer",
                    label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def protobuf_encoder(url: str, topic: str):
    order_type = order_message_class()
    serialize = ProtobufSerializer(order_type, client(url), {"use.deprecated.format": False})

    def encode(record: dict) -> bytes:
        message = order_type(id=record["id"], name=record.get("name", ""), amount=str(record["amount"]),
                             tags=record["tags"])
        if record.get("customer"):
            message.customer.name, message.customer.tier = record["customer"]["name"], record["customer"]["tier"]
        return serialize(message, context(topic))
    return encode

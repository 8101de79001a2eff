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


def add_fields(message, *fields: tuple) -> None:
    """(name, number, type) per field: a scalar type name ("string", "int64") or a message (".pkg.Name");
    a fourth item "repeated" repeats it."""
    from google.protobuf import descriptor_pb2

    kinds = descriptor_pb2.FieldDescriptorProto
    for name, number, kind, *repeated in fields:
        typed = {"type": kinds.TYPE_MESSAGE, "type_name": kind} if kind.startswith(".") else \
            {"type": getattr(kinds, f"TYPE_{kind.upper()}")}
        message.field.add(name=name, number=number, label=kinds.LABEL_REPEATED if repeated else kinds.LABEL_OPTIONAL,
                          **typed)


def message_class(full_name: str, *files):
    """The class of message `full_name` from FileDescriptorProtos built at run time (no protoc here)."""
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    for proto in files:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))


def order_message_class():
    """shop.Order: amount is a decimal string."""
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop", syntax="proto3")
    add_fields(proto.message_type.add(name="Customer"), ("name", 1, "string"), ("tier", 2, "int32"))
    add_fields(proto.message_type.add(name="Order"), ("id", 1, "int64"), ("name", 2, "string"),
               ("amount", 3, "string"), ("tags", 4, "string", "repeated"), ("customer", 5, ".shop.Customer"))
    return message_class("shop.Order", proto)


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


def debezium_avro_envelope(value_record: dict) -> dict:
    """A Debezium Envelope as Confluent's AvroConverter writes its schema (cut down to before, after, op)."""
    namespace = value_record["namespace"]  # <topic.prefix>.<schema>.<table>, of the Value record too
    return {"type": "record", "name": "Envelope", "namespace": namespace, "fields": [
        {"name": "before", "type": ["null", value_record], "default": None},
        {"name": "after", "type": ["null", value_record["name"]], "default": None},
        {"name": "op", "type": "string"}], "connect.name": f"{namespace}.Envelope"}


def debezium_avro_encoder(url: str, topic: str):
    """An order as the row image `after` of a create event."""
    value = {**ORDER_AVRO_V1, "name": "Value", "namespace": "shop.public.orders"}
    serialize = AvroSerializer(client(url), json.dumps(debezium_avro_envelope(value)))
    return lambda order: serialize({"before": None, "after": order, "op": "c"}, context(topic))

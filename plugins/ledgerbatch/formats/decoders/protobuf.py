"""`format: protobuf`: Confluent wire format (schema id + message indexes), each value parsed with the
message type its writer schema names, then read field by field: enums by name, well-known
Timestamp as a time, wrappers as their value, maps as objects, proto3 defaults as they read."""
from __future__ import annotations

import datetime as dt

from ledgerbatch.formats.decoders.confluent_wire import WRITER_SCHEMA_ONLY, decode_framed, registry_client

_WRAPPERS = {"google.protobuf.DoubleValue", "google.protobuf.FloatValue", "google.protobuf.Int64Value",
             "google.protobuf.UInt64Value", "google.protobuf.Int32Value", "google.protobuf.UInt32Value",
             "google.protobuf.BoolValue", "google.protobuf.StringValue", "google.protobuf.BytesValue"}


class ProtobufDecoder:
    def __init__(self, options: dict):
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
        from google.protobuf import empty_pb2

        self._client = registry_client(options)
        # confluent-kafka parses into a type fixed up front; this one only lends its writer-schema
        # resolution (references included), so each value is parsed with its own writer's type.
        self._resolver = ProtobufDeserializer(empty_pb2.Empty, WRITER_SCHEMA_ONLY, self._client)
        self._types = {}  # (schema id, message indexes) -> message class

    def decode(self, raw: bytes | None) -> dict:
        return decode_framed(raw, self._parse)

    def _parse(self, raw: bytes) -> dict:
        from confluent_kafka.schema_registry import dual_schema_id_deserializer
        from confluent_kafka.schema_registry.common.protobuf import PROTOBUF_TYPE
        from confluent_kafka.schema_registry.serde import SchemaId

        sid = SchemaId(PROTOBUF_TYPE)
        payload = dual_schema_id_deserializer(raw, None, sid)
        indexes = tuple(sid.message_indexes or (0,))
        message_type = self._types.get((sid.id, indexes))
        if message_type is None:
            message_type = self._types[(sid.id, indexes)] = self._writer_type(sid.id, list(indexes))
        message = message_type()
        message.ParseFromString(payload.read())
        return _message(message)

    def _writer_type(self, schema_id: int, indexes: list[int]):
        from google.protobuf.message_factory import GetMessageClass

        return GetMessageClass(self.descriptor(self._client.get_schema(schema_id, fmt="serialized"), indexes))

    def descriptor(self, schema, indexes: list[int]):
        fd_proto, pool = self._resolver._get_parsed_schema(schema)
        return self._resolver._get_message_desc(pool, pool.FindFileByName(fd_proto.name), indexes)


def _message(message) -> dict:
    out = {}
    for field in message.DESCRIPTOR.fields:
        if not field.is_repeated and field.has_presence and not message.HasField(field.name):
            out[field.name] = None  # a message or an `optional` scalar that was not set
            continue
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _single(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_single(field, v) for v in value]
        else:
            out[field.name] = _single(field, value)
    return out


def _single(field, value):
    if field.enum_type is not None:
        number = field.enum_type.values_by_number.get(value)
        return number.name if number is not None else value
    if field.message_type is None:
        return value
    name = field.message_type.full_name
    if name == "google.protobuf.Timestamp":
        return value.ToDatetime(tzinfo=dt.timezone.utc)
    if name in _WRAPPERS:
        return value.value
    if name in ("google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"):
        from google.protobuf.json_format import MessageToDict

        return MessageToDict(value)
    return _message(value)


_SCALARS = {"int32": "INT", "sint32": "INT", "sfixed32": "INT", "int64": "BIGINT", "sint64": "BIGINT",
            "sfixed64": "BIGINT", "uint32": "BIGINT", "fixed32": "BIGINT", "uint64": "DECIMAL(20,0)",
            "fixed64": "DECIMAL(20,0)", "float": "FLOAT", "double": "DOUBLE", "bool": "BOOLEAN", "string": "STRING",
            "bytes": "BINARY", "enum": "STRING"}


def columns_ddl(schema, decoder: "ProtobufDecoder") -> str:
    """The Spark DDL of the schema's first message, message index 0 as Confluent's serializers number
    them (for specs without `schema:`)."""
    desc = decoder.descriptor(schema, [0])
    return ", ".join(f"{f.name} {_field_type(f)}" for f in desc.fields)


def _field_type(field, seen: frozenset = frozenset()) -> str:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return f"MAP<{_single_type(key, seen)}, {_single_type(value, seen)}>"
    return f"ARRAY<{_single_type(field, seen)}>" if field.is_repeated else _single_type(field, seen)


def _single_type(field, seen: frozenset = frozenset()) -> str:
    if field.message_type is None:
        from google.protobuf.descriptor import FieldDescriptor

        names = {v: k.lower().removeprefix("type_") for k, v in vars(FieldDescriptor).items() if k.startswith("TYPE_")}
        return _SCALARS[names[field.type]]
    name = field.message_type.full_name
    if name == "google.protobuf.Timestamp":
        return "TIMESTAMP"
    if name in _WRAPPERS:
        return _single_type(field.message_type.fields_by_name["value"], seen)
    if name.startswith("google.protobuf.") or name in seen:  # a message that contains itself: JSON
        return "VARIANT"
    inner = seen | {name}
    return "STRUCT<" + ", ".join(f"{f.name}: {_field_type(f, inner)}" for f in field.message_type.fields) + ">"

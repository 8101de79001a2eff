"""What the registry formats share: the Schema Registry client, the wire-format check, and the line
between a bad record (quarantined) and a registry that cannot answer (the batch fails, nothing is
committed, the next run retries)."""
from __future__ import annotations

from typing import Callable

from ledgerbatch.formats.bad_value import BadValue

# Options of source.schema_registry passed to confluent-kafka's SchemaRegistryClient as they are.
CLIENT_OPTIONS = ("url", "basic.auth.user.info", "basic.auth.credentials.source", "ssl.ca.location",
                  "ssl.certificate.location", "ssl.key.location", "timeout", "max.retries", "retries.wait.ms",
                  "retries.max.wait.ms", "bearer.auth.credentials.source", "bearer.auth.token",
                  "bearer.auth.logical.cluster", "bearer.auth.identity.pool.id")


_NUMERIC = ("timeout", "max.retries", "retries.wait.ms", "retries.max.wait.ms")


class RegistryUnavailable(RuntimeError):
    """The registry did not answer (unreachable, 5xx, auth): never a reason to quarantine a record."""


def _no_subject(ctx, record_name, *args):
    return None


# Deserializer settings: no subject, so no "latest version" look-ups or migrations: every value is read
# with its own writer schema and nothing else.
WRITER_SCHEMA_ONLY = {"subject.name.strategy": _no_subject}


def registry_client(options: dict):
    """One client per decoder, so per Spark task: its cache makes one request per schema id."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    conf = {k: options[k] for k in CLIENT_OPTIONS if k in options}
    try:  # spec and environment values are text; the client wants numbers for these
        conf.update({k: float(conf[k]) if "." in str(conf[k]) else int(conf[k]) for k in _NUMERIC if k in conf})
    except ValueError as exc:
        raise ValueError(f"source.schema_registry: {exc}") from None
    return SchemaRegistryClient(conf)


def schema_id(raw: bytes | None) -> int:
    """The writer schema id of a value in the Confluent wire format (magic byte 0, 4-byte id); a
    value in any other shape is a bad record."""
    if raw is None:
        raise BadValue("null value (tombstone)")
    if len(raw) < 5 or raw[0] != 0:
        first = f"0x{raw[0]:02x}" if raw else "nothing"
        raise BadValue(f"value is not in the Confluent wire format (magic byte 0 and a 4-byte schema id; "
                       f"it starts with {first}, {len(raw)} bytes)")
    return int.from_bytes(raw[1:5], "big")


def decode_framed(raw: bytes | None, decode: Callable[[bytes], object]) -> object:
    """Run a confluent-kafka deserializer on one value; sort its failures into bad records (BadValue)
    and registry outages (RegistryUnavailable, or the transport's own error)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    sid = schema_id(raw)
    try:
        return decode(raw)
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:
            raise BadValue(f"schema id {sid} is unknown to the registry ({exc.error_code}: {exc.error_message})") from None
        raise RegistryUnavailable(f"schema registry answered {exc.http_status_code} for schema id {sid}: "
                                  f"{exc.error_message}") from None
    except BadValue:
        raise
    except Exception as exc:
        if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "httpcore2"):
            raise RegistryUnavailable(f"schema registry unreachable while reading schema id {sid}: {exc!r}") from None
        # the decoder's own words may quote the value: its type only (the record stays in the quarantine's value)
        raise BadValue(f"value does not decode with writer schema id {sid} ({type(exc).__name__})") from None

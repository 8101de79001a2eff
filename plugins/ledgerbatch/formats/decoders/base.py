"""The decoder seam: the one interface every record format implements, and what a change does."""
from __future__ import annotations

from typing import Mapping, Protocol

# What a change does to the target (decode_change): upsert its fields, delete its key, or nothing.
UPSERT, DELETE, SKIP = "u", "d", "s"


class Decoder(Protocol):
    def __init__(self, options: dict) -> None: ...

    def decode(self, raw: bytes | None) -> Mapping[str, object]:
        """The record's fields by name (absent fields are NULL); raises BadValue."""


class ChangeDecoder(Protocol):
    """Pipelines whose records are changes (`format: debezium`, or `target.deletes: true`) decode each
    record, key and value, into (UPSERT | DELETE | SKIP, fields); a DELETE's fields hold the key."""

    def decode_change(self, key: bytes | None, raw: bytes | None) -> tuple[str, Mapping[str, object]]: ...

"""The simulated world around the ledger: a Kafka stand-in and the records in it.

Each partition holds a log whose start moves with retention. A record is a pure function of its coordinates
and the kind drawn when it was produced, so a batch is staged by hand (tests/integration/staged.py: plain
INSERTs, mark_staged, as the executors would) and the model knows what every offset holds. Keys live in one
partition each, as Kafka's keyed partitioning puts them.
"""
from __future__ import annotations

import base64
import random
import time
from dataclasses import dataclass, field
from decimal import Decimal

PARTITIONS = 2
# What each mode's records may be: rows the target refuses (`negative` under a CHECK, `flagged` by a trigger,
# `long` keys over the btree's row size) only where the mode writes such rows as they are.
# `aborted`: an offset of an aborted Kafka transaction (or a marker): it holds no record the pipeline reads.
KINDS = {
    "append": ("good", "good", "poison", "negative", "flagged", "long", "aborted"),
    "upsert": ("good", "good", "poison", "negative", "flagged", "long", "tombstone", "aborted"),
    "versioned": ("good", "good", "poison", "aborted"),
    "changes": ("good", "good", "poison", "tombstone", "aborted"),
    "aggregate": ("good", "good", "poison", "aborted"),
}
FLAGGED = "13.00"  # the amount a user's trigger refuses
# The first offset's Kafka timestamp, 30 days before the run began; each offset a second later (offsets_for_times,
# batch.min_records' max_delay: the records are days old)
EPOCH_MS = (int(time.time()) - 30 * 86_400) * 1000


@dataclass(frozen=True)
class Record:
    key: str
    amount: str | None  # None: a tombstone (a change pipeline deletes its key)
    version: str  # the record's `ts`: out of offset order, never equal within a partition

    def refused(self, rules: Rules, mode: str) -> str | None:
        """The SQLSTATE the target's rules refuse this row with, or None (a change pipeline's tombstone is a
        delete, no row)."""
        if self.amount is None and mode == "changes":
            return None
        if len(self.key) > 2000 and (mode != "append" or rules.key_index):
            return "54000"  # index row size over the btree maximum (upsert's primary key, or a user's index)
        if rules.check and Decimal(self.amount or "0") <= 0:  # a tombstone is a row of 0.00 where it is no delete
            return "23514"
        if rules.trigger and self.amount == FLAGGED:
            return "LB001"
        return None


@dataclass(frozen=True)
class Rules:
    """The user's own rules on the target (machine.user_ddl adds them as a user would)."""
    check: bool = False  # CHECK (amount > 0) NOT VALID
    trigger: bool = False  # a trigger raising SQLSTATE LB001 on the flagged amount
    key_index: bool = False  # a btree index on order_id (append)
    foreign_key: bool = False  # a deferred FK from customer to a table of the user's (every row's customer is there)
    self_reference: bool = False  # upsert: a deferred FK from a column of the user's to the target's own key


def record(kind: str, partition: int, offset: int) -> Record | None:
    """None: a poison record (the decoder fails), or no record at all (aborted: World.held)."""
    if kind in ("poison", "aborted"):
        return None
    key = f"p{partition}-k{offset % 5}"
    if kind == "long":  # random bytes: a repeated letter would compress below the btree's limit
        noise = random.Random(partition * 1_000_003 + offset).randbytes(3000)
        key = f"p{partition}-{offset}-{base64.b64encode(noise).decode()}"
    amount = {"negative": "-1.00", "flagged": FLAGGED, "tombstone": None}.get(kind, f"{offset % 9 + 1}.00")
    second, micro = (offset * 7) % 23, offset  # versions out of offset order, unique by the microseconds
    return Record(key, amount, f"2026-11-21T10:00:{second:02d}.{micro:06d}")


@dataclass
class Log:
    kinds: list[str] = field(default_factory=list)
    low: int = 0  # retention moved the log's start here

    @property
    def high(self) -> int:
        return len(self.kinds)


@dataclass
class World:
    logs: list[Log] = field(default_factory=lambda: [Log() for _ in range(PARTITIONS)])

    def record(self, partition: int, offset: int) -> Record | None:
        return record(self.logs[partition].kinds[offset], partition, offset)

    def kind(self, partition: int, offset: int) -> str:
        return self.logs[partition].kinds[offset]

    def held(self, partition: int, offset: int) -> bool:
        """Whether the offset holds a record the pipeline reads (not one of an aborted transaction)."""
        return self.kind(partition, offset) != "aborted"

    def size(self, partition: int, offset: int) -> int:
        """The record value's size in bytes, as batch.max_bytes measures it (a pure function, as the record is)."""
        rec = self.record(partition, offset)
        return 40 if rec is None else 60 + len(rec.key)


def timestamp_ms(offset: int) -> int:
    """A record's Kafka timestamp: a pure function of its offset, rising with it in every partition."""
    return EPOCH_MS + offset * 1000

"""The simulated world around the ledger: a Kafka stand-in and the records in it.

Each partition holds a log whose start moves with retention. A record is a pure function of its coordinates
and the kind drawn when it was produced, so a batch is staged by hand (tests/integration/staged.py: plain
INSERTs, mark_staged, as the executors would) and the model knows what every offset holds. Keys live in one
partition each, as Kafka's keyed partitioning puts them.
"""
from __future__ import annotations

import base64
import random
from dataclasses import dataclass, field
from decimal import Decimal

PARTITIONS = 2
# What each mode's records may be: rows the target refuses (`negative` under a CHECK, `flagged` by a trigger,
# `long` keys over the btree's row size) only where the mode writes such rows as they are.
KINDS = {
    "append": ("good", "good", "poison", "negative", "flagged", "long"),
    "upsert": ("good", "good", "poison", "negative", "flagged", "long", "tombstone"),
    "versioned": ("good", "good", "poison"),
    "changes": ("good", "good", "poison", "tombstone"),
    "aggregate": ("good", "good", "poison"),
}
FLAGGED = "13.00"  # the amount a user's trigger refuses


@dataclass(frozen=True)
class Record:
    key: str
    amount: str | None  # None: a tombstone (a change pipeline deletes its key)
    version: str  # the record's `ts`: out of offset order, never equal within a partition

    def refused(self, rules: Rules, mode: str) -> str | None:
        """The SQLSTATE the target's rules refuse this row with, or None."""
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


def record(kind: str, partition: int, offset: int) -> Record | None:
    """None: a poison record (the decoder fails)."""
    if kind == "poison":
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

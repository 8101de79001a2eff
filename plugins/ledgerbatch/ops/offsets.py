"""`ledgerbatch offsets`: a pipeline's cursors against Kafka, and moving them on purpose (`--set`).

A move is refused while a batch is open (its ranges are pinned from the cursors). Forward skips offsets:
they become a `skipped` range of ledger.lost_ranges, a tile of the partition as delivered ones are, so
`verify` accounts for them. Back is only allowed over skipped offsets (the next run delivers them); over
delivered ones it would deliver them twice, so it is refused in favour of `ledgerbatch replay`, which
re-delivers a range as each target mode demands. Every move is a row of ledger.offset_moves, written in
the transaction that moves the cursor.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from ledgerbatch.errors import BatchOpen, DeliveredAgain, LedgerbatchError, require
from ledgerbatch.ledger.batches import get_batch, lock_pipeline, open_live_batch_id
from ledgerbatch.ledger.cursors import get_cursors, init_cursors
from ledgerbatch.ledger.sql import run
from ledgerbatch.model.moves import Move, plan_moves
from ledgerbatch.model.ranges import TopicPartition, Watermarks
from ledgerbatch.model.times import epoch_ms
from ledgerbatch.source import kafka
from ledgerbatch.spec.pipeline import PipelineSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """Where to move: exactly one of a time (ISO-8601), an offset, the log's start or its end."""
    time: str | None = None
    offset: int | None = None
    earliest: bool = False
    latest: bool = False

    def __str__(self) -> str:
        return (f"to-time {self.time}" if self.time else f"to-offset {self.offset}" if self.offset is not None
                else "to-earliest" if self.earliest else "to-latest")


def set_offsets(engine: Engine, spec: PipelineSpec, bootstrap_servers: str, target: Target, by: str, reason: str,
                topic: str | None = None, partitions: list[int] | None = None, dry_run: bool = False) -> list[Move]:
    """Move the cursors of the chosen partitions (all of the spec's topics by default) to `target`."""
    require(by, "who moves the offsets (--by NAME)")
    require(reason, "why (--reason TEXT)")
    if topic is not None and topic not in spec.topics:
        raise LedgerbatchError(f"topic {topic!r} is not one of {spec.name}'s ({', '.join(spec.topics)})")
    ends = kafka.watermarks(bootstrap_servers, (topic,) if topic else spec.topics, dict(spec.kafka_options))
    if partitions:
        unknown = sorted({p for p in partitions} - {p for _, p in ends})
        if unknown:
            raise LedgerbatchError(f"no partition {', '.join(map(str, unknown))} in {topic or ', '.join(spec.topics)}")
        ends = {tp: wm for tp, wm in ends.items() if tp[1] in partitions}
    targets = _resolve(target, ends, bootstrap_servers, spec)
    with engine.begin() as conn:
        lock_pipeline(conn, spec.name)  # no plan in between: the moves and the next batch see one ledger
        open_id = open_live_batch_id(conn, spec.name)
        if open_id is not None:
            raise BatchOpen(spec.name, open_id, get_batch(conn, open_id).status)
        moves = plan_moves(get_cursors(conn, spec.name, spec.topics), ends, targets)
        for m in moves:
            if m.kind == "back":
                _check_back(conn, spec, m)
        if dry_run:
            conn.rollback()
            return moves
        for m in moves:
            if m.kind != "stay":
                _apply(conn, spec, m, by.strip(), reason.strip(), str(target))
    for m in moves:
        log.warning("%s: %s (by %s: %s)", spec.name, m, by, reason)
    return moves


def _resolve(target: Target, ends: dict[TopicPartition, Watermarks], bootstrap_servers: str,
             spec: PipelineSpec) -> dict[TopicPartition, int]:
    if sum((target.time is not None, target.offset is not None, target.earliest, target.latest)) != 1:
        raise LedgerbatchError("say where to move: one of --to-time, --to-offset, --to-earliest, --to-latest")
    if target.time is not None:
        return kafka.offsets_at(bootstrap_servers, ends, epoch_ms(target.time),
                                dict(spec.kafka_options))
    if target.offset is not None:
        return {tp: target.offset for tp in ends}
    return {tp: wm.low if target.earliest else wm.high for tp, wm in ends.items()}


def _check_back(conn, spec: PipelineSpec, m: Move) -> None:
    where = {"pipeline": spec.name, "topic": m.topic, "partition": m.partition}
    delivered = run(conn, "delivered_between", {**where, "from_offset": m.to, "until_offset": m.cursor}).scalar_one()
    if delivered:
        raise DeliveredAgain(spec.name, m.topic, m.partition, m.to, m.cursor, delivered)


def _apply(conn, spec: PipelineSpec, m: Move, by: str, reason: str, request: str) -> None:
    where = {"pipeline": spec.name, "topic": m.topic, "partition": m.partition}
    move_id = run(conn, "insert_offset_move", {**where, "from_offset": m.cursor, "to_offset": m.to, "by": by,
                                               "reason": reason, "request": request}).scalar_one()
    if m.kind == "start":
        init_cursors(conn, spec.name, {(m.topic, m.partition): m.to})
        return
    if m.kind == "skip":
        run(conn, "insert_skipped_range", {**where, "from_offset": m.cursor, "until_offset": m.to, "by": by,
                                           "reason": reason, "move_id": move_id})
    else:
        run(conn, "unskip_from", {**where, "to_offset": m.to})
    if run(conn, "move_cursor", {**where, "from_offset": m.cursor, "to_offset": m.to}).rowcount != 1:
        raise LedgerbatchError(f"{m.topic}[{m.partition}]: the cursor moved meanwhile; nothing was changed")


def recent_moves(engine: Engine, spec: PipelineSpec, limit: int = 5) -> list:
    with engine.connect() as conn:
        return run(conn, "recent_offset_moves", {"pipeline": spec.name, "limit": limit}).all()

"""Planning: the next batch's ranges from the ledger's cursors and Kafka's read_committed end offsets.

An unfinished batch is resumed with its same ranges, never re-planned, with one exception: a batch that
failed `errors.max_ratio` is abandoned and its offsets planned again, with whatever arrived since. Its
ratio was the batch boundary's doing (one bad record alone is 100% bad); resuming it would fail forever.
A paused pipeline (ops/pause.py) gets no new batch; its unfinished one is still resumed.
"""
from __future__ import annotations

import logging
import time

from sqlalchemy.engine import Engine

from ledgerbatch.errors import OVER_BUDGET
from ledgerbatch.ledger.batches import (
    get_batch,
    insert_batch,
    lock_pipeline,
    mark_abandoned,
    open_live_batch_id,
    pin_spec_version,
)
from ledgerbatch.ledger.cursors import get_cursors, init_cursors, last_served, record_end_offsets
from ledgerbatch.ledger.pauses import current_pause, end_wait, wait_age
from ledgerbatch.model.batch import Batch, BatchKind, BatchStatus
from ledgerbatch.model.ranges import TopicPartition, Watermarks, plan_ranges, start_offsets, too_early
from ledgerbatch.model.times import epoch_ms
from ledgerbatch.source import kafka
from ledgerbatch.source.sizes import cap_bytes
from ledgerbatch.spec.pipeline import PipelineSpec

log = logging.getLogger(__name__)


def plan_next(engine: Engine, spec: PipelineSpec, bootstrap_servers: str) -> Batch | None:
    """The unfinished batch if there is one, else a new batch up to the end offsets, else None."""
    with engine.connect() as conn:
        open_id = open_live_batch_id(conn, spec.name)
        if open_id is not None:
            batch = get_batch(conn, open_id)
            if not over_budget(batch):
                log.info("resuming batch %d (%s, attempt %d) with its planned ranges", open_id, batch.status,
                         batch.attempt)
                return batch
    ends = kafka.watermarks(bootstrap_servers, spec.topics, dict(spec.kafka_options))
    with engine.connect() as conn:
        cursors = get_cursors(conn, spec.name, spec.topics)
    at = None
    if spec.start_time is not None and not cursors:  # a new pipeline that starts at a time: Kafka says where
        at = kafka.offsets_at(bootstrap_servers, ends, epoch_ms(spec.start_time), dict(spec.kafka_options))
    if spec.min_records > 1 and filling(engine, spec, bootstrap_servers, ends,
                                        start_offsets(ends, cursors, spec.start if not cursors else "earliest", at)):
        return None
    return plan_from(engine, spec, ends, at, bootstrap_servers)


def filling(engine: Engine, spec: PipelineSpec, bootstrap_servers: str, ends: dict[TopicPartition, Watermarks],
            positions: dict[TopicPartition, int]) -> bool:
    """batch.min_records: fewer offsets pending than that, and the oldest has not waited batch.max_delay.
    Its wait is the older of its record's age and how long the planner has held it back (ledger.waits),
    so a producer whose clock runs ahead does not hold records back for longer than max_delay."""
    if any(tp not in ends or not ends[tp].low <= pos <= ends[tp].high for tp, pos in positions.items()):
        return False  # a cursor out of its log (offsets lost, a topic recreated): plan_from stops with why
    pending = {tp: pos for tp, pos in positions.items() if tp in ends and ends[tp].high > pos}
    total = sum(ends[tp].high - pos for tp, pos in pending.items())
    if not 0 < total < spec.min_records:
        return False
    stamps = [ms for ms in kafka.timestamps_at(bootstrap_servers, pending, dict(spec.kafka_options)).values()
              if ms is not None and ms > 0]
    with engine.begin() as conn:
        held = wait_age(conn, spec.name)
    age = max(held, time.time() - min(stamps) / 1000) if stamps else held
    if not too_early(total, spec.min_records, age, spec.max_delay_s):
        return False
    log.info("%s: %d offsets pending, fewer than batch.min_records %d, and the oldest has waited %.0fs of "
             "batch.max_delay %gs: no batch yet", spec.name, total, spec.min_records, age, spec.max_delay_s)
    return True


def plan_from(engine: Engine, spec: PipelineSpec, ends: dict[TopicPartition, Watermarks],
              at: dict[TopicPartition, int] | None = None, bootstrap_servers: str | None = None) -> Batch | None:
    """Plan under the pipeline lock; `at`: where a pipeline that starts at a time starts (plan_next);
    `bootstrap_servers`: where batch.max_bytes measures the values of the planned ranges."""
    with engine.begin() as conn:
        lock_pipeline(conn, spec.name)
        record_end_offsets(conn, spec.name, ends)
        open_id = open_live_batch_id(conn, spec.name)
        if open_id is not None:  # another planner got here first, or a batch over its error budget
            batch = get_batch(conn, open_id)
            if not over_budget(batch):
                return batch
            mark_abandoned(conn, open_id, f"planned again with what arrived since: {batch.error}")
            log.warning("batch %d failed errors.max_ratio (%s): abandoned, its offsets are planned again",
                        open_id, batch.error)
        if current_pause(conn, spec.name) is not None:  # an open batch above still finishes; nothing new
            return None
        cursors = get_cursors(conn, spec.name, spec.topics)
        # A new pipeline starts where the spec says; partitions added later start at their log start.
        starts = start_offsets(ends, cursors, spec.start if not cursors else "earliest", at if not cursors else None)
        ranges = plan_ranges(ends, starts, spec.max_records, spec.max_records_per_partition,
                             last_served(conn, spec.name))
        if spec.max_bytes and ranges:
            conf = kafka.consumer_config(bootstrap_servers, dict(spec.kafka_options))
            ranges = cap_bytes(ranges, spec.max_bytes, conf)
        init_cursors(conn, spec.name, {tp: o for tp, o in starts.items() if tp not in cursors})
        if not ranges:
            return None
        batch_id = insert_batch(conn, spec.name, BatchKind.LIVE, ranges)
        end_wait(conn, spec.name)
        pin_spec_version(conn, batch_id, spec.name, spec.version, spec.canonical)
        batch = get_batch(conn, batch_id)
    log.info("planned batch %d: %d offsets in %d ranges", batch_id, batch.span, len(ranges))
    return batch


def over_budget(batch: Batch) -> bool:
    return batch.status == BatchStatus.FAILED and OVER_BUDGET in (batch.error or "")

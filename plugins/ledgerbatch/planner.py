"""Planning: the next batch's ranges from the ledger's cursors and Kafka's read_committed end offsets.

An unfinished batch is always resumed with its same ranges, never re-planned.
"""
from __future__ import annotations

import logging

from sqlalchemy.engine import Engine

from . import kafka, ledger
from .ledger import Batch
from .ranges import Watermarks, TopicPartition, plan_ranges, start_offsets
from .spec import PipelineSpec
from .states import BatchKind

log = logging.getLogger(__name__)


def plan_next(engine: Engine, spec: PipelineSpec, bootstrap_servers: str) -> Batch | None:
    """The unfinished batch if there is one, else a new batch up to the end offsets, else None."""
    with engine.connect() as conn:
        open_id = ledger.open_live_batch_id(conn, spec.name)
        if open_id is not None:
            batch = ledger.get_batch(conn, open_id)
            log.info("resuming batch %d (%s, attempt %d) with its planned ranges", open_id, batch.status, batch.attempt)
            return batch
    ends = kafka.watermarks(bootstrap_servers, spec.topics, dict(spec.kafka_options))
    return plan_from(engine, spec, ends)


def plan_from(engine: Engine, spec: PipelineSpec, ends: dict[TopicPartition, Watermarks]) -> Batch | None:
    with engine.begin() as conn:
        ledger.lock_pipeline(conn, spec.name)
        ledger.record_end_offsets(conn, spec.name, ends)
        open_id = ledger.open_live_batch_id(conn, spec.name)
        if open_id is not None:  # another planner got here first
            return ledger.get_batch(conn, open_id)
        cursors = ledger.cursors(conn, spec.name)
        # A new pipeline starts where the spec says; partitions added later start at their log start.
        starts = start_offsets(ends, cursors, spec.start if not cursors else "earliest")
        ranges = plan_ranges(ends, starts, spec.max_records)
        ledger.init_cursors(conn, spec.name, {tp: o for tp, o in starts.items() if tp not in cursors})
        if not ranges:
            return None
        batch_id = ledger.insert_batch(conn, spec.name, BatchKind.LIVE, ranges)
        ledger.pin_spec_version(conn, batch_id, spec.name, spec.version, spec.canonical)
        batch = ledger.get_batch(conn, batch_id)
    log.info("planned batch %d: %d offsets in %d ranges", batch_id, batch.span, len(ranges))
    return batch

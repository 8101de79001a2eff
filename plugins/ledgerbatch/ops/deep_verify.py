"""`ledgerbatch verify PIPELINE --deep`: the target against Kafka itself, not only against the ledger.

The committed ranges (all, those of batches since one, or of a sample of batches) are read again by the
pipeline's own process step into a staging table, as a replay's would be, and never committed: the
batch is abandoned once compared. SQL then checks that every good record is in the target with its values
(append: by coordinates; upsert: the row at its coordinates, a row for its key, no older version), every
bad record in ledger.quarantine with the same raw bytes, and nothing of the ranges in the target or the
quarantine that Kafka does not hold. Aggregate: the standing batches (those no later replay superseded)
are read again whole, and the groups their records make must be their contributions, merged by key
(`verify` checks the target against the contributions). Offsets Kafka no longer holds are reported as
not checkable, never as passed. Spark streams the ranges, so memory does not grow with them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.engine import Engine

from ledgerbatch.commit.modes.aggregate import contributions_table, measures_merged, measures_differ
from ledgerbatch.commit.modes.base import prefixed, target_names
from ledgerbatch.commit.modes.upsert import deletes_table, match_key
from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.identifiers import quote_ident
from ledgerbatch.ledger.batches import get_batch, mark_abandoned
from ledgerbatch.ledger.sql import run
from ledgerbatch.model.ranges import OffsetRange, range_arrays
from ledgerbatch.plan.replay import plan_replay
from ledgerbatch.source import kafka
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.sqlfiles import Fragment, query
from ledgerbatch.stage.process import process_batch
from ledgerbatch.stage.tables import bad_name, column_names, drop_finished_staging
from ledgerbatch.stage.transform import spec_for_batch

log = logging.getLogger(__name__)
_COMPARE = {"append": "deep_append", "upsert": "deep_upsert", "aggregate": "deep_aggregate"}


@dataclass
class DeepReport:
    records: int = 0  # offsets read again and compared
    ranges: list[OffsetRange] = field(default_factory=list)
    not_checkable: list[OffsetRange] = field(default_factory=list)  # no longer in Kafka
    problems: list[str] = field(default_factory=list)


def deep_verify(engine: Engine, spec: PipelineSpec, db_url: str, bootstrap_servers: str, spark_factory,
                since: int = 0, sample: float = 1.0) -> DeepReport:
    if not 0 < sample <= 1:
        raise LedgerbatchError(f"--sample must be a fraction above 0 and at most 1, got {sample}")
    params = {"pipeline": spec.name, "since": since, "sample": sample}
    with engine.connect() as conn:
        if spec.mode == "aggregate":  # whole standing batches: a contribution is a batch's groups
            chosen = [(r.batch_id, OffsetRange(r.topic, r.partition, r.from_offset, r.until_offset))
                      for r in run(conn, "standing_batches", params)]
        else:
            chosen = [(None, OffsetRange(r.topic, r.partition, r.from_offset, r.until_offset))
                      for r in run(conn, "delivered_ranges", params)]
    topics = tuple(sorted({r.topic for _, r in chosen})) or spec.topics
    report, batches = _checkable(chosen, kafka.watermarks(bootstrap_servers, topics, dict(spec.kafka_options)))
    report.records = sum(r.span for r in report.ranges)
    if not report.ranges:
        return report
    batch = plan_replay(engine, spec, report.ranges)
    log.info("%s: verify --deep reads %d offsets in %d ranges again (batch %d, never committed)", spec.name,
             report.records, len(report.ranges), batch.batch_id)
    batch = process_batch(spark_factory(), engine, spec, batch.batch_id, db_url, bootstrap_servers)
    with engine.begin() as conn:
        batch = get_batch(conn, batch.batch_id, for_update=True)
        checked = spec_for_batch(spec, batch.output_schema)
        names = _names(checked, batch.staging_table)
        params = {"pipeline": spec.name, "batches": batches, **range_arrays(report.ranges)}
        for name in (_COMPARE[spec.mode], "deep_quarantine"):
            for row in conn.execute(text(query(name, **names)), params):
                report.problems.append(f"{row.problem}: {row.records}, e.g. {', '.join(row.examples)}")
        mark_abandoned(conn, batch.batch_id, f"verify --deep: {len(report.problems)} kinds of problem")
    drop_finished_staging(engine, spec.name)
    return report


def _checkable(chosen: list[tuple[int | None, OffsetRange]], ends) -> tuple[DeepReport, list[int]]:
    """The chosen ranges split at each partition's log start into what Kafka still holds and what it does
    not. Ranges of a batch (aggregate) go together: a batch Kafka no longer holds whole is not checkable."""
    report = DeepReport()
    lows = [ends[r.topic_partition].low if r.topic_partition in ends else r.until_offset for _, r in chosen]
    gone = {batch_id for (batch_id, r), low in zip(chosen, lows) if r.from_offset < low}
    for (batch_id, r), low in zip(chosen, lows):
        if batch_id is not None and batch_id in gone:
            report.not_checkable.append(r)
            continue
        if r.from_offset < low:
            report.not_checkable.append(OffsetRange(r.topic, r.partition, r.from_offset, min(low, r.until_offset)))
        if low < r.until_offset:
            report.ranges.append(OffsetRange(r.topic, r.partition, max(low, r.from_offset), r.until_offset))
    report.ranges = merged(sorted(report.ranges))
    report.not_checkable = merged(sorted(report.not_checkable))
    return report, sorted({b for b, _ in chosen if b is not None} - gone)


def merged(ranges: list[OffsetRange]) -> list[OffsetRange]:
    """Adjacent ranges of a partition as one (ranges sorted by partition and offset)."""
    out: list[OffsetRange] = []
    for r in ranges:
        last = out[-1] if out else None
        if last and last.topic_partition == r.topic_partition and last.until_offset == r.from_offset:
            out[-1] = OffsetRange(r.topic, r.partition, last.from_offset, r.until_offset)
        else:
            out.append(r)
    return out


def _names(spec: PipelineSpec, staging: str) -> dict:
    columns = column_names(spec)
    key = list(spec.key)
    version = quote_ident(spec.version_by) if spec.version_by else None
    deleted = "false"
    if spec.changes:
        deletes = quote_ident(deletes_table(spec))
        deleted = f"EXISTS (SELECT 1 FROM ledger_deletes.{deletes} d WHERE {match_key('d', key)}"
        deleted += (f" AND ROW(d.{version}, d._offset, d._partition, d._topic) >= ROW(c.{version}, c._offset, "
                    f"c._partition, c._topic))" if version else ")")
    aggregates = dict(key=key, contributions=contributions_table(spec), measures_agg=measures_merged(spec),
                      differs=measures_differ(spec)) if spec.mode == "aggregate" else {}
    return dict(staging=staging, bad=bad_name(staging), columns_t=prefixed("t", columns),
                columns_s=prefixed("s", columns), key_c=prefixed("c", key),
                match_t=match_key("t", key),
                upserts=Fragment("s._change = 'u'" if spec.changes else "true"), deleted=Fragment(deleted),
                newer=Fragment(f"t.{version} IS NOT NULL AND ROW(c.{version}, c._offset, c._partition, c._topic) > "
                               f"ROW(t.{version}, t._offset, t._partition, t._topic)" if version else "false"),
                **aggregates, **target_names(spec))

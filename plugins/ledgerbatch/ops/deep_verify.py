"""`ledgerbatch verify PIPELINE --deep`: the target against Kafka itself, not only against the ledger.

The committed ranges (all, those of batches since one, or of a sample of batches) are read again by the
pipeline's own process step into a staging table, as a replay's would be, and never committed: the
batch is abandoned once compared. SQL then checks that every good record is in the target with its values
(append: by coordinates; upsert, per key: the row at its coordinates holds that record, and every key's
row is its last change delivered, or absent where that change is a delete), every bad record in
ledger.quarantine with the same raw bytes, and nothing of the ranges in the target or the quarantine that
Kafka does not hold. Aggregate: the standing batches (those no later replay superseded)
are read again whole, and the groups their records make must be their contributions, merged by key
(`verify` checks the target against the contributions). Offsets Kafka no longer holds, or deletes while
they are read, are reported as not checkable, never as passed. Ranges of a partition that do not touch
are read in reads of their own (model/deep_reads.py). Spark streams the ranges, so memory does not grow
with them. History that was compacted, or whose bad records were purged, is no longer held record by record:
`verify` proves it by tiling and counts, and --deep reads the batches after it (`DeepReport.detailed_from`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

from sqlalchemy import text
from sqlalchemy.engine import Engine

from ledgerbatch.commit.modes.aggregate import contributions_table, measures_merged, measures_differ
from ledgerbatch.commit.modes.base import prefixed, target_names
from ledgerbatch.commit.modes.upsert import deletes_table, match_key
from ledgerbatch.errors import DataLossError, LedgerbatchError
from ledgerbatch.identifiers import quote_ident
from ledgerbatch.ledger.batches import get_batch, mark_abandoned
from ledgerbatch.ledger.compaction import detailed_from
from ledgerbatch.ledger.sql import run
from ledgerbatch.model.deep_reads import held, layers, merged, read_of
from ledgerbatch.model.ranges import OffsetRange, range_arrays
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.plan.replay import plan_reread
from ledgerbatch.source import kafka
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.sqlfiles import Fragment, query
from ledgerbatch.stage.process import process_batch
from ledgerbatch.stage.tables import StagingTables, drop_finished_staging

log = logging.getLogger(__name__)
_COMPARE = {"append": "deep_append", "upsert": "deep_upsert", "aggregate": "deep_aggregate"}


@dataclass
class DeepReport:
    records: int = 0  # offsets read again and compared
    ranges: list[OffsetRange] = field(default_factory=list)
    not_checkable: list[OffsetRange] = field(default_factory=list)  # no longer in Kafka
    problems: list[str] = field(default_factory=list)
    detailed_from: int = 0  # batches before this id were compacted or had bad records purged: not read


def deep_verify(engine: Engine, spec: PipelineSpec, db_url: str, bootstrap_servers: str, spark_factory,
                since: int = 0, sample: float = 1.0) -> DeepReport:
    if not 0 < sample <= 1:
        raise LedgerbatchError(f"--sample must be a fraction above 0 and at most 1, got {sample}")
    with engine.connect() as conn:
        detailed = detailed_from(conn, spec.name)
    chosen = chosen_ranges(engine, spec, max(since, detailed), sample)
    topics = tuple(sorted({r.topic for _, r in chosen})) or spec.topics
    watermarks = partial(kafka.watermarks, bootstrap_servers, topics, dict(spec.kafka_options))
    report = DeepReport(detailed_from=detailed)
    entries, lost = held(chosen, watermarks())
    for layer in layers(entries):
        while layer:
            ranges, batches = read_of(layer)
            batch = plan_reread(engine, spec, ranges)
            span = sum(r.span for r in ranges)
            log.info("%s: verify --deep reads %d offsets in %d ranges again (batch %d, never committed)", spec.name,
                     span, len(ranges), batch.batch_id)
            try:
                try:
                    process_batch(spark_factory(), engine, spec, batch.batch_id, db_url, bootstrap_servers)
                except DataLossError:
                    # Retention deleted offsets while they were read: those are not checkable, the rest is read again.
                    with engine.begin() as conn:
                        mark_abandoned(conn, batch.batch_id,
                                       "verify --deep: Kafka deleted offsets of its ranges while it read")
                    layer, gone = held(layer, watermarks())
                    if not gone:  # Kafka still holds every offset the read lost: not retention
                        raise
                    log.warning("%s: Kafka deleted offsets while verify --deep read them: %s not checkable",
                                spec.name, ", ".join(map(str, gone)))
                    lost += gone
                    continue
                report.problems += compare(engine, spec, batch.batch_id, ranges, batches)
            except BaseException as exc:  # Ctrl-C, Spark that does not start, a lost connection...
                _abandon_on_the_way_out(engine, spec, batch.batch_id, exc)
                raise
            report.ranges += ranges
            report.records += span
            break
    report.ranges, report.not_checkable = merged(sorted(report.ranges)), merged(sorted(lost))
    drop_finished_staging(engine, spec.name)
    return report


def _abandon_on_the_way_out(engine: Engine, spec: PipelineSpec, batch_id: int, exc: BaseException) -> None:
    """verify --deep stopped before it compared (and abandoned) its batch: abandon it now, as nobody will
    finish it (compaction folds only up to the first unfinished batch). If the ledger cannot be reached, the
    upkeep abandons it later (ops/abandon.py: abandon_stranded)."""
    why = f"verify --deep stopped before it compared: {type(exc).__name__}" + (f": {exc}" if str(exc) else "")
    try:
        with engine.begin() as conn:
            mark_abandoned(conn, batch_id, why[:4000])
        drop_finished_staging(engine, spec.name)
    except Exception as failure:  # noqa: BLE001 - the error that stopped verify --deep is the one to raise
        log.warning("%s: verify --deep could not abandon its batch %d on the way out (%s); the upkeep abandons it "
                    "once it is older than history.compact_after, or `ledgerbatch abandon` does", spec.name, batch_id,
                    failure)
    else:
        log.warning("%s: verify --deep stopped (%s); abandoned its batch %d", spec.name, type(exc).__name__, batch_id)


def chosen_ranges(engine: Engine, spec: PipelineSpec, since: int = 0,
                  sample: float = 1.0) -> list[tuple[int | None, OffsetRange]]:
    """The committed ranges to read again: (None, range) delivered by live and backfill batches; for an
    aggregate (batch id, range) of its standing batches, whole."""
    params = {"pipeline": spec.name, "since": since, "sample": sample}
    with engine.connect() as conn:
        if spec.mode == "aggregate":  # whole standing batches: a contribution is a batch's groups
            return [(r.batch_id, OffsetRange(r.topic, r.partition, r.from_offset, r.until_offset))
                    for r in run(conn, "standing_batches", params)]
        return [(None, OffsetRange(r.topic, r.partition, r.from_offset, r.until_offset))
                for r in run(conn, "delivered_ranges", params)]


def compare(engine: Engine, spec: PipelineSpec, batch_id: int, ranges: list[OffsetRange],
            batches: list[int]) -> list[str]:
    """The records of `ranges` as staged again by the (never committed) batch `batch_id` against the target
    and the quarantine; `batches`: an aggregate's standing batches they make. Abandons the batch; returns
    each kind of problem with its count and examples."""
    problems = []
    with engine.begin() as conn:
        batch = get_batch(conn, batch_id, for_update=True)
        names = _names(spec, BatchShape.recorded(spec, batch.output_schema), StagingTables(batch.staging_table))
        params = {"pipeline": spec.name, "batches": batches, **range_arrays(ranges)}
        for name in (_COMPARE[spec.mode], "deep_quarantine"):
            for row in conn.execute(text(query(name, **names)), params):
                problems.append(f"{row.problem}: {row.records}, e.g. {', '.join(row.examples)}")
        mark_abandoned(conn, batch_id, f"verify --deep: {len(problems)} kinds of problem")
    return problems


def _names(spec: PipelineSpec, shape: BatchShape, staging: StagingTables) -> dict:
    columns = shape.names
    key = list(spec.key)
    deleted = "false"
    if spec.changes:  # the key's delete (ledger_deletes keeps its last one) is no older than the change
        deleted = (f"EXISTS (SELECT 1 FROM ledger_deletes.{quote_ident(deletes_table(spec))} d "
                   f"WHERE {match_key('d', key)} AND NOT ({_before('d', 'c', spec.version_by)}))")
    aggregates = dict(key=key, contributions=contributions_table(spec), measures_agg=measures_merged(spec),
                      differs=measures_differ(spec)) if spec.mode == "aggregate" else {}
    return dict(staging=staging.name, bad=staging.bad, columns_t=prefixed("t", columns),
                columns_s=prefixed("s", columns), key_c=prefixed("c", key),
                match_t=match_key("t", key),
                changes=Fragment("s._change <> 's'" if spec.changes else "true"),
                upserts=Fragment("s._change = 'u'" if spec.changes else "true"),
                upserts_c=Fragment("c._change = 'u'" if spec.changes else "true"),
                deleted=Fragment(deleted), older=Fragment(_before("t", "c", spec.version_by)),
                **aggregates, **target_names(spec))


def _before(x: str, c: str, version: str | None) -> str:
    """SQL: the change `x` is older than the change `c`, in the order the target mode applies them. With
    target.version by version (none is oldest), ties by coordinates; else by offset within a partition
    (Kafka orders nothing across partitions, so changes of a key in two partitions are not compared)."""
    if not version:
        return f"{x}._topic = {c}._topic AND {x}._partition = {c}._partition AND {x}._offset < {c}._offset"
    v = quote_ident(version)
    return (f"CASE WHEN {x}.{v} IS NULL OR {c}.{v} IS NULL "
            f"THEN ROW({x}.{v} IS NOT NULL, {x}._offset, {x}._partition, {x}._topic) "
            f"< ROW({c}.{v} IS NOT NULL, {c}._offset, {c}._partition, {c}._topic) "
            f"ELSE ROW({x}.{v}, {x}._offset, {x}._partition, {x}._topic) "
            f"< ROW({c}.{v}, {c}._offset, {c}._partition, {c}._topic) END")

"""Planning a backfill or replay: explicit ranges re-read without ever moving the live cursors.

A range that committed batches already delivered is a *replay*: its target rows (and quarantined
records) are replaced in one transaction. A range entirely before the pipeline's start offset that
nothing delivered yet is a *backfill*. Anything else (offsets the live pipeline has not reached) is
refused: delivering it outside the cursors would duplicate it later. The diff of a staged replay is
commit/diff.py; running one end to end, ops/run.py.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from ledgerbatch.errors import ConfigError, LedgerbatchError
from ledgerbatch.ledger.batches import delivering_batches, get_batch, insert_batch, lock_pipeline
from ledgerbatch.ledger.cursors import range_kind
from ledgerbatch.model.batch import Batch, BatchKind
from ledgerbatch.model.ranges import OffsetRange, widen
from ledgerbatch.model.times import epoch_ms
from ledgerbatch.source import kafka
from ledgerbatch.spec.pipeline import PipelineSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayRequest:
    topic: str
    partitions: tuple[int, ...] | None  # None: every partition of the topic
    from_offset: int | None = None
    until_offset: int | None = None
    from_time_ms: int | None = None  # resolved to offsets by the broker, where it supports it
    until_time_ms: int | None = None

    def __post_init__(self):
        by_offset = self.from_offset is not None or self.until_offset is not None
        by_time = self.from_time_ms is not None or self.until_time_ms is not None
        if by_offset == by_time:
            raise LedgerbatchError("give either from/until offsets or a from/until time window, not both or neither")
        if by_offset and (self.from_offset is None or self.until_offset is None or not 0 <= self.from_offset < self.until_offset):
            raise LedgerbatchError(f"offsets must satisfy 0 <= from < until, got [{self.from_offset}, {self.until_offset})")
        if by_time and (self.from_time_ms is None or self.until_time_ms is None or self.from_time_ms >= self.until_time_ms):
            raise LedgerbatchError("the time window needs from < until")


def resolve_ranges(spec: PipelineSpec, bootstrap_servers: str, request: ReplayRequest) -> list[OffsetRange]:
    if request.topic not in spec.topics:
        raise LedgerbatchError(f"topic {request.topic!r} is not a source of pipeline {spec.name} ({', '.join(spec.topics)})")
    ends = kafka.watermarks(bootstrap_servers, (request.topic,), dict(spec.kafka_options))
    partitions = request.partitions if request.partitions is not None else tuple(p for _, p in sorted(ends))
    unknown = sorted(set(partitions) - {p for _, p in ends})
    if unknown:
        raise LedgerbatchError(f"topic {request.topic} has no partition(s) {unknown}")
    if request.from_offset is not None:
        bounds = {p: (request.from_offset, request.until_offset) for p in partitions}
    else:
        bounds = _offsets_for_times(spec, bootstrap_servers, request, partitions, ends)
    out = []
    for p in partitions:
        low, high = ends[(request.topic, p)].low, ends[(request.topic, p)].high
        start, until = bounds[p]
        if until > high:
            raise LedgerbatchError(f"{request.topic}[{p}]: until {until} is past the log end {high}")
        if start < low:
            raise LedgerbatchError(f"{request.topic}[{p}]: offsets before {low} are no longer in Kafka (asked from {start})")
        if start < until:
            out.append(OffsetRange(request.topic, p, start, until))
    if not out:
        raise LedgerbatchError("the requested window holds no offsets")
    return out


def _offsets_for_times(spec, bootstrap_servers, request, partitions, ends) -> dict[int, tuple[int, int]]:
    chosen = {(request.topic, p): ends[(request.topic, p)] for p in partitions}
    options = dict(spec.kafka_options)
    lows = kafka.offsets_at(bootstrap_servers, chosen, request.from_time_ms, options)
    highs = kafka.offsets_at(bootstrap_servers, chosen, request.until_time_ms, options)
    out = {p: (lows[(request.topic, p)], highs[(request.topic, p)]) for p in partitions}
    if all(lo == hi == ends[(request.topic, p)].high for p, (lo, hi) in out.items()):
        raise ConfigError("the broker resolved no offsets for that time window (it may not support timestamp "
                          "look-ups, as librdkafka's mock cluster does not); give offsets instead")
    return out


def plan_replay(engine: Engine, spec: PipelineSpec, ranges: list[OffsetRange]) -> Batch:
    """Record a replay or backfill batch of `ranges` (all of one kind)."""
    with engine.begin() as conn:
        lock_pipeline(conn, spec.name)
        if spec.mode == "aggregate":
            ranges = _whole_batches(conn, spec, ranges)
        kinds = {r: range_kind(conn, spec.name, r) for r in ranges}
        if len(set(kinds.values())) != 1:
            raise LedgerbatchError("the ranges mix replay and backfill: request them separately "
                                   + "; ".join(f"{r}: {k}" for r, k in kinds.items()))
        kind = next(iter(kinds.values()))
        batch_id = insert_batch(conn, spec.name, kind, ranges)
        batch = get_batch(conn, batch_id)
    log.info("planned %s batch %d: %s", kind, batch_id, ", ".join(map(str, ranges)))
    return batch


def plan_reread(engine: Engine, spec: PipelineSpec, ranges: list[OffsetRange]) -> Batch:
    """Record a batch that reads committed `ranges` again for `verify --deep`, which compares and abandons it.
    Not classified: the replay horizon refuses replays of offsets before it, yet their batches may still stand
    (a backfill after an open batch that compaction stopped at) and are read again as any. The commit
    classifies its ranges again (commit/transaction.py): one left behind by a killed `verify --deep` is refused
    there below the horizon, and above it is an ordinary replay of delivered offsets; nothing commits it
    unless asked to by its id, and where history.compact_after is set the upkeep abandons it
    (ops/abandon.py: abandon_stranded)."""
    with engine.begin() as conn:
        lock_pipeline(conn, spec.name)
        batch_id = insert_batch(conn, spec.name, BatchKind.REPLAY, ranges)
        return get_batch(conn, batch_id)


def _whole_batches(conn, spec: PipelineSpec, ranges: list[OffsetRange]) -> list[OffsetRange]:
    """An aggregate replay re-delivers whole batches (commit/modes/aggregate.py takes out a batch's contribution
    as a whole): the ranges grow until they hold every batch that delivered any of their offsets."""
    while True:
        delivering = delivering_batches(conn, spec.name, ranges)
        wider = widen(ranges, [r for batch in delivering.values() for r in batch])
        if wider == ranges:
            return ranges
        log.info("aggregate replay: widened to whole batches %s: %s", sorted(delivering), ", ".join(map(str, wider)))
        ranges = wider


def request_from_params(spec: PipelineSpec, params: dict) -> ReplayRequest:
    """The backfill DAG's Params form as a request (empty topic: the pipeline's only topic)."""
    topic = params.get("topic") or (spec.topics[0] if len(spec.topics) == 1 else None)
    if topic is None:
        raise LedgerbatchError(f"pipeline {spec.name} reads several topics: choose one ({', '.join(spec.topics)})")
    partitions = params.get("partitions") or None
    return ReplayRequest(
        topic=topic,
        partitions=tuple(int(p) for p in partitions) if partitions else None,
        from_offset=params.get("from_offset"),
        until_offset=params.get("until_offset"),
        from_time_ms=epoch_ms(params.get("from_time")),
        until_time_ms=epoch_ms(params.get("until_time")),
    )

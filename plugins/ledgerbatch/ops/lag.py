"""How far behind a pipeline is, per partition: in offsets (Kafka's end minus the ledger's cursor) and in
seconds, from the Kafka timestamps of the oldest record not yet delivered and the newest delivered."""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Engine

from ledgerbatch.ledger.cursors import get_cursors
from ledgerbatch.source import kafka
from ledgerbatch.spec.pipeline import PipelineSpec


@dataclass(frozen=True)
class PartitionLag:
    pipeline: str
    topic: str
    partition: int
    offsets: int  # read_committed end offset minus the cursor
    oldest_undelivered_ms: int | None  # Kafka timestamp of the record at the cursor; None when caught up
    newest_delivered_ms: int | None  # of the last record before the cursor; None when unknown

    def oldest_undelivered_age(self, now: float) -> float | None:
        """Seconds the oldest undelivered record has waited: 0 when caught up, None when not known."""
        if self.offsets == 0:
            return 0.0
        return None if self.oldest_undelivered_ms is None else max(0.0, now - self.oldest_undelivered_ms / 1000)

    def newest_delivered_age(self, now: float) -> float | None:
        return None if self.newest_delivered_ms is None else max(0.0, now - self.newest_delivered_ms / 1000)


def pipeline_lag(engine: Engine, spec: PipelineSpec, bootstrap_servers: str) -> list[PartitionLag]:
    """Every partition that has a cursor in the ledger (a pipeline that never planned has none)."""
    options = dict(spec.kafka_options)
    ends = kafka.watermarks(bootstrap_servers, spec.topics, options)
    with engine.connect() as conn:
        cursors = {tp: pos for tp, pos in get_cursors(conn, spec.name, spec.topics).items() if tp in ends}
    stamps = kafka.timestamps_around(bootstrap_servers, cursors, ends, options)
    return [PartitionLag(spec.name, tp[0], tp[1], max(0, ends[tp].high - pos), *stamps[tp])
            for tp, pos in sorted(cursors.items())]

"""A run's hook that measures its lag for the metrics (ops/metrics.py: record_lag): every LAG_EVERY_S
between batches, since each look reads Kafka, and once more when the run ends."""
from __future__ import annotations

import time

from sqlalchemy.engine import Engine

from ledgerbatch.ops.hooks import RunHook
from ledgerbatch.ops.metrics import record_lag
from ledgerbatch.ops.outages import waitable
from ledgerbatch.spec.pipeline import PipelineSpec

LAG_EVERY_S = 5.0


class LagSampler(RunHook):
    """`following`: a follower's last look may meet an outage it would have waited out; it then changes
    nothing (the lag only feeds the metrics)."""

    def __init__(self, engine: Engine, spec: PipelineSpec, bootstrap_servers: str, following: bool):
        self.engine, self.spec, self.bootstrap_servers, self.following = engine, spec, bootstrap_servers, following
        self.at = float("-inf")

    def between_batches(self) -> None:
        if time.monotonic() - self.at >= LAG_EVERY_S:
            record_lag(self.engine, self.spec, self.bootstrap_servers)
            self.at = time.monotonic()

    def finished(self) -> None:
        try:
            record_lag(self.engine, self.spec, self.bootstrap_servers)
        except Exception as exc:
            if not self.following or waitable(exc) is None:
                raise

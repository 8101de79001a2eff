"""One structured log line per batch phase, and the same numbers as metrics.

The line's format is fixed (benchmarks and log pipelines parse it): on logger `ledgerbatch.events`,
at INFO, the message is `"phase " + json.dumps(obj, sort_keys=True)`. Metrics go through OpenTelemetry
(ops/metrics.py), the same path from the CLI and from Airflow.
"""
from __future__ import annotations

import json
import logging

from ledgerbatch.model.batch import Batch
from ledgerbatch.ops.metrics import metrics

log = logging.getLogger("ledgerbatch.events")
PHASES = ("plan", "process", "commit")


def phase_event(phase: str, batch: Batch, seconds: float, rows_written: int | None = None,
                rows_quarantined: int | None = None, committed_now: bool = False, rows_rejected: int = 0,
                in_airflow: bool = False) -> dict:
    """Log one phase of `batch` and record its metrics. Counts default to the batch's (None until staged);
    delivery counters move only when this call committed the batch, so retries never count twice."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}")
    obj = {
        "event": "phase", "phase": phase, "pipeline": batch.pipeline, "batch_id": batch.batch_id,
        "attempt": batch.attempt, "seconds": round(float(seconds), 3), "ranges": len(batch.ranges),
        "records_read": batch.records_read,
        "rows_written": batch.rows_written if rows_written is None else rows_written,
        "rows_quarantined": batch.rows_quarantined if rows_quarantined is None else rows_quarantined,
    }
    log.info("phase " + json.dumps(obj, sort_keys=True))
    m = metrics(in_airflow)
    m.phase(phase, batch, seconds, committed_now, int(obj["rows_written"] or 0), int(obj["rows_quarantined"] or 0),
            rows_rejected)
    if in_airflow:  # a task's process may end right after its phase: export now
        m.flush()
    return obj

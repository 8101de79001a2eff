"""One structured log line per batch phase, and the same numbers as metrics.

The line's format is fixed (benchmarks and log pipelines parse it): on logger `ledgerbatch.events`,
at INFO, the message is `"phase " + json.dumps(obj, sort_keys=True)`. Metrics go to StatsD:
from the CLI when LEDGERBATCH_STATSD=host:port is set; inside Airflow through Airflow's own
`Stats`, so they follow the deployment's [metrics] settings (StatsD or OpenTelemetry).
"""
from __future__ import annotations

import json
import logging
import os
import socket

from ledgerbatch.errors import ConfigError
from ledgerbatch.model.batch import Batch

log = logging.getLogger("ledgerbatch.events")
PHASES = ("plan", "process", "commit")
PREFIX = "ledgerbatch"


class StatsdClient:
    """The StatsD line protocol over UDP: fire and forget, a metric never fails a batch."""

    def __init__(self, address: str, prefix: str = PREFIX):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"LEDGERBATCH_STATSD must be HOST:PORT, got {address!r}")
        self.target, self.prefix = (host, int(port)), prefix
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def _send(self, line: str) -> None:
        try:
            self.sock.sendto(f"{self.prefix}.{line}".encode(), self.target)
        except OSError:
            pass

    def timing(self, stat: str, ms: float) -> None:
        self._send(f"{stat}:{ms:.3f}|ms")

    def incr(self, stat: str, count: int = 1) -> None:
        self._send(f"{stat}:{count}|c")


_env_client: tuple[str, StatsdClient | None] | None = None


def env_stats() -> StatsdClient | None:
    """The client for LEDGERBATCH_STATSD, built once per address; None when unset."""
    global _env_client
    address = os.environ.get("LEDGERBATCH_STATSD", "")
    if _env_client is None or _env_client[0] != address:
        _env_client = (address, StatsdClient(address) if address else None)
    return _env_client[1]


def phase_event(phase: str, batch: Batch, seconds: float, rows_written: int | None = None,
                rows_quarantined: int | None = None, committed_now: bool = False, stats=None) -> dict:
    """Log one phase of `batch` and send its metrics. Counts default to the batch's (None until staged).

    `stats` is anything with StatsD's `timing(stat, ms)` and `incr(stat, count)` (Airflow's Stats is);
    delivery counters move only when this call committed the batch, so retries never count twice.
    """
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
    stats = stats if stats is not None else env_stats()
    if stats is not None:
        stem = f"{batch.pipeline}.{phase}"
        stats.timing(f"{stem}.duration", seconds * 1000.0)
        if committed_now:
            stats.incr(f"{batch.pipeline}.batches_committed")
            for key in ("records_read", "rows_written", "rows_quarantined"):
                stats.incr(f"{batch.pipeline}.{key}", int(obj[key] or 0))
    return obj

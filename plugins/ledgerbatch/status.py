"""`ledgerbatch status`: cursors, end offsets, lag and recent batches of each pipeline."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Engine

from . import kafka
from .errors import ConfigError
from .sqlfiles import query

NEAR_LOG_START = 0.1  # warn when the undelivered offsets sit in the oldest 10% of the retained log


def status_report(engine: Engine, pipeline: str, topics: tuple[str, ...], bootstrap_servers: str | None,
                  kafka_options: dict | None = None, recent: int = 5) -> str:
    lines = [f"pipeline {pipeline}"]
    ends, note = {}, ""
    if bootstrap_servers:
        try:
            ends = kafka.watermarks(bootstrap_servers, topics, kafka_options)
        except ConfigError as exc:
            note = f"  (end offsets unknown: {exc})"
    else:
        note = "  (end offsets unknown: KAFKA_BOOTSTRAP_SERVERS is not set)"
    with engine.connect() as conn:
        cursors = conn.execute(text(query("cursors_detail")), {"pipeline": pipeline}).all()
        batches = conn.execute(text(query("recent_batches")), {"pipeline": pipeline, "limit": recent}).all()
    total_lag = 0
    lines.append(f"  {'topic[partition]':<24} {'log start':>10} {'cursor':>12} {'end':>12} {'lag':>10}")
    for c in cursors:
        wm = ends.get((c.topic, c.partition))
        lag = wm.high - c.next_offset if wm else None
        total_lag += lag or 0
        flag = ""
        if wm and c.next_offset < wm.low:
            flag = "  LOST: cursor before the log start (see `ledgerbatch acknowledge-loss`)"
        elif wm and lag and c.next_offset - wm.low < NEAR_LOG_START * (wm.high - wm.low):
            flag = "  WARNING: cursor near the log start: retention may delete undelivered offsets"
        lines.append(f"  {c.topic + f'[{c.partition}]':<24} {wm.low if wm else '?':>10} {c.next_offset:>12} "
                     f"{wm.high if wm else '?':>12} {lag if lag is not None else '?':>10}{flag}")
    if not cursors:
        lines.append("  (no cursors yet: the pipeline has not run)")
    lines.append(f"  total lag: {total_lag if ends else '?'}{note}")
    lines.append("  recent batches:")
    for b in batches:
        error = f"  error: {b.error}" if b.error else ""
        lines.append(f"    #{b.batch_id} {b.kind} {b.status} attempt={b.attempt} read={b.records_read} "
                     f"written={b.rows_written} quarantined={b.rows_quarantined}{error}")
    if not batches:
        lines.append("    (none)")
    return "\n".join(lines)

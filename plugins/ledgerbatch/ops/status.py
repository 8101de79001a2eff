"""`ledgerbatch status`: per pipeline and partition the cursor, end offset, lag, log start, retention
headroom and last batch; the pipeline's last error, its upkeeps failing now (whichever process ran them:
ledger.upkeep_failures), where compaction stops and what the upkeep abandoned, and recent batches. As a table
or as JSON."""
from __future__ import annotations

from sqlalchemy.engine import Engine

from ledgerbatch.errors import ConfigError
from ledgerbatch.ledger.inspection import history, last_batch_error, partition_status, recent_batches
from ledgerbatch.ledger.pauses import current_pause
from ledgerbatch.ledger.sql import run
from ledgerbatch.source import kafka

NEAR_LOG_START = 0.1  # warn when the undelivered offsets sit in the oldest 10% of the retained log


def pipeline_status(engine: Engine, pipeline: str, topics: tuple[str, ...], bootstrap_servers: str | None,
                    kafka_options: dict | None = None, recent: int = 5) -> dict:
    """Everything `status` shows, as plain JSON-able values. End offsets come from Kafka when it answers,
    else from the ledger's observations at the last plan (`end_offsets_from` says which)."""
    live, note = {}, None
    if bootstrap_servers:
        try:
            live = kafka.watermarks(bootstrap_servers, topics, kafka_options)
        except ConfigError as exc:
            note = f"Kafka not asked: {exc}"
    else:
        note = "Kafka not asked: KAFKA_BOOTSTRAP_SERVERS is not set"
    with engine.connect() as conn:
        rows = partition_status(conn, pipeline)
        batches = recent_batches(conn, pipeline, recent)
        last_error = last_batch_error(conn, pipeline)
        pause = current_pause(conn, pipeline)
        folded = history(conn, pipeline)
        upkeep = run(conn, "status_upkeep_failures", {"pipeline": pipeline}).all()
        compaction = run(conn, "status_compaction_stops", {"pipeline": pipeline}).all()
    partitions = []
    for r in rows:
        wm = live.get((r.topic, r.partition))
        log_start, end = (wm.low, wm.high) if wm else (r.log_start, r.end_offset)
        partitions.append(_partition(r, log_start, end))
    observed = [r.observed_at for r in rows if r.observed_at is not None]
    known = [p["lag"] for p in partitions if p["lag"] is not None]
    return {
        "pipeline": pipeline,
        "paused": {"by": pause.by, "reason": pause.reason, "since": pause.since.isoformat()} if pause else None,
        "end_offsets_from": "kafka" if live else (f"last plan ({min(observed).isoformat()})" if observed else None),
        "note": note,
        "total_lag": sum(known) if partitions and len(known) == len(partitions) else None,
        "partitions": partitions,
        "last_error": dict(last_error._mapping) if last_error else None,
        "history": _history(folded) if folded else None,
        "upkeep_failures": [_upkeep_failure(u) for u in upkeep],
        "compaction_stops_at": next((_batch_named(b) for b in compaction if b.what == "stops at"), None),
        "abandoned_by_upkeep": [_batch_named(b) for b in compaction if b.what == "abandoned"],
        "recent_batches": [dict(b._mapping) for b in batches],
    }


def _history(row) -> dict:
    return {"batches_compacted": row.batches, "compacted_through_batch": row.through_batch_id,
            "compacted_at": row.compacted_at.isoformat() if row.batches else None,
            "deletes_forgotten": row.deletes_folded, "quarantine_purged": row.quarantine_purged,
            "purged_at": row.purged_at.isoformat() if row.purged_at else None, "replay_horizons": row.horizons}


def _upkeep_failure(row) -> dict:
    return {"upkeep": row.upkeep, "reason": row.reason, "sqlstate": row.sqlstate or None,
            "failures_in_a_row": row.failures, "first_failed_at": row.first_failed_at.isoformat(),
            "failed_at": row.failed_at.isoformat(), "age_s": row.age_s}


def _batch_named(row) -> dict:
    return {"batch_id": row.batch_id, "kind": row.kind, "status": row.status, "attempt": row.attempt,
            "age_s": row.age_s, "error": row.error}


def _partition(r, log_start: int | None, end: int | None) -> dict:
    cursor = r.next_offset
    lag = end - cursor if end is not None else None
    headroom = cursor - log_start if log_start is not None else None
    retained = end - log_start if end is not None and log_start is not None else 0
    flag = None
    if headroom is not None and headroom < 0:
        flag = "LOST: cursor before the log start (see `ledgerbatch acknowledge-loss`)"
    elif lag and retained and headroom < NEAR_LOG_START * retained:
        flag = "WARNING: cursor near the log start: retention may delete undelivered offsets"
    return {"topic": r.topic, "partition": r.partition, "log_start": log_start, "cursor": cursor,
            "end_offset": end, "lag": lag, "retention_headroom": headroom,
            "last_batch_id": r.last_batch_id, "last_batch_age_s": r.last_batch_age_s, "flag": flag}


def partition_table(status: dict) -> list[str]:
    """The per-partition lines of `status` (and `offsets`), then the total lag."""
    header = ("partition", "log start", "cursor", "end", "lag", "headroom", "last batch", "age")
    table, lines = [header], []
    for p in status["partitions"]:
        table.append((f"{p['topic']}[{p['partition']}]", _n(p["log_start"]), _n(p["cursor"]), _n(p["end_offset"]),
                      _n(p["lag"]), _n(p["retention_headroom"]),
                      f"#{p['last_batch_id']}" if p["last_batch_id"] else "-", _age(p["last_batch_age_s"])))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    flags = [None] + [p["flag"] for p in status["partitions"]]
    for row, flag in zip(table, flags):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  " + "  ".join(cells) + (f"  {flag}" if flag else ""))
    if not status["partitions"]:
        lines.append("  (no cursors yet: the pipeline has not run)")
    lines.append(f"  total lag: {_n(status['total_lag'])}")
    return lines


def render(status: dict) -> str:
    """The human-readable table of one pipeline's status."""
    source = status["end_offsets_from"] or "unknown"
    lines = [f"pipeline {status['pipeline']}  (end offsets from {source})"]
    if status["paused"]:
        p = status["paused"]
        lines.append(f"  PAUSED by {p['by']} since {p['since'][:19].replace('T', ' ')}: {p['reason']} (no new batch "
                     f"until `ledgerbatch resume {status['pipeline']} --by NAME`)")
    if status["note"]:
        lines.append(f"  ({status['note']})")
    lines += partition_table(status)
    err = status["last_error"]
    lines.append(f"  last error: batch #{err['batch_id']} ({err['kind']}, {err['status']}, {_age(err['age_s'])} ago): "
                 f"{err['error']}" if err else "  last error: none")
    if status["history"]:
        h = status["history"]
        lines.append(f"  history: {h['batches_compacted']} batches compacted"
                     + (f" (through #{h['compacted_through_batch']}, last {h['compacted_at'][:19].replace('T', ' ')})"
                        if h["compacted_at"] else "")
                     + (f", {h['deletes_forgotten']} deletes forgotten" if h["deletes_forgotten"] else "")
                     + f", {h['quarantine_purged']} quarantined records purged"
                     + (f"; replays start at or after {h['replay_horizons']}" if h["replay_horizons"] else ""))
    for u in status["upkeep_failures"]:
        lines.append(f"  UPKEEP FAILING: {u['upkeep']} gave way {u['failures_in_a_row']} time"
                     f"{'s' if u['failures_in_a_row'] > 1 else ''} in a row, the last {_age(u['age_s'])} ago "
                     f"({u['failed_at'][:19].replace('T', ' ')}): {u['reason']} (commits go on; tried again later)")
    if (b := status["compaction_stops_at"]) and b["kind"] != "live":  # a live batch: `run` resumes it
        lines.append(f"  compaction stops at {b['kind']} batch #{b['batch_id']} ({b['status']} at attempt "
                     f"{b['attempt']}, {_age(b['age_s'])} ago): nothing after it folds until it is committed or "
                     f"abandoned (the upkeep abandons it once older than history.compact_after and nobody holds it)")
    for b in status["abandoned_by_upkeep"]:
        lines.append(f"  abandoned by the upkeep: {b['kind']} batch #{b['batch_id']} "
                     f"(last worked on {_age(b['age_s'])} ago): "
                     f"compaction folds past it")
    lines.append("  recent batches:")
    for b in status["recent_batches"]:
        phases = "".join(f", {label} {b[key]:.1f}s" for label, key in
                         (("planned->staged", "planned_to_staged_s"), ("staged->committed", "staged_to_committed_s"))
                         if b[key] is not None)
        more = "".join(f" {label}={_n(b[key])}" for label, key in
                       (("deleted", "rows_deleted"), ("skipped", "records_skipped"), ("filtered", "records_filtered"),
                        ("rejected", "rows_rejected"), ("superseded", "records_superseded"))
                       if b.get(key))  # where a pipeline has them: changes, queries, refusals, versions
        lines.append(f"    #{b['batch_id']} {b['kind']} {b['status']} attempt={b['attempt']} read={_n(b['records_read'])} "
                     f"written={_n(b['rows_written'])}{more} quarantined={_n(b['rows_quarantined'])} "
                     f"({_age(b['age_s'])} ago{phases})")
    if not status["recent_batches"]:
        lines.append("    (none)")
    return "\n".join(lines)


def _n(value) -> str:
    return "?" if value is None else str(value)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"

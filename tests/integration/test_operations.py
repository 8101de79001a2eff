"""Operations: phase event lines and OpenTelemetry metrics (over OTLP) from `run`, end offsets recorded at plan time, the
inspection views, and `status` as a table and as JSON."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from .helpers import cli, end_offsets, order_value, produce
from .otlp import OtlpReceiver

pytestmark = pytest.mark.integration

EVENT_KEYS = {"event", "phase", "pipeline", "batch_id", "attempt", "seconds", "ranges", "records_read",
              "rows_written", "rows_quarantined"}


def phase_events(stderr: str) -> list[dict]:
    return [json.loads(line.split(" phase ", 1)[1]) for line in stderr.splitlines() if " INFO phase {" in line]


def test_run_logs_phases_exports_metrics_and_feeds_views_and_status(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=2, batch__max_records=30)
    records = [(i % 2, order_value(i)) for i in range(40)] + [(0, b"{not json"), (1, b'{"amount": "lots"}')]
    produce(broker.bootstrap_servers, p.topic, records)
    otlp = OtlpReceiver()
    try:
        done = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir, OTEL_EXPORTER_OTLP_ENDPOINT=otlp.endpoint)
    finally:
        otlp.close()
    assert done.returncode == 0, done.stderr[-2000:]

    events = phase_events(done.stderr)
    assert [(e["phase"], e["batch_id"]) for e in events] == [
        (phase, batch) for batch in sorted({e["batch_id"] for e in events}) for phase in ("plan", "process", "commit")]
    assert len(events) == 6 and all(set(e) == EVENT_KEYS and e["pipeline"] == p.name for e in events)
    plan, process, commit = events[:3]
    assert plan["records_read"] is None and plan["attempt"] == 0 and plan["ranges"] == 2
    assert process["attempt"] == commit["attempt"] == 1 and process["seconds"] > 0
    assert sum(e["records_read"] for e in events if e["phase"] == "commit") == 42
    assert sum(e["rows_quarantined"] for e in events if e["phase"] == "commit") == 2
    assert all(e["records_read"] == e["rows_written"] + e["rows_quarantined"] for e in events if e["phase"] == "commit")

    # The same numbers over OTLP, sent as the process exited
    mine = {"ledgerbatch__pipeline": p.name}
    assert sum(otlp.latest("ledgerbatch.rows.written", **mine).values()) == 40
    assert sum(otlp.latest("ledgerbatch.records.quarantined", **mine).values()) == 2
    assert sum(otlp.latest("ledgerbatch.batches.committed", **mine).values()) == 2
    consumed = otlp.latest("messaging.client.consumed.messages", **mine, messaging__system="kafka")
    assert sorted(consumed.values()) == [21, 21]  # per partition
    assert sum(otlp.latest("ledgerbatch.batch.phase.duration", **mine, ledgerbatch__phase="process").values()) == 2
    assert otlp.latest("ledgerbatch.lag.offsets", **mine).values() and all(
        v == 0 for v in otlp.latest("ledgerbatch.lag.offsets", **mine).values())
    assert {"service.name": "ledgerbatch"}.items() <= otlp.resources[-1].items()

    # Observations at plan time: the caught-up plan saw the end offsets the broker reports.
    ends = end_offsets(broker.bootstrap_servers, p.topic, 2)
    with engine.connect() as conn:
        lag = conn.execute(text("SELECT partition, end_offset, lag, retention_headroom, lost FROM ledger.partition_lag "
                                "WHERE pipeline = :p ORDER BY partition"), {"p": p.name}).all()
        assert [(r.partition, r.end_offset, r.lag, r.lost) for r in lag] == [(q, ends[q][1], 0, False) for q in (0, 1)]
        history = conn.execute(text("SELECT batch_id, status, ranges, offsets, records_read, planned_to_staged, "
                                    "staged_to_committed FROM ledger.recent_batches WHERE pipeline = :p "
                                    "ORDER BY batch_id"), {"p": p.name}).all()
        assert [(h.status, h.offsets) for h in history] == [("committed", 30), ("committed", 12)]
        assert all(h.planned_to_staged is not None and h.staged_to_committed is not None for h in history)
        summary = conn.execute(text("SELECT reason, records, sample FROM ledger.quarantine_summary WHERE pipeline = :p "
                                    "ORDER BY reason"), {"p": p.name}).all()
        assert [(s.reason, s.records) for s in summary] == [
            ("field amount: a string of … characters is not a decimal number", 1),
            ("value is not valid JSON: Expecting property name enclosed in double quotes at char …", 1)]
        assert summary[0].sample == "field amount: a string of 4 characters is not a decimal number"
        assert conn.execute(text("SELECT count(*) FROM ledger.invariant_violations WHERE pipeline = :p"),
                            {"p": p.name}).scalar_one() == 0

    produce(broker.bootstrap_servers, p.topic, [(0, order_value(100)), (0, order_value(101)), (1, order_value(102))])
    status = cli(["status", p.name, "--json"], db_url, broker.bootstrap_servers, p.dir)
    assert status.returncode == 0, status.stderr
    (report,) = json.loads(status.stdout)
    assert report["end_offsets_from"] == "kafka" and report["total_lag"] == 3 and report["last_error"] is None
    assert [(q["partition"], q["lag"], q["cursor"], q["end_offset"]) for q in report["partitions"]] == [
        (0, 2, ends[0][1], ends[0][1] + 2), (1, 1, ends[1][1], ends[1][1] + 1)]
    assert report["partitions"][0]["last_batch_id"] == history[-1].batch_id
    assert [b["records_read"] for b in report["recent_batches"]] == [12, 30]

    table = cli(["status", p.name], db_url, broker.bootstrap_servers, p.dir)
    header, row0 = table.stdout.splitlines()[1:3]
    assert header.split() == ["partition", "log", "start", "cursor", "end", "lag", "headroom", "last", "batch", "age"]
    assert row0.split()[:7] == [f"{p.topic}[0]", "0", str(ends[0][1]), str(ends[0][1] + 2), "2", str(ends[0][1]),
                                f"#{history[-1].batch_id}"]
    assert "total lag: 3" in table.stdout and "last error: none" in table.stdout

    # Without Kafka, status falls back to what the last plan observed (before the 3 new records).
    offline = cli(["status", p.name, "--json"], db_url, None, p.dir)
    (report,) = json.loads(offline.stdout)
    assert report["end_offsets_from"].startswith("last plan (") and report["total_lag"] == 0
    assert report["note"] == "Kafka not asked: KAFKA_BOOTSTRAP_SERVERS is not set"


def test_invariant_view_reports_what_verify_reports(engine, db_url, broker, make_pipeline):
    from ledgerbatch.ops.verify import verify

    p = make_pipeline(partitions=1)
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(5)])
    assert cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir).returncode == 0
    with engine.begin() as conn:  # a cursor that moved without a batch: offsets 5..7 would be skipped
        conn.execute(text("UPDATE ledger.cursors SET next_offset = next_offset + 2 WHERE pipeline = :p"), {"p": p.name})
    try:
        with engine.connect() as conn:
            view = conn.execute(text("SELECT invariant, problem FROM ledger.invariant_violations WHERE pipeline = :p"),
                                {"p": p.name}).all()
        assert [(v.invariant, v.problem) for v in view] == [
            ("tiling", f"{p.topic}[0]: cursor at 7 but committed ranges end at 5")]
        assert [v.problem for v in view] == verify(engine, p.spec)
    finally:
        with engine.begin() as conn:
            conn.execute(text("UPDATE ledger.cursors SET next_offset = next_offset - 2 WHERE pipeline = :p"),
                         {"p": p.name})


def test_status_shows_the_last_error(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=1, errors={"policy": "fail", "max_ratio": 0.0})
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(1)), (0, b"[1]")])
    failed = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert failed.returncode == 1 and "BatchFailedError" in failed.stderr
    assert [e["phase"] for e in phase_events(failed.stderr)] == ["plan"]  # no line for a phase that failed
    status = cli(["status", p.name], db_url, broker.bootstrap_servers, p.dir)
    line = next(line for line in status.stdout.splitlines() if "last error:" in line)
    assert line.startswith("  last error: batch #") and "(live, failed, " in line
    assert line.endswith("1 of 2 records are bad and errors.policy is fail")

import json
import logging

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from ledgerbatch.model.batch import Batch
from ledgerbatch.model.ranges import OffsetRange
from ledgerbatch.ops.events import phase_event
from ledgerbatch.ops.lag import PartitionLag
from ledgerbatch.ops.metrics import Metrics


def batch(**counts) -> Batch:
    return Batch(batch_id=7, pipeline="orders", kind="live", status="staged", attempt=2, staging_table="b7_a2",
                 records_read=counts.get("read"), rows_written=counts.get("written"),
                 rows_quarantined=counts.get("quarantined"), error=None,
                 ranges=(OffsetRange("orders", 0, 0, 10), OffsetRange("orders", 1, 5, 9)),
                 range_counts={("orders", 0): 6, ("orders", 1): 4})


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict, object]]]:
    """What the reader collected; not upkeep failures, which count for the whole process (ops/upkeep_failures.py:
    other tests in this process may have made some)."""
    out: dict[str, list] = {}
    data = reader.get_metrics_data()  # None when nothing is reported
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == "ledgerbatch.upkeep.failures":
                    continue
                out[m.name] = [(dict(p.attributes), getattr(p, "value", None) if hasattr(p, "value") else p.count)
                               for p in m.data.data_points]
    return out


def test_phase_line_is_the_fixed_format(caplog):
    with caplog.at_level(logging.INFO, logger="ledgerbatch.events"):
        obj = phase_event("plan", batch(), 0.25)
    (record,) = [r for r in caplog.records if r.name == "ledgerbatch.events"]
    assert record.levelno == logging.INFO and record.getMessage() == "phase " + json.dumps(obj, sort_keys=True)
    assert obj == {"event": "phase", "phase": "plan", "pipeline": "orders", "batch_id": 7, "attempt": 2,
                   "seconds": 0.25, "ranges": 2, "records_read": None, "rows_written": None, "rows_quarantined": None}


def test_a_commit_counts_per_pipeline_and_partition_with_otel_names():
    reader = InMemoryMetricReader()
    m = Metrics([reader])
    m.phase("commit", batch(read=10, written=9, quarantined=1), 1.5, committed_now=True, rows_written=9,
            rows_quarantined=1, rows_rejected=0)
    got = points(reader)
    orders = {"ledgerbatch.pipeline": "orders"}
    assert got["ledgerbatch.rows.written"] == [(orders, 9)]
    assert got["ledgerbatch.records.quarantined"] == [(orders, 1)]
    assert got["ledgerbatch.batches.committed"] == [({**orders, "ledgerbatch.batch.kind": "live"}, 1)]
    kafka = {**orders, "messaging.system": "kafka", "messaging.destination.name": "orders"}
    assert sorted(got["messaging.client.consumed.messages"], key=str) == [
        ({**kafka, "messaging.destination.partition.id": "0"}, 6), ({**kafka, "messaging.destination.partition.id": "1"}, 4)]
    assert got["ledgerbatch.batch.phase.duration"] == [({**orders, "ledgerbatch.phase": "commit"}, 1)]


def test_a_commit_that_was_a_no_op_counts_nothing_but_its_time():
    reader = InMemoryMetricReader()
    Metrics([reader]).phase("commit", batch(read=10, written=9, quarantined=1), 0.1, committed_now=False)
    assert set(points(reader)) == {"ledgerbatch.batch.phase.duration"}


def test_lag_gauges_in_offsets_and_seconds():
    reader = InMemoryMetricReader()
    m = Metrics([reader])
    import time
    now_ms = int(time.time() * 1000)
    m.lag("orders", [PartitionLag("orders", "orders", 0, 30, now_ms - 120_000, now_ms - 125_000),
                     PartitionLag("orders", "orders", 1, 0, None, now_ms - 5_000)])
    got = {name: {a["messaging.destination.partition.id"]: v for a, v in series}
           for name, series in points(reader).items()}
    assert got["ledgerbatch.lag.offsets"] == {"0": 30, "1": 0}
    assert 119 < got["ledgerbatch.lag.oldest_undelivered.age"]["0"] < 130
    assert got["ledgerbatch.lag.oldest_undelivered.age"]["1"] == 0  # caught up
    assert 4 < got["ledgerbatch.lag.newest_delivered.age"]["1"] < 15


def test_lag_gauges_follow_the_specs_that_run():
    """A measure replaces the pipeline's partitions (a topic taken out of its spec goes, also when none of its
    topics has a cursor yet); a pipeline removed from a service is forgotten; the others stay."""
    reader = InMemoryMetricReader()
    m = Metrics([reader])
    m.lag("orders", [PartitionLag("orders", "orders", 0, 3, None, None), PartitionLag("orders", "old", 0, 7, None, None)])
    m.lag("payments", [PartitionLag("payments", "payments", 0, 1, None, None)])
    m.lag("orders", [PartitionLag("orders", "orders", 0, 4, None, None)])

    def lags():
        return sorted((a["ledgerbatch.pipeline"], a["messaging.destination.name"], v)
                      for a, v in points(reader).get("ledgerbatch.lag.offsets", []))
    assert lags() == [("orders", "orders", 4), ("payments", "payments", 1)]
    m.lag("payments", [])
    assert lags() == [("orders", "orders", 4)]
    m.forget("orders")
    assert lags() == []


def test_errors_are_counted_by_type_and_still_raised():
    reader = InMemoryMetricReader()
    m = Metrics([reader])
    with pytest.raises(TimeoutError):
        with m.failures("orders", "process"):
            raise TimeoutError("the cluster did not answer")
    assert points(reader)["ledgerbatch.errors"] == [
        ({"ledgerbatch.pipeline": "orders", "ledgerbatch.phase": "process", "error.type": "TimeoutError"}, 1)]


def test_a_failing_metric_never_fails_the_batch(caplog):
    m = Metrics([InMemoryMetricReader()])

    def broken(*_):
        raise RuntimeError("exporter on fire")
    m.written.add = broken
    with caplog.at_level(logging.WARNING):
        m.phase("commit", batch(read=10, written=9, quarantined=1), 1.0, committed_now=True, rows_written=9)
    assert "metrics: phase not recorded: exporter on fire" in caplog.text

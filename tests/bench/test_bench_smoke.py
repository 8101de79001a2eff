"""The benchmark in its reduced form, end to end, so it cannot rot: every contender moves every record."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.transforms import expected_filtered_rows, expected_groups
from tests.conftest import REPO

pytestmark = pytest.mark.integration
RECORDS = 5_000  # small: the smoke proves the harness, not the figures (docs/benchmarks.md has those)


def test_bench_smoke_runs_every_contender_and_writes_the_report(tmp_path):
    out, docs = tmp_path / "results", tmp_path / "docs"
    done = subprocess.run([sys.executable, "-m", "bench.run", "--records", str(RECORDS), "--partitions", "4", "--runs", "1",
                           "--historic", "10,100", "--latency-repeats", "1", "--scaling-repeats", "1", "--sizes", "10000",
                           "--out", str(out), "--docs", str(docs)],
                          cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [result_file] = out.glob("*.json")
    r = json.loads(result_file.read_text())
    rows = {k: v["rows"] for k, v in r["contenders"].items()}
    assert rows == {"floor": RECORDS, "peer": RECORDS, "ledgerbatch_one": RECORDS, "ledgerbatch_warm": RECORDS,
                    "ledgerbatch_avro_warm": RECORDS, "ledgerbatch_several": RECORDS, "ledgerbatch_small_batch": RECORDS // 10,
                    "ledgerbatch_aggregate_warm": len(expected_groups(RECORDS)),
                    "ledgerbatch_filter_warm": expected_filtered_rows(RECORDS)}
    assert r["contenders"]["ledgerbatch_aggregate_warm"]["totals_equal"] is True
    assert r["contenders"]["ledgerbatch_filter_warm"]["filtered"] == RECORDS - expected_filtered_rows(RECORDS)
    assert r["contenders"]["ledgerbatch_warm"]["batches"] == r["contenders"]["ledgerbatch_avro_warm"]["batches"] == 1
    # Every staging task decodes, so fetches the one writer schema: the count is not empty, and at most one a task.
    [registry_run] = r["registry"]["runs"]
    assert registry_run["schema_id_requests"] > 0 and r["registry"]["per_id_per_task"] <= 1
    assert r["contenders"]["ledgerbatch_several"]["batches"] == 4
    assert all(v["wall_s"] > 0 and v["memory_mib"]["total"] > 0 for v in r["contenders"].values())
    assert r["latency"]["cold"]["median_s"] > 0 and r["latency"]["warm"]["median_s"] > 0
    assert [(s["mode"], s["historic_batches"]) for s in r["scaling"]] == [
        ("append", 10), ("append", 100), ("aggregate", 10), ("aggregate", 100)]
    assert all(s["plan_commit_s"] > 0 for s in r["scaling"])
    assert [(x["records"], x["totals_equal"]) for x in r["sizes"]] == [(10_000, True)]
    assert r["sizes"][0]["floor_s"] > 0 and r["sizes"][0]["aggregate_s"] > 0
    doc = (docs / "benchmarks.md").read_text()
    assert "| ledgerbatch, one batch (warm driver: `run --follow`) |" in doc and "python -m bench.run --records 5000" in doc
    assert "| ledgerbatch, one batch of Avro (warm driver: `run --follow`) |" in doc
    assert "| wall ledgerbatch Avro warm / JSON warm (one batch) |" in doc
    assert "| ledgerbatch, one batch into a per-minute aggregate (warm; rows: groups) |" in doc
    assert "| 10,000 (one run) |" in doc and "| aggregate time a record, largest size / this run's batch |" in doc
    assert (docs / "benchmarks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_copy_formats_stores_the_same_rows_both_ways():
    done = subprocess.run([sys.executable, "-m", "bench.copy_formats", "--rows", "5000", "--runs", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "both tables hold the same rows" in done.stdout and "binary: python" in done.stdout

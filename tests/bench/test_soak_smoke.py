"""The history soak (bench/soak.py) in its reduced form, so it cannot rot: two followers on real Kafka with
compaction, quarantine retention and the partition bound on, every record delivered once, history bounded."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration


def test_soak_smoke_keeps_history_bounded_and_delivers_exactly_once(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench.soak", "--batches", "60", "--window", "20", "--rate", "40",
                           "--base-records", "2000", "--compact-after", "8", "--sample-every", "3",
                           "--out", str(tmp_path), "--docs", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads((tmp_path / "soak.json").read_text())
    assert r["checks"]["ok"], r["checks"]
    assert r["checks"]["append_purged"] + r["checks"]["append_quarantined"] > 0  # poison went through retention
    late = r["samples"][-1]
    assert late["soak_append"]["batches"] >= 60 and late["soak_upsert"]["batches"] >= 60
    # The default bound, kept after every commit (one more only between a commit and its merge), but while a
    # rollup gives way (to a reader of the target waiting for its swap: the samples' queries) and rests 5 s;
    # then it merges back to the bound.
    partitions = [s["soak_append"]["partitions"] for s in r["samples"]]
    peak = partitions.index(max(partitions))
    assert max(partitions) <= 16 + 1 or r["rollups_gave_way"]["soak_append"] > 0, partitions
    assert peak == len(partitions) - 1 or min(partitions[peak:]) <= 16 + 1, partitions
    # Compaction after 8 s keeps the ledger to the batches of the last few seconds, not all of them.
    assert late["ledger_rows"] < 2 * 60 * 3
    assert all(s[name]["violations"] == 0 for s in r["samples"] for name in ("soak_append", "soak_upsert"))
    assert (tmp_path / "soak.png").stat().st_size > 0

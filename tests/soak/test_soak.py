"""Soak: a seeded random schedule of faults over many batches, ending with `verify` and an exact
comparison of what was produced with what was delivered and quarantined.

Short in CI (one round per fault kind); long by hand, e.g.:
    LEDGERBATCH_SOAK_ROUNDS=40 LEDGERBATCH_SOAK_SEED=7 scripts/test.sh tests/soak -s
"""
from __future__ import annotations

import collections
import os
import random
import signal
import time

import pytest
from sqlalchemy import text

from ledgerbatch.ops.verify import verify

from ..integration.helpers import assert_exactly_once, cli, order_value, produce
from ..integration.test_faults import _popen_run

pytestmark = pytest.mark.integration

FAULTS = ("none", "after_plan", "mid_read", "after_stage", "before_commit", "after_commit",
          "terminate_in_commit", "two_runners", "zombie")


def test_soak(engine, db_url, broker, make_pipeline):
    rounds = int(os.environ.get("LEDGERBATCH_SOAK_ROUNDS", str(len(FAULTS))))
    seed = int(os.environ.get("LEDGERBATCH_SOAK_SEED", "1"))
    rng = random.Random(seed)
    p = make_pipeline(partitions=4, batch__max_records=500)
    good, bad, injected = set(), set(), collections.Counter()
    started = time.monotonic()
    for i in range(rounds):
        n = rng.randint(100, 1500)
        records = [(rng.randrange(4), b"{oops" if rng.random() < 0.01 else order_value(i * 10_000 + j)) for j in range(n)]
        for partition, offset, value in produce(broker.bootstrap_servers, p.topic, records):
            (bad if value == b"{oops" else good).add((partition, offset))
        fault = FAULTS[i % len(FAULTS)] if i < len(FAULTS) else rng.choice(FAULTS)
        injected[fault] += 1
        batches = ["--max-batches", str(rng.randint(1, 3))]
        if fault in ("after_plan", "mid_read", "after_stage", "before_commit", "after_commit"):
            done = cli(["run", p.name, *batches], db_url, broker.bootstrap_servers, p.dir, LEDGERBATCH_CRASH_AT=fault)
            assert done.returncode in (0, -9), done.stderr[-2000:]
        elif fault == "terminate_in_commit":
            done = cli(["run", p.name, *batches], db_url, broker.bootstrap_servers, p.dir,
                       LEDGERBATCH_TERMINATE_AT="before_commit")
            assert done.returncode in (0, 1), done.stderr[-2000:]
        elif fault == "two_runners":
            runners = [_popen_run(p, db_url, broker) for _ in range(2)]
            for r in runners:
                _, err = r.communicate(timeout=600)
                assert r.returncode in (0, 1), err[-2000:]
        elif fault == "zombie":
            zombie = _popen_run(p, db_url, broker)
            time.sleep(rng.uniform(3, 10))
            os.killpg(zombie.pid, signal.SIGSTOP)
            try:
                done = cli(["run", p.name, *batches], db_url, broker.bootstrap_servers, p.dir)
                assert done.returncode == 0, done.stderr[-2000:]
            finally:
                os.killpg(zombie.pid, signal.SIGCONT)
            _, err = zombie.communicate(timeout=600)
            assert zombie.returncode in (0, 1), err[-2000:]
        else:
            done = cli(["run", p.name, *batches], db_url, broker.bootstrap_servers, p.dir)
            assert done.returncode == 0, done.stderr[-2000:]
        # Invariants hold after every round, faults or not; only staging clean-up may lag a crash.
        assert [v for v in verify(engine, p.spec) if "orphan staging table" not in v] == []
    final = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir, timeout=1200)
    assert final.returncode == 0, final.stderr[-2000:]
    assert_exactly_once(engine, p, broker.bootstrap_servers, good, bad)
    problems = verify(engine, p.spec)
    with engine.connect() as conn:
        batches = conn.execute(text("SELECT count(*) FROM ledger.batches WHERE pipeline = :p AND status = 'committed'"),
                               {"p": p.name}).scalar_one()
    print(f"\nsoak seed={seed} rounds={rounds}: {batches} committed batches, {len(good) + len(bad)} records "
          f"({len(bad)} bad), faults injected {dict(sorted(injected.items()))}, violations found {len(problems)}, "
          f"{time.monotonic() - started:.0f}s")
    assert problems == []

"""Versioned upserts end to end (`target.version`, commit/modes/versioned.py): Debezium change events of 500
keys whose versions (`source.lsn`) arrive shuffled over 8 partitions, with deletes, through `ledgerbatch run`
SIGKILLed at every crash point and a replay of an old range: the target holds every key's highest-version
change, deleted keys are absent, and every change is counted as written, deleted or superseded."""
from __future__ import annotations

import json
import random

import pytest
from sqlalchemy import text

from ledgerbatch.ops.verify import verify

from .helpers import cli, produce

pytestmark = pytest.mark.integration

CRASH_POINTS = ("after_plan", "mid_read", "after_stage", "before_commit", "after_commit")


def _changes(keys: int, n: int, seed: int) -> list[dict]:
    """n changes of `keys` keys, each with a distinct lsn; about one in eight deletes its key."""
    rng = random.Random(seed)
    out = []
    for lsn in range(1, n + 1):
        key = f"o-{rng.randrange(keys)}"
        op = "d" if rng.random() < 0.125 else rng.choice("cu")
        out.append({"key": key, "lsn": lsn, "op": op, "amount": f"{rng.randrange(1, 10**6) / 100:.2f}"})
    return out


def _event(change: dict) -> bytes:
    row = {"order_id": change["key"], "customer": "c", "amount": change["amount"], "ts": "2026-11-24T10:00:00Z"}
    return json.dumps({"op": change["op"], "before": {"order_id": change["key"]} if change["op"] == "d" else None,
                       "after": None if change["op"] == "d" else row,
                       "source": {"lsn": change["lsn"], "ts_ms": 1_700_000_000_000 + change["lsn"]},
                       "ts_ms": 1_700_000_000_000 + change["lsn"]}).encode()


def test_the_newest_version_of_every_key_wins_through_kills_and_a_replay(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=8, source__format="debezium", batch__max_records=2500,
                      target={"table": "", "mode": "upsert", "key": ["order_id"], "version": "source.lsn"})
    spec_file = p.dir / f"{p.name}.yaml"
    spec_file.write_text(spec_file.read_text().replace("table: ''", f"table: public.{p.table}"))
    changes = _changes(keys=500, n=20_000, seed=22)
    rng = random.Random(7)
    shuffled = rng.sample(changes, len(changes))  # any order, any partition: as after a re-partitioning
    produce(broker.bootstrap_servers, p.topic, [(rng.randrange(8), _event(c)) for c in shuffled])

    for point in CRASH_POINTS:  # each run is killed the first time it reaches the point
        crashed = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir, LEDGERBATCH_CRASH_AT=point)
        assert crashed.returncode == -9, crashed.stderr[-2000:]
    done = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert done.returncode == 0, done.stderr[-2000:]
    replayed = cli(["replay", p.name, "--from-offset", "0", "--until-offset", "400"], db_url,
                   broker.bootstrap_servers, p.dir)  # old changes of every partition, delivered again
    assert replayed.returncode == 0, replayed.stderr[-2000:]

    newest = {}
    for c in changes:  # in lsn order: the last one of a key is its newest
        newest[c["key"]] = c
    expected = {k: (c["amount"], c["lsn"]) for k, c in newest.items() if c["op"] != "d"}
    deleted = {k: c["lsn"] for k, c in newest.items() if c["op"] == "d"}
    assert len(expected) > 350 and len(deleted) > 30  # both kinds of outcome, plenty of each
    with engine.connect() as conn:
        rows = conn.execute(text(f'SELECT order_id, amount::text, _source_lsn FROM public."{p.table}"')).all()
        deletes = dict(conn.execute(text(f'SELECT order_id, _source_lsn FROM ledger_deletes."{p.name}"')).all())
        counts = conn.execute(text(
            "SELECT kind, sum(records_read) AS r, sum(rows_written) AS w, sum(rows_deleted) AS d, "
            "sum(records_superseded) AS s, sum(rows_quarantined) AS q FROM ledger.batches "
            "WHERE pipeline = :p AND status = 'committed' GROUP BY kind"), {"p": p.name}).all()
    assert {r.order_id: (r.amount, r._source_lsn) for r in rows} == expected
    assert deletes == deleted  # each deleted key with its newest delete's version
    live = next(c for c in counts if c.kind == "live")
    assert (live.r, live.q) == (20_000, 0) and live.w + live.d + live.s == 20_000
    assert live.w + live.d < 20_000 // 2  # most changes lose to a newer one: superseded, not applied
    replay = next(c for c in counts if c.kind == "replay")
    assert replay.r == 8 * 400 and replay.w + replay.d + replay.s == replay.r
    assert verify(engine, p.spec) == []

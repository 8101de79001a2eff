"""`ledgerbatch offsets` (ops/offsets.py) and `source.start: {time: ...}` against real Kafka: cursors moved
by time with a dry run first, each move a ledger row; skipped offsets are tiles `verify` accounts for and
are never delivered; a move back only over skipped offsets; refusals while a batch is open and over
delivered offsets; a new pipeline that starts at a time."""
from __future__ import annotations

import datetime as dt
import time

import pytest
from sqlalchemy import text

from ledgerbatch.ops.verify import verify

from .helpers import assert_exactly_once, cli, order_value, produce

pytestmark = pytest.mark.integration


def _moment() -> str:
    """A time between what was produced before and what is produced after (Kafka's timestamps are ms)."""
    time.sleep(1.1)
    at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
    time.sleep(1.1)
    return at


def _coordinates(acked) -> set[tuple[int, int]]:
    return {(a[0], a[1]) for a in acked}


def test_a_move_by_time_skips_records_the_ledger_explains(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=2)

    def ledgerbatch(*args: str):
        return cli(list(args), db_url, broker.bootstrap_servers, p.dir)

    delivered = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(30)])
    assert ledgerbatch("run", p.name).returncode == 0
    bad_deploy = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(30, 50)])
    at = _moment()
    after = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(50, 60)])

    move = ["offsets", p.name, "--set", "--to-time", at, "--by", "alice", "--reason", "INC-9: skip the bad deploy"]
    dry = ledgerbatch(*move, "--dry-run")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert dry.stdout.splitlines() == [f"{p.name}: dry run, nothing moved (to-time {at}):",
                                       f"  {p.topic}[0]: 15 -> 25, skips [15, 25) (10 offsets)",
                                       f"  {p.topic}[1]: 15 -> 25, skips [15, 25) (10 offsets)"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ledger.offset_moves WHERE pipeline = :p"), {"p": p.name}).scalar() == 0
    real = ledgerbatch(*move)
    assert real.returncode == 0 and real.stdout.splitlines()[1:] == dry.stdout.splitlines()[1:]
    with engine.connect() as conn:
        moves = conn.execute(text("SELECT topic, partition, from_offset, to_offset, moved_by, reason, request "
                                  "FROM ledger.offset_moves WHERE pipeline = :p ORDER BY move_id"), {"p": p.name}).all()
        skipped = conn.execute(text("SELECT partition, from_offset, until_offset, kind, acknowledged_by FROM "
                                    "ledger.lost_ranges WHERE pipeline = :p ORDER BY partition"), {"p": p.name}).all()
    assert [tuple(m) for m in moves] == [(p.topic, part, 15, 25, "alice", "INC-9: skip the bad deploy", f"to-time {at}")
                                         for part in (0, 1)]
    assert [tuple(s) for s in skipped] == [(part, 15, 25, "skipped", "alice") for part in (0, 1)]
    shown = ledgerbatch("offsets", p.name).stdout
    assert f"{p.topic}[0] 15 -> 25 (to-time {at}) by alice: INC-9: skip the bad deploy" in shown
    assert verify(engine, p.spec) == []  # the skipped offsets are tiles

    # Back over delivered offsets: refused, pointing to replay. Back over skipped ones (partition 0): allowed.
    over = ledgerbatch("offsets", p.name, "--set", "--to-offset", "10", "--partitions", "0", "--by", "a", "--reason", "r")
    assert over.returncode == 1 and (f"{p.topic}[0]: back from 25 to 10 would deliver 5 offsets of [10, 25) again, "
                                     f"which batches delivered (or were lost): re-deliver them with `ledgerbatch replay "
                                     f"{p.name} --topic {p.topic} --partitions 0 --from-offset 10 --until-offset 25`") in over.stderr
    back = ledgerbatch("offsets", p.name, "--set", "--to-offset", "15", "--partitions", "0", "--by", "bob",
                       "--reason", "partition 0 was fine after all")
    assert back.returncode == 0, back.stderr[-2000:]
    assert f"  {p.topic}[0]: 25 -> 15, back over [15, 25) (skipped before, delivered by the next run)" in back.stdout

    assert ledgerbatch("run", p.name).returncode == 0
    kept = [a for a in bad_deploy if a[0] == 0]
    assert_exactly_once(engine, p, broker.bootstrap_servers, _coordinates(delivered + kept + after), set())
    with engine.connect() as conn:
        assert [tuple(r) for r in conn.execute(text("SELECT partition, from_offset, until_offset FROM ledger.lost_ranges "
                                                    "WHERE pipeline = :p"), {"p": p.name})] == [(1, 15, 25)]
    assert verify(engine, p.spec) == []


def test_moves_are_refused_while_a_batch_is_open(db_url, broker, make_pipeline):
    p = make_pipeline(partitions=1)
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(10)])
    planned = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir, LEDGERBATCH_CRASH_AT="after_plan")
    assert planned.returncode == -9
    moved = cli(["offsets", p.name, "--set", "--to-latest", "--by", "alice", "--reason", "r"], db_url,
                broker.bootstrap_servers, p.dir)
    assert moved.returncode == 1 and "is open (planned) and its ranges start at the cursors: let it finish" in moved.stderr
    unsure = cli(["offsets", p.name, "--to-latest"], db_url, broker.bootstrap_servers, p.dir)
    assert unsure.returncode == 1 and "add --set" in unsure.stderr


def test_a_new_pipeline_starts_at_a_time(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=2)
    produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(20)])
    at = _moment()
    later = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(20, 32)])
    spec_file = p.dir / f"{p.name}.yaml"
    spec_file.write_text(spec_file.read_text().replace("topics:", f"start:\n    time: '{at}'\n  topics:"))
    assert p.spec.start == "time" and p.spec.start_time == at
    done = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_exactly_once(engine, p, broker.bootstrap_servers, _coordinates(later), set())
    with engine.connect() as conn:
        starts = conn.execute(text("SELECT partition, start_offset FROM ledger.cursors WHERE pipeline = :p "
                                   "ORDER BY partition"), {"p": p.name}).all()
    assert [tuple(s) for s in starts] == [(0, 10), (1, 10)]

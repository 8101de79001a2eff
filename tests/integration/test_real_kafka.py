"""On a real Apache Kafka (dev/kafka.py), what librdkafka's mock cluster cannot show: read_committed with
committed, aborted and still-open transactions while `ledgerbatch run` is SIGKILLed; timestamps resolved
to offsets for a replay; retention deleting offsets the pipeline has not delivered."""
from __future__ import annotations

import signal
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from sqlalchemy import text

from ledgerbatch.errors import DataLossError
from ledgerbatch.ops.run import run_pipeline

from .helpers import assert_exactly_once, cli, end_offsets, order_value, produce
from .test_faults import _popen_run

pytestmark = pytest.mark.integration


def run(engine, db_url, broker, spark, p):
    """`ledgerbatch run` in this process, on the session's warm Spark."""
    return run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark)


def delivered_order_ids(engine, p) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text(f'SELECT order_id FROM public."{p.table}"')).scalars())


def transaction(bootstrap: str, transactional_id: str, topic: str, records: list[tuple[int, int]]):
    """A transactional producer that has produced (partition, i) records and flushed them, its transaction
    still open: the caller commits, aborts or leaves it. Returns (producer, acked (partition, offset, value))."""
    # The broker aborts a transaction open longer than its timeout (librdkafka's default: 60 s); a test that
    # keeps one open across several runs on a slow machine needs the broker's maximum (15 min).
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "log_level": 3,
                         "transaction.timeout.ms": 900_000})
    acked = []
    producer.init_transactions(30)
    producer.begin_transaction()
    for partition, i in records:
        producer.produce(topic, order_value(i), key=str(i).encode(), partition=partition,
                         on_delivery=lambda err, msg: acked.append((msg.partition(), msg.offset(), msg.value())))
    assert producer.flush(30) == 0 and len(acked) == len(records)
    return producer, acked


def test_committed_aborted_and_open_transactions_through_sigkills(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=3, batch__max_records=40)
    bs = broker.bootstrap_servers
    good = {(a[0], a[1]) for a in produce(bs, p.topic, [(i % 3, order_value(i)) for i in range(30)])}
    good |= {(a[0], a[1]) for a in produce(bs, p.topic, [(i % 3, order_value(i)) for i in range(100, 160)],
                                           transactional_id=f"{p.name}-committed")}
    aborting, aborted = transaction(bs, f"{p.name}-aborted", p.topic, [(i % 3, i) for i in range(200, 230)])
    aborting.abort_transaction(30)
    still_open, opened = transaction(bs, f"{p.name}-open", p.topic, [(i % 2, i) for i in range(300, 320)])
    after = produce(bs, p.topic, [(i % 3, order_value(i)) for i in range(400, 430)])  # behind the open transaction
    lso = {part: min(o for q, o, _ in opened if q == part) for part in (0, 1)}

    kills = 0
    for point in ("mid_read", "after_stage", "before_commit"):
        crashed = cli(["run", p.name, "--max-batches", "1"], db_url, bs, p.dir, LEDGERBATCH_CRASH_AT=point)
        assert crashed.returncode == -9, crashed.stderr[-2000:]
        kills += 1
    done = cli(["run", p.name], db_url, bs, p.dir)
    assert done.returncode == 0, done.stderr[-2000:]
    with engine.connect() as conn:
        cursors = dict(conn.execute(text("SELECT partition, next_offset FROM ledger.cursors WHERE pipeline = :p"),
                                    {"p": p.name}).all())
    assert {0: cursors[0], 1: cursors[1]} == lso  # read_committed ends at the last stable offset
    readable = good | {(a[0], a[1]) for a in after if a[0] == 2}
    with engine.connect() as conn:
        assert {tuple(r) for r in conn.execute(text(f'SELECT _partition, _offset FROM public."{p.table}"'))} == readable

    still_open.commit_transaction(30)
    done = cli(["run", p.name], db_url, bs, p.dir)
    assert done.returncode == 0, done.stderr[-2000:]
    good |= {(a[0], a[1]) for a in opened} | {(a[0], a[1]) for a in after}
    assert_exactly_once(engine, p, bs, good, set())
    assert not delivered_order_ids(engine, p) & {f"o-{i}" for i in range(200, 230)}  # aborted: never delivered
    print(f"\ntransactions: {len(good)} committed records delivered once ({len(opened)} of them from a transaction "
          f"left open during {kills} SIGKILLed runs), {len(aborted)} aborted records never delivered")


def test_a_replay_by_time_resolves_timestamps_to_offsets(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1)
    base = (int(time.time()) - 120) * 1000  # whole seconds, within the topic's retention
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "log_level": 3})
    for i in range(30):
        producer.produce(p.topic, order_value(i), partition=0, timestamp=base + i * 1000)
    assert producer.flush(30) == 0
    run(engine, db_url, broker, spark, p)
    iso = lambda ms: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))  # noqa: E731
    replay = cli(["replay", p.name, "--from-time", iso(base + 10_000), "--until-time", iso(base + 20_000)],
                 db_url, broker.bootstrap_servers, p.dir)
    assert replay.returncode == 0, replay.stderr[-2000:]
    with engine.connect() as conn:
        assert conn.execute(text(
            "SELECT r.from_offset, r.until_offset FROM ledger.batch_ranges r JOIN ledger.batches b USING (batch_id) "
            "WHERE b.pipeline = :p AND b.kind = 'replay' AND b.status = 'committed'"), {"p": p.name}).all() == [(10, 20)]


def test_retention_deleting_undelivered_offsets_stops_the_pipeline_until_acknowledged(
        engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1, topic_config={"segment.ms": "100"})  # a new segment per round below
    bs = broker.bootstrap_servers
    first = produce(bs, p.topic, [(0, order_value(i)) for i in range(20)])
    run(engine, db_url, broker, spark, p)  # the cursor stands at 20
    retention(bs, p.topic, "1000")
    for start in range(20, 520, 100):
        produce(bs, p.topic, [(0, order_value(i)) for i in range(start, start + 100)])
        time.sleep(0.3)
    deadline = time.monotonic() + 60
    while end_offsets(bs, p.topic, 1)[0][0] <= 20:  # the broker deletes closed segments past retention
        assert time.monotonic() < deadline, "retention deleted nothing within 60s"
        time.sleep(0.5)
    retention(bs, p.topic, "-1")  # keep what is left from now on
    low, high = end_offsets(bs, p.topic, 1)[0]

    with pytest.raises(DataLossError, match=r"cursor 20 is before the log start"):
        run(engine, db_url, broker, spark, p)
    ack = cli(["acknowledge-loss", p.name, "--by", "alice", "--reason", "retention"], db_url, bs, p.dir)
    assert ack.returncode == 0, ack.stderr[-2000:]
    assert f"recorded lost {p.topic}[0] [20, {low}) ({low - 20} offsets), acknowledged by alice" in ack.stdout
    run(engine, db_url, broker, spark, p)
    with engine.connect() as conn:
        offsets = conn.execute(text(f'SELECT _offset FROM public."{p.table}" ORDER BY 1')).scalars().all()
    assert offsets == [a[1] for a in first] + list(range(low, high))  # nothing else is lost


def retention(bootstrap: str, topic: str, ms: str) -> None:
    """Set the topic's retention.ms (IncrementalAlterConfigs, Kafka 2.3+)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("retention.ms", ms, incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def test_a_zombie_transactional_producer_is_fenced_and_its_records_never_delivered(engine, db_url, broker, spark,
                                                                                     make_pipeline):
    from confluent_kafka import KafkaException

    p = make_pipeline(partitions=2)
    bs = broker.bootstrap_servers
    zombie, _ = transaction(bs, f"{p.name}-tx", p.topic, [(i % 2, i) for i in range(0, 10)])
    successor, acked = transaction(bs, f"{p.name}-tx", p.topic, [(i % 2, i) for i in range(100, 110)])  # fences it
    with pytest.raises(KafkaException, match="_FENCED|fenced|Fenced"):
        zombie.commit_transaction(30)
    successor.commit_transaction(30)
    run(engine, db_url, broker, spark, p)
    assert_exactly_once(engine, p, bs, {(a[0], a[1]) for a in acked}, set())
    assert delivered_order_ids(engine, p) == {f"o-{i}" for i in range(100, 110)}


def test_a_topic_that_gains_partitions_is_delivered_from_their_start(engine, db_url, broker, spark,
                                                                       make_pipeline):
    from confluent_kafka.admin import NewPartitions

    p = make_pipeline(partitions=2)
    bs = broker.bootstrap_servers
    good = {(a[0], a[1]) for a in produce(bs, p.topic, [(i % 2, order_value(i)) for i in range(20)])}
    run(engine, db_url, broker, spark, p)
    admin = AdminClient({"bootstrap.servers": bs})
    admin.create_partitions([NewPartitions(p.topic, 4)])[p.topic].result(30)
    p.partitions = 4
    good |= {(a[0], a[1]) for a in produce(bs, p.topic, [(i % 4, order_value(i)) for i in range(20, 60)])}
    run(engine, db_url, broker, spark, p)
    assert_exactly_once(engine, p, bs, good, set())
    with engine.connect() as conn:
        starts = dict(conn.execute(text("SELECT partition, start_offset FROM ledger.cursors WHERE pipeline = :p"),
                                   {"p": p.name}).all())
    assert starts == {0: 0, 1: 0, 2: 0, 3: 0}


def test_a_compacted_topic_has_gaps_inside_ranges_and_upserts_the_latest_value(engine, db_url, broker, spark,
                                                                                make_pipeline):
    p = make_pipeline(partitions=1, target__mode="upsert", target__key=["order_id"],
                            topic_config={"cleanup.policy": "compact", "segment.ms": "100",
                                          "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"})
    bs = broker.bootstrap_servers
    latest = {}
    for round_ in range(6):  # ten keys overwritten six times, one segment per round
        values = [order_value(k, amount=f"{round_}.00").replace(b'"o-', b'"k-') for k in range(10)]
        for a in produce(bs, p.topic, [(0, v) for v in values], keys=[b"k-%d" % k for k in range(10)]):
            latest[a[2]] = a[1]
        time.sleep(0.3)
    produce(bs, p.topic, [(0, order_value(999))], keys=[b"last"])  # a newer segment, so the others may be cleaned
    deadline = time.monotonic() + 90
    while _records_in(bs, p.topic) >= 61:  # the log cleaner leaves gaps in the offsets
        assert time.monotonic() < deadline, "the log cleaner compacted nothing within 90s"
        time.sleep(1)
    run(engine, db_url, broker, spark, p)
    with engine.connect() as conn:
        rows = dict(conn.execute(text(f'SELECT order_id, amount FROM public."{p.table}"')).all())
        ranges = conn.execute(text("SELECT from_offset, until_offset FROM ledger.batch_ranges WHERE pipeline = :p"),
                              {"p": p.name}).all()
    assert {k: str(v) for k, v in rows.items() if k.startswith("k-")} == {f"k-{k}": "5.00" for k in range(10)}
    low, high = end_offsets(bs, p.topic, 1)[0]
    assert ranges == [(low, high)]  # one range tiles the log although it holds fewer records than offsets
    from ledgerbatch.ops.verify import verify

    assert verify(engine, p.spec) == []


def _records_in(bootstrap: str, topic: str) -> int:
    """How many records partition 0 holds now (read to its end)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "count", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "log_level": 3})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
        consumer.assign([TopicPartition(topic, 0, low)])
        count = 0
        while True:
            messages = consumer.consume(100, timeout=2)
            count += len(messages)
            if not messages or messages[-1].offset() >= high - 1:
                return count
    finally:
        consumer.close()


def test_three_brokers_one_killed_mid_batch_and_restarted_nothing_lost_or_duplicated(engine, db_url, tmp_path):
    """Replication factor 3: the leader of a partition is SIGKILLed while `ledgerbatch run` reads the batch,
    and started again; the run (or the next) delivers every record once."""
    from ledgerbatch.dev.kafka import LocalKafka

    from ..conftest import Pipeline

    with LocalKafka(3) as cluster:
        p = Pipeline(tmp_path / "pipelines", cluster, 3, topic_config={"min.insync.replicas": "2"})
        good = {(a[0], a[1]) for a in produce(cluster.bootstrap_servers, p.topic,
                                              [(i % 3, order_value(i)) for i in range(3000)])}
        leader = AdminClient({"bootstrap.servers": cluster.bootstrap_servers}).list_topics(
            p.topic, timeout=10).topics[p.topic].partitions[0].leader
        runner = _popen_run(p, db_url, cluster)
        deadline = time.monotonic() + 120
        while not _attempt_running(engine, p.name):  # the batch is being read
            assert runner.poll() is None and time.monotonic() < deadline, runner.stderr.read()[-2000:]
            time.sleep(0.2)
        cluster.kill_broker(leader, signal.SIGKILL)
        time.sleep(3)
        cluster.start_broker(leader)
        _, err = runner.communicate(timeout=600)
        if runner.returncode != 0:  # the kill may fail the batch: the next run resumes it
            assert "DataLossError" not in err, err[-2000:]
            again = cli(["run", p.name], db_url, cluster.bootstrap_servers, p.dir)
            assert again.returncode == 0, again.stderr[-2000:]
        assert_exactly_once(engine, p, cluster.bootstrap_servers, good, set())
        print(f"\n3 brokers: broker {leader} (leader of partition 0) SIGKILLed mid-batch and restarted; the run "
              f"exited {runner.returncode}; {len(good)} records delivered once")


def _attempt_running(engine, pipeline: str) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(text("SELECT count(*) FROM ledger.batches WHERE pipeline = :p AND status = 'planned' "
                                      "AND attempt > 0"), {"p": pipeline}).scalar_one())

"""Event-driven pipelines (`schedule: on_new_data`): the DAG is scheduled on an Asset whose AssetWatcher runs
NewDataTrigger; the trigger fires when Kafka's end offsets pass the ledger's cursors and stays quiet when the
pipeline is caught up; the ledger decides what a run delivers, so two fires deliver every record once.
Against Apache Kafka, PostgreSQL and real spark-submit (dag.test())."""
from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from .helpers import assert_exactly_once, order_value, produce
from .test_airflow import airflow_db, build, connections, states  # noqa: F401  (fixtures)

pytestmark = pytest.mark.integration

QUIET_S = 3.0  # a trigger that has not fired after this many polls (0.2 s apart) is taken to stay quiet


def watched_trigger(dag):
    """The NewDataTrigger of the DAG's schedule, rebuilt from its serialized form (as the triggerer does),
    polling fast."""
    from airflow.sdk import Asset

    from ledgerbatch.airflow.triggers import NewDataTrigger

    (asset,) = dag.timetable.asset_condition.objects
    assert isinstance(asset, Asset) and asset.uri.startswith("x-ledgerbatch://pipelines/")
    (watcher,) = asset.watchers
    classpath, kwargs = watcher.trigger.serialize()
    assert classpath == "ledgerbatch.airflow.triggers.NewDataTrigger"
    return NewDataTrigger(**{**kwargs, "poll_interval": 0.2})


async def next_event(events, timeout: float):
    try:
        return (await asyncio.wait_for(anext(events), timeout)).payload
    except asyncio.TimeoutError:
        return None


def first_event(trigger, timeout: float = 30.0):
    """The first event of a fresh run() of `trigger`, or None when it stays quiet for `timeout` seconds."""
    async def go():
        events = trigger.run()
        try:
            return await next_event(events, timeout)
        finally:
            await events.aclose()
            await trigger.cleanup()
    return asyncio.run(go())


def target_rows(engine, p) -> int:
    with engine.connect() as conn:
        return conn.execute(text(f'SELECT count(*) FROM public."{p.table}"')).scalar()


def test_pending_follows_the_planners_rules(make_pipeline):
    """The trigger's rule, on plain values: what a run would find to do."""
    from ledgerbatch.airflow.triggers import pending
    from ledgerbatch.model.batch import Batch
    from ledgerbatch.model.ranges import OffsetRange, Watermarks

    p = make_pipeline(partitions=2)
    spec = p.spec
    t0, t1 = (p.topic, 0), (p.topic, 1)
    ends = {t0: Watermarks(0, 10), t1: Watermarks(5, 8)}

    def batch(*ranges):
        return Batch(7, p.name, "live", "planned", 1, None, None, None, None, None,
                     tuple(OffsetRange(p.topic, part, lo, hi) for part, lo, hi in ranges), {})

    never = pending(spec, ends, {}, None)  # start: earliest, no cursors: from the log starts
    assert (never.offsets, never.never_ran, never.reason) == (13, True, "13 offsets past the ledger's cursors")
    assert pending(spec, ends, {t0: 10, t1: 8}, None).reason == ""
    assert pending(spec, ends, {t0: 4, t1: 8}, None).offsets == 6
    assert pending(spec, ends, {t0: 10}, None).offsets == 3  # a partition without a cursor: from its log start
    # An unfinished batch covers its ranges: all of them (a run is on it), or some (max_records: more to come).
    covered = pending(spec, ends, {t0: 4, t1: 8}, batch((0, 4, 10)))
    assert (covered.offsets, covered.unfinished, covered.reason) == (0, 7, "batch 7 is unfinished")
    assert pending(spec, ends, {t0: 4, t1: 6}, batch((0, 4, 6))).offsets == 4 + 2
    latest = make_pipeline(partitions=2, source={**yaml_source(p), "start": "latest"}).spec
    first = pending(latest, ends, {}, None)
    assert (first.offsets, first.never_ran, first.reason) == (0, True, "the pipeline has no cursors yet")


def yaml_source(p) -> dict:
    import yaml

    return yaml.safe_load((p.dir / f"{p.name}.yaml").read_text())["source"]


def test_on_new_data_dag_is_scheduled_on_a_watched_asset(connections, make_pipeline, monkeypatch):
    from airflow.serialization.serialized_objects import DagSerialization

    p = make_pipeline(partitions=2, schedule="on_new_data")
    dag = build(p, monkeypatch)[f"ledgerbatch_{p.name}"]
    (asset,) = dag.timetable.asset_condition.objects
    assert asset.uri == f"x-ledgerbatch://pipelines/{p.name}/new-data"
    assert asset.watchers[0].trigger.serialize()[1] == {
        "pipeline": p.name, "pipelines_dir": str(p.dir), "ledger_conn_id": "ledgerbatch_db",
        "kafka_conn_id": "ledgerbatch_kafka", "poll_interval": 5.0, "refire_after": 60.0}
    assert dag.max_active_runs == 1 and [t.task_id for t in dag.topological_sort()] == ["plan", "process", "commit", "verify"]
    serialized = DagSerialization.to_dict(dag)["dag"]["timetable"]["__var"]["asset_condition"]["objects"][0]
    assert serialized["watchers"][0]["trigger"]["classpath"] == "ledgerbatch.airflow.triggers.NewDataTrigger"


def test_trigger_fires_on_new_data_stays_quiet_when_caught_up_and_two_fires_deliver_once(
        airflow_db, connections, engine, broker, make_pipeline, monkeypatch):
    p = make_pipeline(partitions=2, schedule="on_new_data")
    dag = build(p, monkeypatch)[f"ledgerbatch_{p.name}"]
    trigger = watched_trigger(dag)

    # Never run: it fires so that the first run records where the pipeline starts.
    assert first_event(trigger)["reason"] == "the pipeline has no cursors yet"
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(40)])
    event = first_event(trigger)
    assert event == {"pipeline": p.name, "pending_offsets": 40, "reason": "40 offsets past the ledger's cursors"}

    run = dag.test()
    assert str(run.state) == "success", states(run)
    assert target_rows(engine, p) == 40
    assert first_event(trigger, QUIET_S) is None  # caught up: quiet

    # New records: it fires; fired twice, the DAG runs twice, and the second run plans no batch.
    acked += produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(40, 65)])
    assert first_event(trigger)["pending_offsets"] == 25
    assert first_event(trigger)["pending_offsets"] == 25
    first, second = dag.test(), dag.test()
    assert str(first.state) == "success" and states(first)["commit"] == "success", states(first)
    assert str(second.state) == "success", states(second)
    assert states(second) == {"plan": "success", "process": "skipped", "commit": "skipped", "verify": "skipped"}
    assert target_rows(engine, p) == 65 == len(acked)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ledger.batches WHERE pipeline = :p"), {"p": p.name}).scalar() == 2
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())
    assert first_event(trigger, QUIET_S) is None


def test_the_trigger_waits_for_min_records_until_max_delay(airflow_db, connections, engine, broker, make_pipeline,
                                                           monkeypatch):
    p = make_pipeline(partitions=1, schedule="on_new_data", batch={"max_records": 1000, "min_records": 50,
                                                                   "max_delay": "6s"})
    dag = build(p, monkeypatch)[f"ledgerbatch_{p.name}"]
    trigger = watched_trigger(dag)
    assert first_event(trigger)["reason"] == "the pipeline has no cursors yet"
    assert str(dag.test().state) == "success"  # records where the pipeline starts
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(10)])
    assert first_event(trigger, 3.0) is None  # 10 offsets, fewer than min_records, the oldest younger than 6 s
    assert first_event(trigger, 30.0)["pending_offsets"] == 10  # then max_delay has passed


def test_a_running_trigger_fires_once_per_state(connections, engine, broker, make_pipeline, monkeypatch):
    """One run() of the trigger: one event for what is pending, none more until the end offsets move."""
    p = make_pipeline(partitions=1, schedule="on_new_data")
    trigger = watched_trigger(build(p, monkeypatch)[f"ledgerbatch_{p.name}"])
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(5)])

    async def go():
        queue: asyncio.Queue = asyncio.Queue()

        async def collect():  # as the triggerer does: one task iterating run()
            async for event in trigger.run():
                queue.put_nowait(event.payload)

        async def event(timeout):
            try:
                return await asyncio.wait_for(queue.get(), timeout)
            except asyncio.TimeoutError:
                return None

        task = asyncio.create_task(collect())
        try:
            assert (await event(30))["pending_offsets"] == 5
            assert await event(QUIET_S) is None  # the same state: no second event
            await asyncio.to_thread(produce, broker.bootstrap_servers, p.topic,
                                    [(0, order_value(i)) for i in range(5, 8)])
            assert (await event(30))["pending_offsets"] == 8
            assert await event(QUIET_S) is None
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await trigger.cleanup()
    asyncio.run(go())


def test_a_trigger_fires_again_after_its_run_failed_with_backoff_never_while_an_attempt_is_staged(
        connections, engine, broker, make_pipeline, monkeypatch):
    """A run it started planned a batch whose attempt then failed: the offsets wait in the unfinished batch
    and the state does not change, yet the trigger fires again, each time after twice the wait, and
    stays quiet while an attempt is being staged (its lease is live)."""
    from ledgerbatch.ledger.batches import begin_attempt, mark_failed
    from ledgerbatch.plan.live import plan_next
    from ledgerbatch.stage.lease import LEASE_S, AttemptLease

    p = make_pipeline(partitions=1, schedule="on_new_data")
    trigger = watched_trigger(build(p, monkeypatch)[f"ledgerbatch_{p.name}"])
    trigger.refire_after = 1.0
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(5)])

    async def go():
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def collect():
            async for event in trigger.run():
                queue.put_nowait((loop.time(), event.payload))

        async def event(timeout):
            try:
                return await asyncio.wait_for(queue.get(), timeout)
            except asyncio.TimeoutError:
                return None

        task = asyncio.create_task(collect())
        try:
            assert (await event(30))[1]["pending_offsets"] == 5
            batch = await asyncio.to_thread(plan_next, engine, p.spec, broker.bootstrap_servers)  # the run's plan
            with engine.begin() as conn:
                attempt = begin_attempt(conn, batch.batch_id, None, LEASE_S)
            with AttemptLease(engine, batch.batch_id, attempt, every_s=0.3):
                assert await event(3.0) is None  # being staged: quiet, though past refire_after
            with engine.begin() as conn:
                mark_failed(conn, batch.batch_id, attempt, "Spark lost")  # the run failed
            first_at, first = await event(10)
            assert first["reason"].startswith(f"batch {batch.batch_id} is unfinished; nothing was delivered")
            second_at, second = await event(10)
            assert second["reason"].startswith(f"batch {batch.batch_id} is unfinished")
            assert 1.8 <= second_at - first_at < 6  # the wait doubled (1 s, then 2 s)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await trigger.cleanup()
    asyncio.run(go())


def tcp_peers(ports: set[int]) -> int:
    """This process's open TCP connections to any of `ports`."""
    import psutil

    return sum(1 for c in psutil.Process().net_connections(kind="tcp")
               if c.raddr and c.raddr.port in ports and c.status == psutil.CONN_ESTABLISHED)


def test_the_triggers_of_many_pipelines_share_a_few_connections(connections, engine, broker, make_pipeline, db_url):
    """Twelve event-driven pipelines' triggers in one event loop, as in one triggerer: each fires for its own
    records while the process holds a few PostgreSQL and Kafka connections in all, not one of each a pipeline
    (a trigger kept a consumer and an engine of its own: 95 of them used up a default max_connections)."""
    from sqlalchemy.engine import make_url

    from ledgerbatch.airflow import trigger_clients
    from ledgerbatch.airflow.triggers import NewDataTrigger
    from ledgerbatch.source import looks

    pipes = [make_pipeline(partitions=1, schedule="on_new_data") for _ in range(12)]
    for i, p in enumerate(pipes):
        produce(broker.bootstrap_servers, p.topic, [(0, order_value(j)) for j in range(i + 1)])
    pg, kafka = {make_url(db_url).port or 5432}, {int(s.rsplit(":", 1)[1]) for s in broker.bootstrap_servers.split(",")}
    before = tcp_peers(pg), tcp_peers(kafka)
    triggers = [NewDataTrigger(pipeline=p.name, pipelines_dir=str(p.dir), poll_interval=0.2) for p in pipes]

    async def go():
        fired: dict[str, list] = {}

        async def collect(trigger):  # as the triggerer does: a task iterating each run()
            async for event in trigger.run():
                fired.setdefault(event.payload["pipeline"], []).append(event.payload["pending_offsets"])

        tasks = [asyncio.create_task(collect(t)) for t in triggers]
        try:
            for _ in range(1200):  # 120 s at most: a loaded machine
                if len(fired) == len(pipes):
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # some more looks of every trigger
            return fired, (tcp_peers(pg), tcp_peers(kafka))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(t.cleanup() for t in triggers))

    fired, during = asyncio.run(go())
    assert fired == {p.name: [i + 1] for i, p in enumerate(pipes)}
    assert during[0] - before[0] <= trigger_clients.POOL_SIZE + trigger_clients.MAX_OVERFLOW, (before, during)
    assert during[1] - before[1] <= 2 * len(kafka) + 1, (before, during)  # one consumer: bootstrap and broker
    assert not trigger_clients._engines and not looks._lookers  # the last trigger's cleanup closed them
    assert tcp_peers(pg) <= before[0] and tcp_peers(kafka) <= before[1]

"""Turns (stage/turns.py): the batches of many pipelines staged at one time go to Spark as one job; a job's own
failure (here its offsets gone from Kafka) fails its batch alone; every other pipeline is staged exactly once,
two pipelines of one topic and a range too big to be read with the others (turn_tasks.SMALL_SPAN) among them."""
from __future__ import annotations

import threading
import time
import types

import psycopg2
import pytest

from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.errors import DataLossError
from ledgerbatch.plan.live import plan_next
from ledgerbatch.stage import tasks
from ledgerbatch.stage.process import process_batch
from ledgerbatch.stage.turns import Turns

from .helpers import assert_exactly_once, delete_records, order_value, produce

pytestmark = pytest.mark.integration


def _stage_together(spark, engine, db_url, broker, pipes, batches, turns) -> dict:
    """Each pipeline's planned batch processed from a thread of its own through `turns`: its staged batch, or
    its error, by pipeline name."""
    outcome = {}

    def stage(p):
        try:
            outcome[p.name] = process_batch(spark, engine, p.spec, batches[p.name].batch_id, db_url,
                                            broker.bootstrap_servers, turns=turns)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            outcome[p.name] = exc
    threads = [threading.Thread(target=stage, args=(p,)) for p in pipes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return outcome


def test_one_turn_stages_many_pipelines_and_a_jobs_failure_is_its_own(engine, db_url, broker, spark, make_pipeline):
    pipes = [make_pipeline(partitions=2) for _ in range(4)]
    acked = {p.name: produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(20)])
             for p in pipes}
    twin = make_pipeline(partitions=2, source__topics=[pipes[0].topic])  # the same partitions in one turn
    twin.topic, acked[twin.name] = pipes[0].topic, acked[pipes[0].name]
    big = make_pipeline(partitions=1)
    acked[big.name] = produce(broker.bootstrap_servers, big.topic, [(0, order_value(i)) for i in range(12_000)])
    pipes[1:1] = [twin, big]
    lost = make_pipeline(partitions=2)
    acked[lost.name] = produce(broker.bootstrap_servers, lost.topic, [(i % 2, order_value(i)) for i in range(20)])
    pipes.append(lost)
    batches = {p.name: plan_next(engine, p.spec, broker.bootstrap_servers) for p in pipes}
    # The last pipeline's first records leave the log after planning, as retention would.
    produce(broker.bootstrap_servers, lost.topic, [(0, order_value(i)) for i in range(20, 30)])
    delete_records(broker.bootstrap_servers, lost.topic, 0, 12)
    turns = Turns()
    outcome = _stage_together(spark, engine, db_url, broker, pipes, batches, turns)
    assert turns.turns <= 2, turns.turns  # the first to arrive leads alone; the others wait and go together
    assert isinstance(outcome[lost.name], DataLossError), outcome[lost.name]
    for p in pipes[:-1]:
        staged = outcome[p.name]
        assert staged.status == "staged" and staged.records_read == len(acked[p.name]), staged
        commit_batch(engine, p.spec, staged.batch_id, staged.attempt)
        assert_exactly_once(engine, p, broker.bootstrap_servers, good={(part, o) for part, o, _ in acked[p.name]},
                            bad=set())


def test_a_leader_waits_for_the_pipelines_of_the_turn_before(engine, db_url, broker, spark, make_pipeline):
    """Pipelines that come back from their commits at different times go in one turn, not in cohorts: a leader
    waits (gather_s at most) for every pipeline that staged lately. Four pipelines follow as the service's threads
    do, each back 0 / 0.3 / 0.6 / 0.9 s after its commit: once one turn holds them all, each wave is one turn."""
    pipes, waves = [make_pipeline(partitions=2) for _ in range(4)], 6
    turns, sent = Turns(gather_s=5.0), {p.name: [] for p in pipes}
    errors: list[BaseException] = []

    def follow(p, delay: float) -> None:
        try:
            for wave in range(waves):
                sent[p.name] += produce(broker.bootstrap_servers, p.topic,
                                        [(i % 2, order_value(i)) for i in range(10 * wave, 10 * wave + 10)])
                planned = plan_next(engine, p.spec, broker.bootstrap_servers)
                staged = process_batch(spark, engine, p.spec, planned.batch_id, db_url, broker.bootstrap_servers,
                                       turns=turns)
                commit_batch(engine, p.spec, staged.batch_id, staged.attempt)
                time.sleep(delay)  # back at different times, as commits of different sizes end
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            errors.append(exc)
    threads = [threading.Thread(target=follow, args=(p, 0.3 * i)) for i, p in enumerate(pipes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and not any(t.is_alive() for t in threads), errors
    # The first wave may split (the first to arrive leads alone; one more may too); the next leader waits for those,
    # who then stay a wave ahead in the others' turns. In cohorts (a leader not waiting) each wave takes 2-3 turns
    # (20 turns for the 6 waves with gather_s 0).
    assert turns.turns <= waves + 3, turns.turns
    for p in pipes:
        assert_exactly_once(engine, p, broker.bootstrap_servers, good={(part, o) for part, o, _ in sent[p.name]},
                            bad=set())


class _InProcess:
    """A turn's Spark job run in this process, every share in one task, so that a test can reach inside it."""

    def range(self, start, end, step, slices):
        return self

    def mapInArrow(self, task, schema):
        self.task = task
        return self

    def collect(self):
        import pyarrow as pa

        shares = len(self.task.keywords["shares"])
        return [types.SimpleNamespace(**row) for out in self.task(iter([pa.record_batch([pa.array(range(shares))], ["id"])]))
                for row in out.to_pylist()]


class _InProcessTurns(Turns):
    def stage(self, spark, job, parallelism):
        return super().stage(_InProcess(), job, parallelism)


def test_a_staging_connection_that_dies_fails_its_own_job_alone(engine, db_url, broker, spark, make_pipeline,
                                                                monkeypatch):
    """A task stages every job on one connection per ledger database: when its backend is terminated while one
    job stages (an operator, a pooler's cut), that job fails and the next job of the task connects anew."""
    pipes = [make_pipeline(partitions=2) for _ in range(3)]
    for p in pipes:
        produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(20)])
    batches = {p.name: plan_next(engine, p.spec, broker.bootstrap_servers) for p in pipes}
    copy_range, killed = tasks.copy_range, []

    def terminated_once(parsed, table, conn):
        if turns.turns == 1 and not killed:  # the second turn's first range: its backend is ended under it
            with psycopg2.connect(table.dsn) as other, other.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(%s)", (conn.get_backend_pid(),))
            killed.append(table.name)
        return copy_range(parsed, table, conn)
    monkeypatch.setattr(tasks, "copy_range", terminated_once)
    turns = _InProcessTurns(gather_s=2.0)
    outcome = _stage_together(spark, engine, db_url, broker, pipes, batches, turns)
    failed = [name for name, o in outcome.items() if isinstance(o, Exception)]
    assert len(killed) == 1 and len(failed) == 1, (killed, outcome)
    assert "connection" in str(outcome[failed[0]]), outcome[failed[0]]
    assert all(o.status == "staged" and o.records_read == 20 for name, o in outcome.items() if name not in failed), outcome

"""The backfill DAG's approval step: dag.test() of a replay with `approve` waits in Airflow's human-in-the-loop
state; a person's answer, sent to Airflow's own REST endpoint (what the Required actions page sends),
commits it or abandons it."""
from __future__ import annotations

import threading
import time

import pytest
import yaml
from sqlalchemy import text

from .helpers import assert_exactly_once, order_value, produce
from .test_airflow import airflow_db, build, connections, states  # noqa: F401  (fixtures)

pytestmark = pytest.mark.integration


@pytest.fixture
def api(monkeypatch, airflow_db):
    """Airflow's REST API in this process, on the metadata database dag.test() uses; every caller is admin."""
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "True")
    with TestClient(create_app("core")) as client:
        yield client


class Reviewer(threading.Thread):
    """Waits for the review task's request, keeps what it shows, and answers it with `choice`."""

    def __init__(self, api, choice: str):
        super().__init__(daemon=True)
        self.api, self.choice, self.seen, self.error = api, choice, None, None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                got = self.api.get("/api/v2/dags/ledgerbatch_backfill/dagRuns/~/hitlDetails",
                                   params={"response_received": False})
                assert got.status_code == 200, got.text
                waiting = [d for d in got.json()["hitl_details"] if d["task_instance"]["task_id"] == "review"]
                if waiting:
                    self.seen = waiting[0]
                    ti = self.seen["task_instance"]
                    answer = self.api.patch(
                        f"/api/v2/dags/ledgerbatch_backfill/dagRuns/{ti['dag_run_id']}/taskInstances/review/-1/hitlDetails",
                        json={"chosen_options": [self.choice], "params_input": {}})
                    assert answer.status_code == 200, answer.text
                    return
                time.sleep(0.5)
            raise AssertionError("the review task never asked")
        except BaseException as exc:  # reported by the test's thread
            self.error = exc


def _target(engine, p) -> dict:
    with engine.connect() as conn:
        return {(r._partition, r._offset): r.customer for r in conn.execute(
            text(f'SELECT _partition, _offset, customer FROM public."{p.table}"'))}


def _replay_batch(engine, p):
    with engine.connect() as conn:
        return conn.execute(text("SELECT batch_id, status, error FROM ledger.batches WHERE pipeline = :p AND kind <> 'live' "
                                 "ORDER BY batch_id DESC LIMIT 1"), {"p": p.name}).one()


@pytest.fixture
def replayed(connections, engine, broker, make_pipeline, monkeypatch):
    """A pipeline with 40 delivered records, its spec then changed: the backfill DAG and its request."""
    p = make_pipeline(partitions=2)
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(40)])
    assert str(build(p, monkeypatch)[f"ledgerbatch_{p.name}"].test().state) == "success"
    path = p.dir / f"{p.name}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["transform"] = {"customer": "concat('vip-', customer)"}
    path.write_text(yaml.safe_dump(doc))
    conf = {"pipeline": p.name, "partitions": "1", "from_offset": 5, "until_offset": 10, "dry_run": False, "approve": True}
    return p, acked, build(p, monkeypatch)["ledgerbatch_backfill"], conf


def _answered(api, backfill, conf: dict, choice: str):
    """dag.test() of the backfill while a reviewer answers `choice`; the run and what the reviewer saw."""
    reviewer = Reviewer(api, choice)
    reviewer.start()
    run = backfill.test(run_conf=conf)
    reviewer.join(10)
    assert reviewer.error is None, reviewer.error
    assert str(run.state) == "success", states(run)
    return run, reviewer.seen


def test_an_approved_replay_commits_after_the_person_saw_its_diff(api, replayed, engine, broker):
    p, acked, backfill, conf = replayed
    before = _target(engine, p)
    run, shown = _answered(api, backfill, conf, "Approve")
    assert states(run)["commit"] == "success"
    assert shown["subject"].startswith("Commit replay batch") and p.name in shown["subject"]
    assert "| 0 | 0 | 5 | 0 | 0 |" in shown["body"], shown["body"]  # added, removed, changed, unchanged, bad
    after = _target(engine, p)
    assert {k for k in before if after[k] != before[k]} == {(1, o) for o in range(5, 10)}
    assert _replay_batch(engine, p).status == "committed"
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())


def test_a_rejected_replay_is_abandoned_and_the_target_is_unchanged(api, replayed, engine, broker):
    p, acked, backfill, conf = replayed
    before = _target(engine, p)
    run, _ = _answered(api, backfill, conf, "Reject")
    assert states(run)["commit"] == "skipped" and states(run)["review"] == "success"
    assert _target(engine, p) == before
    batch = _replay_batch(engine, p)
    assert batch.status == "abandoned" and "rejected in the backfill DAG's review" in batch.error
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'ledger_staging' "
                                 "AND table_name LIKE :t"), {"t": f"b{batch.batch_id}\\_%"}).scalar() == 0
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())


def test_without_approve_the_review_passes_at_once(replayed, engine):
    p, _, backfill, conf = replayed
    run = backfill.test(run_conf={**conf, "approve": False})
    assert str(run.state) == "success", states(run)
    assert _replay_batch(engine, p).status == "committed"

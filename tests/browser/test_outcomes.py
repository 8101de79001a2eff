"""What a person reads of a run in the Airflow UI, in a real browser (Debian's headless Chromium driven by
Playwright, against a real api-server: test_backfill_form.py's). Each run is made by `airflow dags test
--use-executor` into the api-server's own metadata database: Airflow's LocalExecutor runs the task in a process
of its own through the api-server's execution API, against the real ledger and Kafka, and its log is written
where the UI reads it (no scheduler needed). A dry run's outcome is the task's return value, one line in its XCom
tab; a person's mistake fails the task once, without retry, and its log opens with the one line."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from ledgerbatch.processes import stop_group
from tests.conftest import Pipeline
from tests.integration.helpers import order_value, produce

from .test_backfill_form import api_server, signed_in_page, ui_env


DAGS_TEST_TIMEOUT_S = 180  # a run takes 5-20 s on a loaded machine


def dags_test(ui, dag_id: str, conf: dict) -> tuple[str, str, int]:
    """One run of `dag_id` with `conf`; (its run id, its task's state, that task's try number).

    The LocalExecutor gets one worker process (parallelism 1; each of these DAGs has one task). With more, `dags
    test` can wait forever once its run is over (Airflow 3.3.2, executors/local_executor.py: end): end() sends a
    poison pill for each worker it finds alive, one worker after the other, while the workers already take them
    and exit; on a loaded machine a worker can take a pill and be gone before its own check, so one pill too few
    goes out and end() joins the worker that ran the task, which waits for a pill, forever (seen: 32 workers, 31
    pills). With one worker there is no other to take its pill."""
    base, env, _ = ui
    env = {**env, "AIRFLOW__CORE__EXECUTOR": "LocalExecutor", "AIRFLOW__CORE__PARALLELISM": "1",
           "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/"}
    # Its output in a file, not a pipe: a process left behind must not hold the test up.
    fd, out_path = tempfile.mkstemp(prefix=f"dags-test-{dag_id}-", suffix=".log", dir=env["AIRFLOW_HOME"])
    with open(fd, "w") as out:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "dags", "test", dag_id,
                                 "--use-executor", "-c", json.dumps(conf)], env=env, stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            proc.wait(DAGS_TEST_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _stop_tree(proc)
            pytest.fail(f"airflow dags test {dag_id} still running after {DAGS_TEST_TIMEOUT_S}s (stopped); "
                        f"its output ({out_path}) ends:\n{Path(out_path).read_text()[-6000:]}")
    with sqlite3.connect(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].removeprefix("sqlite:///")) as db:
        row = db.execute("SELECT r.run_id, t.state, t.try_number FROM dag_run r JOIN task_instance t USING (dag_id, "
                         "run_id) WHERE r.dag_id = ? ORDER BY r.id DESC LIMIT 1", (dag_id,)).fetchone()
    assert row is not None, Path(out_path).read_text()[-3000:]
    return row


def _stop_tree(proc: subprocess.Popen) -> None:
    """`proc`'s process group (`dags test` and its executor's workers) and every process below it in a group of
    its own (Airflow gives a task process one): nothing left behind waiting for a pill."""
    import psutil

    try:
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        below = []
    stop_group(proc, 10)
    for child in below:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.fixture(scope="module")
def ui(tmp_path_factory, db_url, broker):
    """The api-server over a pipeline of 2 partitions, 10 records each, that has not started."""
    p = Pipeline(tmp_path_factory.mktemp("pipelines"), broker, 2)
    produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(20)])
    u = make_url(db_url)
    env = ui_env(tmp_path_factory.mktemp("airflow-runs"), p.dir,
                 {"conn_type": "postgres", "host": u.host, "port": u.port, "login": u.username, "schema": u.database})
    env["AIRFLOW_CONN_LEDGERBATCH_KAFKA"] = json.dumps({"conn_type": "generic",
                                                        "extra": {"bootstrap.servers": broker.bootstrap_servers}})
    with api_server(env) as base:
        yield base, env, p


@pytest.fixture
def page(ui):
    with signed_in_page(ui[0], "/dags", 900, 60_000) as page:  # the machine is shared: a slow answer is no failure
        yield page


def test_a_dry_run_of_the_offsets_form_as_it_opens_shows_its_moves_in_one_line(ui, page, tmp_path):
    base, _, p = ui
    run_id, state, tries = dags_test(ui, "ledgerbatch_offsets", {"pipeline": p.name, "by": "alice", "reason": "look"})
    assert (state, tries) == ("success", 1)
    page.goto(f"{base}/dags/ledgerbatch_offsets/runs/{run_id}/tasks/move")
    page.get_by_text("Storage", exact=True).click()
    page.get_by_text("XCom", exact=True).click()
    line = f"{p.name} to-latest (dry run, nothing moved): {p.topic}[0]: starts at 10; {p.topic}[1]: starts at 10"
    page.get_by_text(line).wait_for()
    page.screenshot(path=str(tmp_path / "offsets-dry-run-xcom.png"), full_page=True)


def test_a_persons_mistake_fails_the_task_once_and_its_log_opens_with_the_one_line(ui, page, tmp_path):
    base, _, p = ui
    run_id, state, tries = dags_test(ui, "ledgerbatch_offsets",
                                     {"pipeline": p.name, "to": "time", "by": "alice", "reason": "look"})
    assert (state, tries) == ("failed", 1)  # no retry: trying again cannot fix what the form sent
    page.goto(f"{base}/dags/ledgerbatch_offsets/runs/{run_id}/tasks/move")
    line = "ledgerbatch_offsets: Time: Move to = time needs a Time; or choose Move to = latest, earliest or offset"
    page.get_by_text(f"ERROR - {line}").wait_for()
    first_error = page.get_by_text("ERROR - ").first.inner_text()
    assert first_error.endswith(line), first_error  # before Airflow's own "Task failed with exception"
    page.screenshot(path=str(tmp_path / "offsets-refused-log.png"), full_page=True)

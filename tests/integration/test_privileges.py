"""Least privilege: the writer role runs a pipeline; the inspector role reads the ledger and changes nothing."""
from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from .helpers import cli, order_value, produce

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def role_urls(engine, db_url):
    with engine.begin() as conn:
        for login, group in (("lb_test_writer", "ledgerbatch_writer"), ("lb_test_inspector", "ledgerbatch_inspector")):
            conn.execute(text(f"DROP ROLE IF EXISTS {login}"))
            conn.execute(text(f"CREATE ROLE {login} LOGIN IN ROLE {group}"))
        # Targets live in their own schema the writer may create tables in.
        conn.execute(text("CREATE SCHEMA IF NOT EXISTS writer_targets"))
        conn.execute(text("GRANT USAGE, CREATE ON SCHEMA writer_targets TO ledgerbatch_writer"))
    url = make_url(db_url)
    yield {role: url.set(username=f"lb_test_{role}").render_as_string(hide_password=False) for role in ("writer", "inspector")}


def test_writer_runs_a_pipeline_and_inspector_only_reads(engine, role_urls, broker, make_pipeline):
    p = make_pipeline(partitions=2, target={"table": "", "mode": "append"})
    spec_path = p.dir / f"{p.name}.yaml"
    spec_path.write_text(spec_path.read_text().replace("table: ''", f"table: writer_targets.{p.table}"))
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(50)])
    done = cli(["run", p.name], role_urls["writer"], broker.bootstrap_servers, p.dir)
    assert done.returncode == 0, done.stderr[-2000:]
    with engine.connect() as conn:
        rows = conn.execute(text(f'SELECT count(*) FROM writer_targets."{p.table}"')).scalar_one()
    assert rows == 50 and len(acked) == 50

    inspector = create_engine(role_urls["inspector"])
    try:
        with inspector.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM ledger.batches WHERE pipeline = :p"), {"p": p.name}).scalar_one() == 1
            assert conn.execute(text("SELECT count(*) FROM ledger.recent_batches")).scalar_one() >= 1
        for sql in ("UPDATE ledger.cursors SET next_offset = 0", "DELETE FROM ledger.batches",
                    "INSERT INTO ledger.lost_ranges VALUES ('x', 't', 0, 0, 1, 'me', now(), NULL)",
                    "CREATE TABLE ledger_staging.evil (x int)", "DROP TABLE ledger.quarantine"):
            with inspector.begin() as conn, pytest.raises(ProgrammingError, match="permission denied|must be owner"):
                conn.execute(text(sql))
    finally:
        inspector.dispose()

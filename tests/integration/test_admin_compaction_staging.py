"""`compact` by an admin login of a pipeline the writer login commits (issue #49): a staging table of a finished
batch that the commit could not drop (a stalled attempt still held it) is the writer's. The admin's compaction
sees it (pg_catalog, not information_schema) and drops it when it may (a member of the writer login); when it may
not, it leaves it to the writer's next clean-up and `verify` does not call it an orphan: its batch is folded."""
from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.ops.history import compact
from ledgerbatch.ops.verify import verify
from ledgerbatch.stage.tables import drop_finished_staging

from .staged import begin, fill, plan

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def logins(engine, db_url):
    """A writer login, an admin login that is not a member of it, and one that is."""
    groups = {"writer": "ledgerbatch_writer", "admin": "ledgerbatch_admin", "owner_admin": "ledgerbatch_admin"}
    with engine.begin() as conn:
        for role, group in groups.items():
            login = f"lb_stg_{role}"
            if not conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": login}).first():
                conn.execute(text(f"CREATE ROLE {login} LOGIN"))
            conn.execute(text(f"GRANT {group} TO {login}"))
        conn.execute(text("GRANT lb_stg_writer TO lb_stg_owner_admin"))
        conn.execute(text("GRANT USAGE, CREATE ON SCHEMA public TO ledgerbatch_writer"))
    url = make_url(db_url)
    engines = {role: create_engine(url.set(username=f"lb_stg_{role}").render_as_string(hide_password=False))
               for role in groups}
    yield engines
    for e in engines.values():
        e.dispose()


def staging_tables(engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'ledger_staging'")).scalars())


def committed_with_a_leftover(engine, writer, make_pipe):
    """Three batches committed by the writer; the last one's first attempt stalled and held its staging table while
    the commit dropped it, so that table stays behind its committed batch."""
    p = make_pipe()
    for lo in range(0, 30, 10):
        b = plan(writer, p, {0: (lo, lo + 10)})
        stalled, second = begin(writer, p, b), begin(writer, p, b)
        fill(writer, p, second, [(0, o, f"o-{o}", "1.00") for o in range(lo, lo + 10)])
        if lo == 20:
            with engine.connect() as holder:
                holder.execute(text(f'LOCK TABLE ledger_staging."{stalled.staging}" IN ACCESS SHARE MODE'))
                commit_batch(writer, p.spec, second.batch_id)
                holder.rollback()
        else:
            commit_batch(writer, p.spec, second.batch_id)
    assert {stalled.staging, f"{stalled.staging}_bad"} <= staging_tables(engine)
    time.sleep(0.01)  # finished before the cut-off
    return p, stalled.staging


def test_verify_is_clean_after_an_admin_compaction_that_may_not_drop_the_writers_staging_table(engine, logins,
                                                                                              make_pipe):
    p, left = committed_with_a_leftover(engine, logins["writer"], make_pipe)
    assert compact(logins["admin"], p.spec, datetime.now(timezone.utc)).batches == 3
    assert {left, f"{left}_bad"} <= staging_tables(engine)  # not the admin's to drop
    assert verify(engine, p.spec) == []
    assert drop_finished_staging(logins["writer"], p.name) == []  # the writer's next commit, run or abandon
    assert not {left, f"{left}_bad"} & staging_tables(engine)
    assert verify(engine, p.spec) == []


def test_an_admin_compaction_drops_the_writers_staging_table_when_it_may(engine, logins, make_pipe):
    p, left = committed_with_a_leftover(engine, logins["writer"], make_pipe)
    assert compact(logins["owner_admin"], p.spec, datetime.now(timezone.utc)).batches == 3
    assert not {left, f"{left}_bad"} & staging_tables(engine)
    assert verify(engine, p.spec) == []

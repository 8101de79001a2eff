"""A range's COPYs (stage/csv_copy.py: copy_range) on the real PostgreSQL server: the good rows stream into one
COPY while bad records are held back for their own, ending it early when too many wait; an error in the
records being read comes out as itself and leaves nothing staged; a retry replaces the earlier try."""
from __future__ import annotations

import psycopg2
import pytest
from sqlalchemy import text

from ledgerbatch.config import libpq_dsn
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.source.reader import RangeReadError, Records
from ledgerbatch.stage import csv_copy
from ledgerbatch.stage.job import Parsing
from ledgerbatch.stage.tables import StagingTables, open_staging

from .helpers import order_value

pytestmark = pytest.mark.integration

CHUNK = 20
_BATCH_IDS = 2_000_000_000  # far past the batches other tests plan, whose staging tables share the schema


def _value(offset: int) -> bytes:
    """Every fifth record is not JSON."""
    return b"{not json" if offset % 5 == 0 else order_value(offset, amount=f"{offset}.25")


def _chunks(p, offsets: range, fail_after: int | None = None):
    """Partition 0's parsed records at `offsets`, in chunks; reading fails before chunk `fail_after`."""
    topic, partition, parser = p.topic, 0, Parsing.of(p.spec).parser()
    for n, start in enumerate(range(offsets.start, offsets.stop, CHUNK)):
        if fail_after is not None and n == fail_after:
            raise RangeReadError(f"{topic}[{partition}]: offsets lost: gone from the log")
        chunk = range(start, min(start + CHUNK, offsets.stop))
        yield parser.parse(topic, partition, Records(list(chunk), [None] * len(chunk), [_value(o) for o in chunk]))


@pytest.fixture
def staging(engine, db_url, make_pipeline):
    p = make_pipeline(partitions=1)
    with engine.begin() as conn:
        table = open_staging(conn, BatchShape.of_spec(p.spec), _BATCH_IDS + int(p.name.rsplit("_", 1)[1]), 1, libpq_dsn(db_url))
    conn = psycopg2.connect(table.dsn)
    yield p, table, conn
    conn.close()
    with engine.begin() as c:  # `verify` reports staging tables no batch owns
        StagingTables(table.name).drop(c)


def _staged(engine, table) -> tuple[list, list]:
    with engine.connect() as conn:
        good = conn.execute(text(f"SELECT _offset, amount FROM ledger_staging.{table.name} ORDER BY 1")).all()
        bad = conn.execute(text(f"SELECT _offset FROM ledger_staging.{StagingTables(table.name).bad} ORDER BY 1")).scalars().all()
    return good, bad


def test_good_rows_and_bad_records_of_a_range_are_all_staged_when_bad_ones_end_the_copy_early(
        engine, staging, monkeypatch):
    p, table, conn = staging
    monkeypatch.setattr(csv_copy, "BAD_HELD", 7)  # 4 bad records a chunk: the COPY of good rows ends every 2 chunks
    counts = csv_copy.copy_range(_chunks(p, range(250)), table, conn)

    assert counts == (p.topic, 0, 250, 50, 0, 0)
    good, bad = _staged(engine, table)
    assert [(r._offset, str(r.amount)) for r in good] == [(o, f"{o}.25") for o in range(250) if o % 5]
    assert bad == list(range(0, 250, 5))


def test_an_error_while_reading_comes_out_as_itself_and_leaves_nothing_of_the_range(engine, staging):
    p, table, conn = staging
    with pytest.raises(RangeReadError, match="offsets lost"):
        csv_copy.copy_range(_chunks(p, range(100), fail_after=3), table, conn)
    assert _staged(engine, table) == ([], [])


def test_a_retried_range_replaces_what_the_earlier_try_staged(engine, staging):
    p, table, conn = staging
    csv_copy.copy_range(_chunks(p, range(60)), table, conn)
    assert csv_copy.copy_range(_chunks(p, range(60)), table, conn) == (p.topic, 0, 60, 12, 0, 0)
    good, bad = _staged(engine, table)
    assert [r._offset for r in good] == [o for o in range(60) if o % 5]
    assert bad == list(range(0, 60, 5))

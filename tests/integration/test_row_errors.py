"""A row's fault, whatever SQLSTATE the target gives it (commit/row_errors.py), is quarantined and the rest
of the batch written, on every path: a key too long for a btree index (54000: an upsert target's own primary
key, a user's index on an append target, copied or attached), a trigger's own SQLSTATE, a CHECK the user
added NOT VALID (an attached batch refuses exactly the rows a copied one does). What is not a row's fault
fails the batch with nothing quarantined. Batches are staged by hand (staged.py): only PostgreSQL is needed."""
from __future__ import annotations

import random
import string

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledgerbatch.commit.modes import partitions
from ledgerbatch.commit.modes.catalog import mode_for
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.model.batch import BatchStatus
from ledgerbatch.ops.verify import verify

from .staged import batch, quarantine, refused, staged_batch, target, target_shape

pytestmark = pytest.mark.integration

# 4,000 characters that compression cannot shrink below the btree maximum (2,704 bytes)
LONG = "".join(random.Random(7).choices(string.ascii_letters + string.digits, k=4000))


def _user(engine, p, *statements: str) -> None:
    """Create the target, then change it as its owner would; `{t}` is the target, `{n}` the pipeline's name."""
    with engine.begin() as conn:
        mode_for(p.spec).ensure_target(conn, p.spec, target_shape(p))
        for sql in statements:
            conn.execute(text(sql.format(t=f'public."{p.table}"', n=p.name)))


def _partitions_of_rows(engine, p) -> dict[int, str]:
    with engine.connect() as conn:
        return dict(conn.execute(text(f'SELECT _offset, tableoid::regclass::text FROM public."{p.table}"')).all())


def _attached(engine, p, s) -> bool:
    """Whether batch s's partition is its staging table attached (its unique index still named after it),
    not a partition its rows were copied into."""
    with engine.connect() as conn:
        indexes = conn.execute(text("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = CAST(:t AS regclass)"),
                               {"t": f"public.{p.table}_b{s.batch_id}"}).scalars().all()
    return any(name.removeprefix("public.").startswith(s.staging) for name in indexes)


@pytest.mark.parametrize("mode", ["upsert", "changes", "versioned"])
def test_a_key_too_long_for_the_primary_key_is_quarantined(engine, make_pipe, mode):
    """The upsert target's primary key is the product's own index: the record whose key it cannot hold is
    the row's fault (54000), not an outage; the rest of the batch commits."""
    p = make_pipe(mode="upsert", max_ratio=0.9, deletes=mode == "changes", version="ts" if mode == "versioned" else None)
    commit_batch(engine, p.spec, staged_batch(engine, p, {0: (0, 2)}, good=[(0, 0, "o-0", "1.00"),
                                                                           (0, 1, "o-1", "2.00")]).batch_id)
    s = staged_batch(engine, p, {0: (2, 5)}, good=[(0, 2, "o-2", "3.00"), (0, 3, LONG, "4.00"), (0, 4, "o-4", "5.00")])
    result = commit_batch(engine, p.spec, s.batch_id)

    assert result.rows_rejected == 1 and batch(engine, s.batch_id).status == BatchStatus.COMMITTED
    assert [r[2] for r in target(engine, p)] == ["o-0", "o-1", "o-2", "o-4"]
    assert [r[:4] for r in refused(engine, p)] == [(0, 3, s.batch_id, "54000")]
    assert refused(engine, p)[0][4] == f"{p.table}_pkey"
    assert "index row size" in quarantine(engine, p)[0][3]
    assert verify(engine, p.spec) == []


@pytest.mark.parametrize("attach_min_rows", [10**9, 1], ids=["copied", "attached"])
def test_a_key_too_long_for_a_users_index_is_quarantined_on_both_paths(engine, make_pipe, monkeypatch, attach_min_rows):
    """Append with an index the user put on a text column. Attached, the ATTACH's build of that index fails;
    the refused row found, the rest of the batch is copied into a partition of its own (the staging table
    still holds the removed row's version until the commit, and a second ATTACH would index it again)."""
    monkeypatch.setattr(partitions, "ATTACH_MIN_ROWS", attach_min_rows)
    p = make_pipe(max_ratio=0.9)
    _user(engine, p, "CREATE INDEX {n}_by_order ON {t} (order_id)")
    first = staged_batch(engine, p, {0: (0, 1)}, good=[(0, 0, "o-0", "1.00")])
    commit_batch(engine, p.spec, first.batch_id)  # the first batch is attached either way
    s = staged_batch(engine, p, {0: (1, 4)}, good=[(0, 1, "o-1", "2.00"), (0, 2, LONG, "3.00"), (0, 3, "o-3", "4.00")])
    result = commit_batch(engine, p.spec, s.batch_id)

    assert (result.rows_written, result.rows_rejected) == (2, 1)
    assert [r[:3] for r in target(engine, p)] == [(0, 0, "o-0"), (0, 1, "o-1"), (0, 3, "o-3")]
    assert [r[:5] for r in refused(engine, p)] == [(0, 2, s.batch_id, "54000", f"{p.name}_by_order")]
    where = _partitions_of_rows(engine, p)
    if attach_min_rows == 1:  # a partition of its own, as an attached batch has, but copied
        assert where[1] == where[3] == f"{p.table}_b{s.batch_id}" != where[0]
        assert not _attached(engine, p, s)
    else:
        assert where[1] == where[3] == where[0]
    assert verify(engine, p.spec) == []


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_trigger_refusing_a_row_with_its_own_sqlstate_is_a_refused_row(engine, make_pipe, mode):
    """`RAISE ... USING ERRCODE = 'LB001'`: no class PostgreSQL defines, so only the target's owner can have
    meant it, about the row; quarantined with the code and the trigger's message."""
    p = make_pipe(mode=mode, max_ratio=0.9)
    _user(engine, p, "CREATE FUNCTION public.{n}_embargo() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                     "IF NEW.order_id = 'o-2' THEN RAISE EXCEPTION 'order % is embargoed', NEW.order_id "
                     "USING ERRCODE = 'LB001'; END IF; RETURN NEW; END $$",
          "CREATE TRIGGER embargo BEFORE INSERT OR UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION public.{n}_embargo()")
    s = staged_batch(engine, p, {0: (0, 4)}, good=[(0, i, f"o-{i}", "1.00") for i in range(4)])
    assert commit_batch(engine, p.spec, s.batch_id).rows_rejected == 1
    assert [r[2] for r in target(engine, p)] == ["o-0", "o-1", "o-3"]
    assert [r[:4] for r in refused(engine, p)] == [(0, 2, s.batch_id, "LB001")]
    assert "refused by the target: order o-2 is embargoed" in quarantine(engine, p)[0][3]
    assert verify(engine, p.spec) == []


@pytest.mark.parametrize("sqlstate", ["57014", "55P03", "53200"])
def test_a_trigger_raising_the_servers_trouble_fails_the_batch(engine, make_pipe, sqlstate):
    """A code of a class PostgreSQL defines is judged by its class, whoever raised it: a statement timeout, a
    lock timeout, out of memory are not the row's; the batch fails, nothing quarantined, and stays staged."""
    p = make_pipe(max_ratio=0.9)
    _user(engine, p, "CREATE FUNCTION public.{n}_unwell() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                     f"IF NEW.order_id = 'o-2' THEN RAISE EXCEPTION 'unwell' USING ERRCODE = '{sqlstate}'; END IF; "
                     "RETURN NEW; END $$",
          "CREATE TRIGGER unwell BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION public.{n}_unwell()")
    s = staged_batch(engine, p, {0: (0, 4)}, good=[(0, i, f"o-{i}", "1.00") for i in range(4)])
    with pytest.raises(DBAPIError) as failed:
        commit_batch(engine, p.spec, s.batch_id)
    assert failed.value.orig.pgcode == sqlstate
    assert quarantine(engine, p) == [] and batch(engine, s.batch_id).status == BatchStatus.STAGED


def test_a_not_valid_check_refuses_the_same_rows_attached_and_copied(engine, make_pipe, monkeypatch):
    """A CHECK added NOT VALID judges every row an INSERT writes, not the rows already there: a batch big
    enough to be attached refuses the rows a copied one does (23514, quarantined), and the old row that
    breaks it stays."""
    monkeypatch.setattr(partitions, "ATTACH_MIN_ROWS", 3)
    p = make_pipe(max_ratio=0.9)
    commit_batch(engine, p.spec, staged_batch(engine, p, {0: (0, 3)}, good=[(0, 0, "o-0", "-1.00"), (0, 1, "o-1", "5.00"),
                                                                           (0, 2, "o-2", "5.00")]).batch_id)
    _user(engine, p, "ALTER TABLE {t} ADD CONSTRAINT positive CHECK (amount > 0) NOT VALID")
    big = staged_batch(engine, p, {0: (3, 6)}, good=[(0, 3, "o-3", "-3.00"), (0, 4, "o-4", "7.00"), (0, 5, "o-5", "8.00")])
    assert commit_batch(engine, p.spec, big.batch_id).rows_rejected == 1
    assert _attached(engine, p, big)  # no index of the user's: the staging table without its refused row
    small = staged_batch(engine, p, {0: (6, 8)}, good=[(0, 6, "o-6", "-6.00"), (0, 7, "o-7", "9.00")])
    assert commit_batch(engine, p.spec, small.batch_id).rows_rejected == 1

    assert [(r[1], r[3]) for r in target(engine, p)] == [(0, "-1.00"), (1, "5.00"), (2, "5.00"), (4, "7.00"),
                                                         (5, "8.00"), (7, "9.00")]
    assert [r[1:5] for r in refused(engine, p)] == [(3, big.batch_id, "23514", "positive"),
                                                    (6, small.batch_id, "23514", "positive")]
    with engine.connect() as conn:  # the constraint is as the user left it: NOT VALID on the target
        assert conn.execute(text("SELECT convalidated FROM pg_constraint WHERE conname = 'positive' "
                                 "AND conrelid = CAST(:t AS regclass)"), {"t": f'public."{p.table}"'}).scalar_one() is False
    assert verify(engine, p.spec) == []


def test_a_not_valid_check_on_a_clean_attached_batch_attaches_it(engine, make_pipe, monkeypatch):
    """No row breaks it: the staging table takes the CHECK validated and is attached as it is."""
    monkeypatch.setattr(partitions, "ATTACH_MIN_ROWS", 2)
    p = make_pipe(max_ratio=0.9)
    commit_batch(engine, p.spec, staged_batch(engine, p, {0: (0, 1)}, good=[(0, 0, "o-0", "-1.00")]).batch_id)
    _user(engine, p, "ALTER TABLE {t} ADD CONSTRAINT positive CHECK (amount > 0) NOT VALID")
    s = staged_batch(engine, p, {0: (1, 3)}, good=[(0, 1, "o-1", "1.00"), (0, 2, "o-2", "2.00")])
    assert commit_batch(engine, p.spec, s.batch_id).rows_rejected == 0
    assert _partitions_of_rows(engine, p)[1] == f"{p.table}_b{s.batch_id}" and _attached(engine, p, s)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM pg_constraint WHERE conname = 'positive' AND convalidated "
                                 "AND conrelid = CAST(:t AS regclass)"),
                            {"t": f"public.{p.table}_b{s.batch_id}"}).scalar_one() == 1
    assert verify(engine, p.spec) == []

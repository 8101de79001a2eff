"""The hostile-target contract: a target table with rules of its own (triggers, CHECKs that compute or read
columns the user added, DEFAULT, identity and generated columns, deferred constraints, an exclusion
constraint, a partial unique index, a narrowed type, a CHECK added NOT VALID, a trigger raising its own
SQLSTATE, an index whose entry for one row is too long), in every target mode and both append paths, under a
live batch, a replay and a backfill. Every time: the good rows written once, the refused rows quarantined
once with their SQLSTATE and constraint, the counts reconciled, `verify` and the per-key comparison of
`verify --deep` clean, and a second replay of the range changes nothing. An aggregate's group stands for
records nobody can name: a refused group fails the batch with the server's reason, nothing written, the
batch staged for a retry after the fix.

Batches are staged by hand (staged.py), so only PostgreSQL is needed; `verify --deep` compares the
target with the records as its re-read stages them (ops/deep_verify.py: compare). Its end-to-end run on
real Kafka and Spark is test_deep_verify.py."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from sqlalchemy import text

from ledgerbatch.commit.modes import partitions
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.commit.modes.catalog import mode_for
from ledgerbatch.errors import RowsRefusedError
from ledgerbatch.model.batch import BatchKind, BatchStatus
from ledgerbatch.model.ranges import OffsetRange
from ledgerbatch.model.deep_reads import layers, read_of
from ledgerbatch.ops.deep_verify import chosen_ranges, compare
from ledgerbatch.ops.verify import verify
from ledgerbatch.plan.replay import plan_replay

from .staged import Pipe, batch, begin, fill, refused, staged_batch, target, target_shape

pytestmark = pytest.mark.integration

# Partition 0's records, offsets 0..7: each rule below refuses some of them (by order id).
RECORDS = [(0, 0, "o-0", "1.00"), (0, 1, "o-1", "2.00"), (0, 2, "o-2", "0.00"), (0, 3, "o-3", "4.00"),
           (0, 4, "o-4", "500.00"), (0, 5, "o-5", "6.00"), (0, 6, "o-6", "2.00"), (0, 7, "o-77", "8.00")]
DELETE = (0, 8, "o-3", None)  # a change pipeline's records end with a delete of o-3
EARLIER = "o-9", "9.00"  # a batch before the one under test, that no rule refuses


@dataclass(frozen=True)
class Rule:
    name: str
    statements: tuple[str, ...]  # {t}: the target; {n}: the pipeline's name, a prefix of the rule's own objects
    # (the schema's names are shared), {k}: see below
    refuses: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # order id -> (SQLSTATE, constraint)
    partitioned_ok: bool = True  # PostgreSQL 15 has no exclusion constraint on a partitioned table


TRIGGER = ("CREATE FUNCTION {n}_embargo() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
           "IF NEW.order_id = 'o-4' THEN RAISE EXCEPTION 'order o-4 is embargoed'; END IF; RETURN NEW; END $$")
OWN_CODE = ("CREATE FUNCTION {n}_embargo() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.order_id = 'o-4' THEN "
            "RAISE EXCEPTION 'order o-4 is embargoed' USING ERRCODE = 'LB001'; END IF; RETURN NEW; END $$")
# An index entry of random bytes, 704 per character of the order id: o-77's (2,816 bytes) is over the btree
# maximum (2,704), the others' (2,112) are not; random bytes do not compress.
WIDE = ("CREATE FUNCTION {n}_wide(text) RETURNS bytea IMMUTABLE LANGUAGE sql AS $$ SELECT decode(string_agg("
        "md5($1 || i), '' ORDER BY i), 'hex') FROM generate_series(1, 44 * length($1)) i $$")
AUDIT = ("CREATE FUNCTION {n}_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
         "INSERT INTO {n}_audit VALUES (to_jsonb(NEW)); RETURN NEW; END $$")
# {k}: what a unique constraint covers; an append target is partitioned by _batch_id, which it must include
RULES = [
    Rule("before trigger refuses", (TRIGGER, "CREATE TRIGGER embargo BEFORE INSERT OR UPDATE ON {t} "
                                             "FOR EACH ROW EXECUTE FUNCTION {n}_embargo()"),
         {"o-4": ("P0001", None)}),
    Rule("trigger with its own SQLSTATE", (OWN_CODE, "CREATE TRIGGER embargo BEFORE INSERT OR UPDATE ON {t} "
                                                     "FOR EACH ROW EXECUTE FUNCTION {n}_embargo()"),
         {"o-4": ("LB001", None)}),
    Rule("after trigger audits", ("CREATE TABLE {n}_audit (new jsonb)", AUDIT,
                                  "CREATE TRIGGER audit AFTER INSERT OR UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION {n}_audit()",
                                  "ALTER TABLE {t} ADD CONSTRAINT {n}_cap CHECK (amount <= 100)"),
         {"o-4": ("23514", "cap")}),
    Rule("CHECK that divides", ("ALTER TABLE {t} ADD CONSTRAINT {n}_per_mille CHECK (1000 / amount <= 500)",),
         {"o-0": ("23514", "per_mille"), "o-2": ("22012", None)}),
    Rule("CHECK added NOT VALID", ("ALTER TABLE {t} ADD CONSTRAINT {n}_cap CHECK (amount <= 100) NOT VALID",),
         {"o-4": ("23514", "cap")}),
    Rule("index entry too long", (WIDE, "CREATE INDEX {n}_wide ON {t} ({n}_wide(order_id))"),
         {"o-77": ("54000", "wide")}),
    Rule("CHECK over an added column", ("ALTER TABLE {t} ADD COLUMN channel text NOT NULL DEFAULT 'web'",
                                        "ALTER TABLE {t} ADD CONSTRAINT {n}_vip_only CHECK (amount <= 100 OR channel = 'vip')"),
         {"o-4": ("23514", "vip_only")}),
    Rule("NOT NULL DEFAULT column", ("ALTER TABLE {t} ADD COLUMN loaded_at timestamptz NOT NULL DEFAULT now()",)),
    Rule("identity column", ("ALTER TABLE {t} ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY",)),
    Rule("generated column", ("ALTER TABLE {t} ADD COLUMN doubled numeric GENERATED ALWAYS AS (amount * 2) STORED",)),
    Rule("deferred foreign key", ("CREATE TABLE {n}_known (order_id text PRIMARY KEY)",
                                  "INSERT INTO {n}_known VALUES ('o-0'), ('o-1'), ('o-2'), ('o-3'), ('o-4'), ('o-6'), "
                                  "('o-77'), ('o-9')",
                                  "ALTER TABLE {t} ADD CONSTRAINT {n}_known_order FOREIGN KEY (order_id) REFERENCES {n}_known "
                                  "DEFERRABLE INITIALLY DEFERRED"),
         {"o-5": ("23503", "known_order")}),
    Rule("deferred unique", ("ALTER TABLE {t} ADD CONSTRAINT {n}_one_amount UNIQUE ({k}) DEFERRABLE INITIALLY DEFERRED",),
         {"o-6": ("23505", "one_amount")}),  # o-1 has the amount first
    Rule("exclusion constraint", ("ALTER TABLE {t} ADD CONSTRAINT {n}_apart EXCLUDE USING gist "
                                  "(numrange(amount, amount, '[]') WITH &&)",),
         {"o-6": ("23P01", "apart")}, partitioned_ok=False),
    Rule("partial unique index", ("CREATE UNIQUE INDEX {n}_big_amounts ON {t} ({k}) WHERE amount > 1",),
         {"o-6": ("23505", "big_amounts")}),
    Rule("narrowed varchar", ("ALTER TABLE {t} ALTER COLUMN order_id TYPE varchar(3)",),
         {"o-77": ("22001", None)}),
]


@dataclass(frozen=True)
class Mode:
    name: str
    pipe: dict
    attach_min_rows: int = partitions.ATTACH_MIN_ROWS

    @property
    def records(self) -> list[tuple]:
        return RECORDS + [DELETE] if self.pipe.get("deletes") else RECORDS


MODES = [
    Mode("append, copied", {"mode": "append"}),
    Mode("append, attached", {"mode": "append"}, attach_min_rows=1),  # every batch its own partition
    Mode("upsert", {"mode": "upsert"}),
    Mode("versioned upsert", {"mode": "upsert", "version": "ts"}),
    Mode("changes with deletes", {"mode": "upsert", "deletes": True}),
    Mode("aggregate", {"mode": "aggregate"}),
]
KINDS = [BatchKind.LIVE, BatchKind.REPLAY, BatchKind.BACKFILL]


def _cases():
    for mode in MODES:
        for kind in KINDS:
            for rule in RULES:
                if rule.partitioned_ok or mode.pipe["mode"] != "append":
                    yield pytest.param(mode, kind, rule, id=f"{mode.name}-{kind}-{rule.name}".replace(" ", "_"))


@pytest.mark.parametrize("mode, kind, rule", list(_cases()))
def test_hostile_target(mode: Mode, kind: BatchKind, rule: Rule, engine, make_pipe, monkeypatch):
    monkeypatch.setattr(partitions, "ATTACH_MIN_ROWS", mode.attach_min_rows)
    p = make_pipe(max_ratio=0.9, **mode.pipe)
    with engine.begin() as conn:
        mode_for(p.spec).ensure_target(conn, p.spec, target_shape(p))
        for statement in rule.statements:
            conn.execute(text(statement.format(t=f'public."{p.table}"', n=p.name,
                                               k="amount, _batch_id" if mode.pipe["mode"] == "append" else "amount")))
    # A batch before the one under test: a backfill's comes after the records, in partition 0; else partition 1.
    earlier = (0, 20, *EARLIER) if kind == BatchKind.BACKFILL else (1, 0, *EARLIER)
    commit_batch(engine, p.spec, staged_batch(engine, p, {earlier[0]: (earlier[1], earlier[1] + 1)},
                                              good=[earlier]).batch_id)
    kafka = [earlier] + mode.records
    span = {0: (0, len(mode.records))}
    delivered = _deliver(engine, p, span, mode.records, BatchKind.LIVE if kind == BatchKind.REPLAY else kind, rule)
    if delivered is None:  # an aggregate refused a group: it failed, nothing written
        return
    if kind == BatchKind.REPLAY:
        delivered = _deliver(engine, p, span, mode.records, kind, rule)
    _assert_delivered(engine, p, mode, rule, kafka, delivered)
    before = _state(engine, p)
    again = _deliver(engine, p, span, mode.records, BatchKind.REPLAY, rule)
    assert _state(engine, p) == before  # a second replay of the range changes nothing
    _assert_delivered(engine, p, mode, rule, kafka, again)


def _deliver(engine, p: Pipe, span, records, kind, rule: Rule) -> int | None:
    """Stage and commit the records as a batch of `kind`; None where an aggregate's target refused a group."""
    s = staged_batch(engine, p, span, good=records, kind=kind)
    if p.spec.mode == "aggregate" and rule.refuses:
        with pytest.raises(RowsRefusedError) as failed:
            commit_batch(engine, p.spec, s.batch_id)
        sqlstate, constraint = next(iter(rule.refuses.values()))
        assert "the target refused a group" in str(failed.value) and "nothing was written" in str(failed.value)
        assert batch(engine, s.batch_id).status == BatchStatus.STAGED  # a retry after the fix commits it
        assert [g[:3] for g in target(engine, p)] == [(EARLIER[0], 1, EARLIER[1])]
        assert verify(engine, p.spec) == []
        return None
    result = commit_batch(engine, p.spec, s.batch_id)
    assert not result.already_committed
    return s.batch_id


def _assert_delivered(engine, p: Pipe, mode: Mode, rule: Rule, kafka: list[tuple], batch_id: int) -> None:
    refusing = {oid: (sqlstate, constraint and f"{p.name}_{constraint}")
                for oid, (sqlstate, constraint) in rule.refuses.items()}
    if mode.pipe["mode"] == "aggregate":
        expected = sorted((oid, 1, amount) for _, _, oid, amount in kafka)
        assert [g[:3] for g in target(engine, p)] == expected
    else:
        deleted = {r[2] for r in kafka if r[3] is None}
        expected = [(part, off, oid, amount) for part, off, oid, amount in kafka
                    if amount is not None and oid not in refusing and oid not in deleted]
        assert sorted(r[:4] for r in target(engine, p)) == sorted(expected)  # every good row, once
        quarantined = [(part, off, sqlstate, constraint) for part, off, _, sqlstate, constraint, _ in refused(engine, p)]
        assert quarantined == sorted((part, off, *refusing[oid]) for part, off, oid, _ in kafka if oid in refusing)
        assert all(b == batch_id for _, _, b, *_ in refused(engine, p))  # quarantined by the last delivery, once
        b = batch(engine, batch_id)
        assert b.rows_rejected == len(refusing)
        assert b.records_read == len(mode.records)
    assert verify(engine, p.spec) == []
    assert _deep_problems(engine, p, kafka) == []
    _assert_rule_effects(engine, p, rule)


def _assert_rule_effects(engine, p: Pipe, rule: Rule) -> None:
    """What the rule's own columns and tables hold: every row as an INSERT by the user would write it."""
    t = f'public."{p.table}"'
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
        one = lambda sql: conn.execute(text(sql.format(t=t, n=f"public.{p.name}"))).scalar_one()  # noqa: E731
        if rule.name == "after trigger audits":  # each publish's rows audited once, the probes' never
            audited = conn.execute(text(f"SELECT (new ->> '_batch_id')::bigint, new ->> '_partition', new ->> '_offset' "
                                        f"FROM public.{p.name}_audit")).all()
            assert len(audited) == len(set(audited))
            last = one("SELECT max(_batch_id) FROM {t}")
            kept = conn.execute(text(f"SELECT _batch_id, _partition::text, _offset::text FROM {t} "
                                     "WHERE _batch_id = :b"), {"b": last}).all()
            assert sorted(a for a in audited if a[0] == last) == sorted(kept)
        elif rule.name == "CHECK over an added column":
            assert one("SELECT count(*) FROM {t} WHERE channel = 'web'") == rows
        elif rule.name == "NOT NULL DEFAULT column":
            assert one("SELECT count(*) FROM {t} WHERE loaded_at IS NOT NULL") == rows
        elif rule.name == "identity column":
            assert one("SELECT count(DISTINCT id) FROM {t}") == rows
        elif rule.name == "generated column":
            assert one("SELECT count(*) FROM {t} WHERE doubled = amount * 2") == rows


def _deep_problems(engine, p: Pipe, kafka: list[tuple]) -> list[str]:
    """verify --deep's comparison, with the committed ranges staged again from the records Kafka holds."""
    problems = []
    for layer in layers(chosen_ranges(engine, p.spec)):
        ranges, batches = read_of(layer)
        again = plan_replay(engine, p.spec, ranges)
        s = begin(engine, p, again.batch_id)
        fill(engine, p, s, good=[r for r in kafka if any(_holds(g, r) for g in ranges)])
        problems += compare(engine, p.spec, again.batch_id, ranges, batches)
    return problems


def _holds(r: OffsetRange, record: tuple) -> bool:
    return r.partition == record[0] and r.from_offset <= record[1] < r.until_offset


def _state(engine, p: Pipe) -> tuple:
    """What a replay may not change: the target's values (all but the batch id), and the quarantine's reasons."""
    return (sorted(r[:-1] for r in target(engine, p)),
            [(part, off, sqlstate, constraint) for part, off, _, sqlstate, constraint, _ in refused(engine, p)])


@pytest.mark.parametrize("pipe", [{"mode": "upsert"}, {"mode": "upsert", "deletes": True}, {"mode": "append"}])
def test_rows_a_rule_sets_against_each_other_are_judged_in_offset_order(pipe, engine, make_pipe):
    """A unique index across two keys of one batch: the record that came first keeps the value, whatever
    the order of the keys."""
    p = make_pipe(max_ratio=0.9, **pipe)
    with engine.begin() as conn:
        mode_for(p.spec).ensure_target(conn, p.spec, target_shape(p))
        k = "amount, _batch_id" if pipe["mode"] == "append" else "amount"
        conn.execute(text(f'CREATE UNIQUE INDEX {p.name}_one_amount ON public."{p.table}" ({k})'))
    records = [(0, 0, "o-9", "2.00"), (0, 1, "o-1", "2.00"), (0, 2, "o-5", "3.00")]
    s = staged_batch(engine, p, {0: (0, 3)}, good=records)
    assert commit_batch(engine, p.spec, s.batch_id).rows_rejected == 1
    assert sorted(r[:4] for r in target(engine, p)) == [(0, 0, "o-9", "2.00"), (0, 2, "o-5", "3.00")]
    assert [r[:2] + r[3:5] for r in refused(engine, p)] == [(0, 1, "23505", f"{p.name}_one_amount")]

"""Tampering (machine.tamper): one change behind the product's back, made and undone by hand, so that the
checks can ask that `verify` (or `verify --deep`) names it and that the history goes on clean once it is
undone. A moved range is one of a live batch or a backfill: those tile a partition, so one moved leaves a
gap and an overlap (a replay's range only repeats offsets delivered). Triggers and foreign keys of the user's are not fired (session_replication_role replica): the
tampering is the database's owner's, not a writer's; only rows whose amount stays positive are touched, so
a user's CHECK holds both ways."""
from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from ledgerbatch.commit.target import table_exists
from ledgerbatch.ledger.compaction import detailed_from

HOW = ("change", "delete", "duplicate", "move_range")
COPY_AT = 1_000_000  # a duplicated row's offset is its own plus this


def tamper(engine, pipe, how: str, pick: int, lows: list[int]) -> Callable[[], None] | None:
    """Make the change `how` to the `pick`-th candidate (modulo their number); the undo, or None when there
    is nothing to change that a check can name (no row, no range; `lows`: where Kafka's logs start), or the
    target's own keys refuse it (a duplicate in upsert)."""
    table = f'public."{pipe.table}"'
    ident = "order_id" if pipe.spec.mode == "aggregate" else "_partition, _offset"
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        if how == "move_range":
            row = conn.execute(text(
                "SELECT r.batch_id, r.partition, r.from_offset FROM ledger.batch_ranges r JOIN ledger.batches b "
                "USING (batch_id) WHERE b.pipeline = :p AND b.status = 'committed' AND b.kind <> 'replay' "
                "ORDER BY 1, 2 OFFSET :n LIMIT 1"),
                {"p": pipe.name, "n": pick % max(1, _count(conn, pipe))}).first()
            if row is None:
                return None
            shift = ("UPDATE ledger.batch_ranges SET from_offset = from_offset + :d, until_offset = until_offset + :d "
                     "WHERE batch_id = :b AND partition = :part")
            where = {"b": row.batch_id, "part": row.partition}
            try:
                with conn.begin_nested():
                    conn.execute(text(shift), {**where, "d": 1})
            except IntegrityError:  # the ledger's own constraints refuse it: nothing moved
                return None
            return lambda: _run(engine, shift, {**where, "d": -1})
        among = "amount > 0"
        if how == "change" or pipe.spec.mode != "append":
            # Named only where verify --deep reads the row's records again: a batch not compacted (compacted
            # history is proven by tiling and counts, which a changed value keeps, as an upsert target's rows
            # do not count), and records Kafka still holds. Append's counts name a row deleted or doubled.
            if pipe.spec.mode == "aggregate" and any(lows):
                return None
            detailed = detailed_from(conn, pipe.name)
            among += f" AND _batch_id >= {detailed}" + "".join(
                f" AND (_partition <> {p} OR _offset >= {low})" for p, low in enumerate(lows)
                if pipe.spec.mode != "aggregate")
            if pipe.spec.mode != "aggregate":
                # and the row's offset lies in a live or backfill range not compacted: those are what --deep
                # reads (ledger_deep_verify.sql: delivered_ranges). A replay not compacted of offsets a
                # compacted batch delivered writes rows of its own batch id, yet --deep does not read them.
                among += (" AND EXISTS (SELECT 1 FROM ledger.batch_ranges r JOIN ledger.batches b USING (batch_id) "
                          f"WHERE b.pipeline = '{pipe.name}' AND b.kind IN ('live', 'backfill') AND "
                          f"b.status = 'committed' AND b.batch_id >= {detailed} AND r.topic = _topic AND "
                          "r.partition = _partition AND _offset >= r.from_offset AND _offset < r.until_offset)")
        n = table_exists(conn, "public", pipe.table) and conn.execute(text(
            f"SELECT count(*) FROM {table} WHERE {among}")).scalar_one()
        if not n:
            return None
        row = conn.execute(text(f"SELECT {ident} FROM {table} WHERE {among} ORDER BY {ident} OFFSET :n LIMIT 1"),
                           {"n": pick % n}).first()
        key = dict(row._mapping)
        chosen = " AND ".join(f"{k} = :{k}" for k in key)
        if how == "change":
            change = f"UPDATE {table} SET amount = amount + :d WHERE {chosen}"
            conn.execute(text(change), {**key, "d": 100})
            return lambda: _run(engine, change, {**key, "d": -100})
        if how == "delete":
            gone = conn.execute(text(f"DELETE FROM {table} AS t WHERE {chosen} RETURNING row_to_json(t.*)::text"),
                                key).scalar_one()
            return lambda: _run(engine, f"INSERT INTO {table} SELECT * FROM json_populate_record(NULL::{table}, :row)",
                                {"row": gone})
        if pipe.spec.mode != "append":  # the target's key: no second row of a key can be made
            return None
        # a copy of the row's values at an offset no batch delivered (the coordinates are unique)
        copy = conn.execute(text(
            f"INSERT INTO {table} SELECT * FROM jsonb_populate_record(NULL::{table}, (SELECT to_jsonb(x) || "
            f"jsonb_build_object('_offset', x._offset + {COPY_AT}) FROM {table} x WHERE {chosen})) "
            "RETURNING tableoid, ctid::text"), key).first()
        return lambda: _run(engine, f"DELETE FROM {table} WHERE tableoid = :o AND ctid = CAST(:c AS tid)",
                            {"o": copy[0], "c": copy[1]})


def _count(conn, pipe) -> int:
    return conn.execute(text("SELECT count(*) FROM ledger.batch_ranges r JOIN ledger.batches b USING (batch_id) "
                             "WHERE b.pipeline = :p AND b.status = 'committed' AND b.kind <> 'replay'"),
                        {"p": pipe.name}).scalar_one()


def _run(engine, statement: str, params: dict) -> None:
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(text(statement), params)

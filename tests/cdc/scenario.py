"""One scripted change history on a source table, and the Debezium events it must produce.

Used by the capture test and by `make_samples.py`, so the saved samples are exactly what the test checks.
The table has the column types a CDC sink meets first (the DESIGN.md example plus a date and a timestamptz),
with edge values: NULLs, a negative and a 10-digit decimal, a date before 1970, quotes and non-ASCII text.

Row images are kept as Python values (Decimal, datetime, date); `as_text` turns them into the canonical
text form the samples carry.
"""
from __future__ import annotations

import base64
import contextlib
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

COLUMNS = ("id", "owner", "balance", "active", "updated", "opened", "seen")
DDL = ("id INT PRIMARY KEY, owner TEXT, balance NUMERIC(12,2), active BOOLEAN, updated TIMESTAMP, "
       "opened DATE, seen TIMESTAMPTZ")
UTC = timezone.utc


def row(id, owner, balance, active, updated, opened, seen):  # noqa: A002 - the column's name
    return {"id": id, "owner": owner, "balance": None if balance is None else Decimal(balance), "active": active,
            "updated": updated, "opened": opened, "seen": seen}


SNAPSHOT = [
    row(1, "ann", "10.50", True, datetime(2026, 1, 2, 3, 4, 5, 123456), date(2026, 1, 2),
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
    row(2, "bob", "-3.00", False, None, None, None),
    row(3, "chloé \"q\" 'x'", "9999999999.99", True, datetime(1999, 12, 31, 23, 59, 59), date(1969, 12, 31),
        datetime(1999, 12, 31, 23, 59, 59, 500000, tzinfo=UTC)),
    row(4, "dan", "0.01", None, datetime(2026, 6, 1), date(2026, 6, 1), datetime(2026, 6, 1, tzinfo=UTC)),
    row(5, None, None, True, None, date(2000, 2, 29), None),
]

# Each inner list is one source transaction. ("insert", row) | ("update", id, {column: value}) | ("delete", id).
TRANSACTIONS = [
    [("insert", row(6, "eve", "100.00", True, datetime(2026, 11, 1, 12, 0), date(2026, 11, 1),
                    datetime(2026, 11, 1, 12, 0, tzinfo=UTC))),
     ("insert", row(7, "fay", "-0.99", False, None, None, None))],
    [("update", 1, {"owner": "ann b.", "balance": Decimal("-1234567.89"), "seen": None}),
     ("update", 6, {"active": False, "balance": Decimal("100.01")})],
    [("delete", 2)],
    [("insert", row(8, "gus", "8.00", True, None, None, None)),  # inserted and deleted in one transaction
     ("delete", 8)],
    [("update", 3, {"id": 30})],  # the key changes: Debezium emits d + tombstone for 3, then c for 30
    [("update", 4, {"active": True}), ("update", 4, {"balance": Decimal("4.40")})],  # one key twice in a tx
]


# Applied after TRANSACTIONS in the Avro capture (make_samples.py): a column added to the source table
# mid-stream, then changes that carry it (Debezium registers a new value schema with the column).
ADDED_COLUMN = "note TEXT"
EVOLUTION = [("update", 1, {"note": "vip"}),
             ("insert", {**row(9, "ivy", "9.90", True, None, None, None), "note": "new"})]


@dataclass(frozen=True)
class Expected:
    """One event Debezium must emit: its key id, op (None for a tombstone), before and after images."""
    key: int
    op: str | None
    before: dict | None
    after: dict | None
    tx: int | None  # index into TRANSACTIONS; None for the snapshot


def expected_events(replica_identity_full: bool) -> list[Expected]:
    """The events in source order, as pgoutput + Debezium (default settings, tombstones on) emit them.

    With REPLICA IDENTITY FULL, updates and deletes carry the whole old row as `before`; with the default
    identity an update has `before` null and a delete's `before` holds only the key (other columns null).
    """
    state = {r["id"]: dict(r) for r in SNAPSHOT}
    out = [Expected(r["id"], "r", None, dict(r), None) for r in SNAPSHOT]

    def old_image(k):
        if replica_identity_full:
            return dict(state[k])
        return {c: (k if c == "id" else None) for c in COLUMNS}

    for tx, changes in enumerate(TRANSACTIONS):
        for change in changes:
            if change[0] == "insert":
                new = dict(change[1])
                state[new["id"]] = new
                out.append(Expected(new["id"], "c", None, dict(new), tx))
            elif change[0] == "delete":
                k = change[1]
                out.append(Expected(k, "d", old_image(k), None, tx))
                out.append(Expected(k, None, None, None, tx))
                del state[k]
            else:
                _, k, values = change
                new = {**state[k], **values}
                if new["id"] != k:
                    out.append(Expected(k, "d", old_image(k), None, tx))
                    out.append(Expected(k, None, None, None, tx))
                    del state[k]
                    state[new["id"]] = new
                    out.append(Expected(new["id"], "c", None, dict(new), tx))
                else:
                    before = dict(state[k]) if replica_identity_full else None
                    state[k] = new
                    out.append(Expected(k, "u", before, dict(new), tx))
    return out


def evolution_events() -> list[Expected]:
    """The events of EVOLUTION on the REPLICA IDENTITY FULL table, after expected_events(True)."""
    state = {k: {**v, "note": None} for k, v in final_rows().items()}
    out = []
    for change in EVOLUTION:
        if change[0] == "insert":
            state[change[1]["id"]] = dict(change[1])
            out.append(Expected(change[1]["id"], "c", None, dict(change[1]), len(TRANSACTIONS)))
        else:
            _, k, values = change
            before, state[k] = state[k], {**state[k], **values}
            out.append(Expected(k, "u", dict(before), dict(state[k]), len(TRANSACTIONS)))
    return out


def final_rows(evolved: bool = False) -> dict[int, dict]:
    """The table's rows after every transaction (and, evolved, after EVOLUTION, with `note`), by id."""
    rows = {}
    for e in expected_events(True) + (evolution_events() if evolved else []):
        if e.op in ("r", "c", "u"):
            rows[e.key] = e.after
        elif e.op == "d":
            rows.pop(e.key, None)
    return rows


def create_table(conn, table: str, replica_identity_full: bool) -> None:
    """Create `table` (public schema) with the snapshot rows; conn is a psycopg2 connection."""
    with conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} ({DDL})")
        if replica_identity_full:
            cur.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
        for r in SNAPSHOT:
            _insert(cur, table, r)


def apply_evolution(conn, table: str) -> None:
    """Add ADDED_COLUMN to `table`, then run EVOLUTION in one transaction."""
    with conn, conn.cursor() as cur:
        cur.execute(f"ALTER TABLE {table} ADD COLUMN {ADDED_COLUMN}")
    apply_transactions(conn, table, [EVOLUTION])


def apply_transactions(conn, table: str, transactions: list[list[tuple]] = TRANSACTIONS) -> None:
    """Run `transactions` against `table`, each in its own transaction."""
    for changes in transactions:
        with conn, conn.cursor() as cur:
            for change in changes:
                if change[0] == "insert":
                    _insert(cur, table, change[1])
                elif change[0] == "delete":
                    cur.execute(f"DELETE FROM {table} WHERE id = %s", (change[1],))
                else:
                    _, k, values = change
                    sets = ", ".join(f"{c} = %s" for c in values)
                    cur.execute(f"UPDATE {table} SET {sets} WHERE id = %s", (*values.values(), k))
                if cur.rowcount != 1:
                    raise AssertionError(f"{change} touched {cur.rowcount} rows of {table}")


def _insert(cur, table, r):
    cur.execute(f"INSERT INTO {table} ({', '.join(r)}) VALUES ({', '.join(['%s'] * len(r))})", list(r.values()))


def read_table(conn, table: str) -> dict[int, dict]:
    with contextlib.closing(conn.cursor()) as cur:
        cur.execute(f"SELECT {', '.join(COLUMNS)} FROM {table}")
        return {r[0]: dict(zip(COLUMNS, r)) for r in cur.fetchall()}


def as_text(image: dict | None) -> dict | None:
    """A row image in the samples' canonical text form: decimals as strings ("10.50"), TIMESTAMP as
    "YYYY-MM-DDTHH:MM:SS[.ffffff]", DATE as "YYYY-MM-DD", TIMESTAMPTZ in UTC as "...+00:00"; NULL as null.
    Columns in the image's order (COLUMNS, then `note` after EVOLUTION)."""
    if image is None:
        return None
    out = {}
    for c, v in image.items():
        if isinstance(v, Decimal):
            v = str(v)
        elif isinstance(v, datetime):
            v = (v.astimezone(UTC) if v.tzinfo else v).isoformat()
        elif isinstance(v, date):
            v = v.isoformat()
        out[c] = v
    return out


EPOCH = datetime(1970, 1, 1)


def decode_image(image: dict | None, decimal_mode: str) -> dict | None:
    """A Debezium row image of the scenario table back to Python values (the harness's check, not the sink's)."""
    if image is None:
        return None
    assert set(image) == set(COLUMNS), image
    out = dict(image)
    if image["balance"] is not None:
        if decimal_mode == "precise":  # base64 of the big-endian two's-complement unscaled value; scale 2
            unscaled = int.from_bytes(base64.b64decode(image["balance"]), "big", signed=True)
            out["balance"] = Decimal(unscaled).scaleb(-2)
        else:
            out["balance"] = Decimal(image["balance"])
    if image["updated"] is not None:  # io.debezium.time.MicroTimestamp
        out["updated"] = EPOCH + timedelta(microseconds=image["updated"])
    if image["opened"] is not None:  # io.debezium.time.Date: days since the epoch
        out["opened"] = date(1970, 1, 1) + timedelta(days=image["opened"])
    if image["seen"] is not None:  # io.debezium.time.ZonedTimestamp: ISO-8601 text in UTC
        out["seen"] = datetime.fromisoformat(image["seen"].replace("Z", "+00:00")).astimezone(UTC)
    return out

"""ledger.quarantine: bad records kept with their coordinates, reason and raw bytes."""
from __future__ import annotations

from sqlalchemy.engine import Connection

from ledgerbatch.ledger.sql import run


def quarantine_staged(conn: Connection, bad_table: str, batch_id: int, pipeline: str) -> int:
    """Move an attempt's bad records into ledger.quarantine; returns how many."""
    return run(conn, "insert_quarantine", {"batch_id": batch_id, "pipeline": pipeline}, bad=bad_table).rowcount


def clear_quarantine(conn: Connection, batch_id: int) -> int:
    """A replay replaces what earlier deliveries of its ranges quarantined; returns how many it removed."""
    return run(conn, "delete_quarantine_in_ranges", {"batch_id": batch_id}).rowcount


def quarantined_count(conn: Connection, pipeline: str) -> int:
    return run(conn, "quarantined_count", {"pipeline": pipeline}).scalar_one()


def quarantine_refused(conn: Connection, units_table: str, batch_id: int, pipeline: str, refused) -> None:
    """Rows the target refused (commit/rejects.py: `refused` numbers them in `units_table`), with the
    server's SQLSTATE, constraint and message, and its detail (the row's values) apart."""
    run(conn, "quarantine_rejects", {"batch_id": batch_id, "pipeline": pipeline, "units": [r.unit for r in refused],
                                     "sqlstates": [r.sqlstate for r in refused],
                                     "constraints": [r.constraint for r in refused],
                                     "messages": [r.message for r in refused],
                                     "details": [r.detail for r in refused]}, units=units_table)

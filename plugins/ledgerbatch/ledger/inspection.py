"""Inspection: what `status`, `verify` and the demo's reports read from the ledger
(sql/queries/ledger_status.sql, ledger_verify.sql)."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ledgerbatch.identifiers import quote_ident
from ledgerbatch.ledger.sql import run
from ledgerbatch.sqlfiles import Fragment, query


def partition_status(conn: Connection, pipeline: str) -> list:
    return run(conn, "status_partitions", {"pipeline": pipeline}).all()


def recent_batches(conn: Connection, pipeline: str, limit: int) -> list:
    return run(conn, "status_batches", {"pipeline": pipeline, "limit": limit}).all()


def history(conn: Connection, pipeline: str):
    """What compaction and quarantine retention folded (None: nothing yet)."""
    return run(conn, "status_history", {"pipeline": pipeline}).first()


def last_batch_error(conn: Connection, pipeline: str):
    return run(conn, "status_last_error", {"pipeline": pipeline}).first()


def violations(conn: Connection, pipeline: str) -> list[str]:
    """The ledger's own invariant violations (the view ledger.invariant_violations)."""
    return [row.problem for row in run(conn, "verify_ledger", {"pipeline": pipeline})]


def target_violations(conn: Connection, pipeline: str, schema: str, table: str, counts_add_up: bool) -> list[str]:
    """Target rows against the ledger; with `counts_add_up` (append targets) also rows + quarantined
    = records read by committed batches."""
    params, target = {"pipeline": pipeline}, dict(schema=schema, table=table)
    problems = [row.problem for row in run(conn, "verify_target_rows", params, **target)]
    if counts_add_up:
        problems += [row.problem for row in run(conn, "verify_append_counts", params, **target)]
    return problems


def deleted_key_violations(conn: Connection, pipeline: str, target: dict, deletes: str, key) -> list[str]:
    """A change pipeline's target and its deleted keys (ledger_deletes): every deleted key's delete comes
    from a committed batch inside a committed range, and no key is both a row and deleted."""
    problems = target_violations(conn, pipeline, "ledger_deletes", deletes, False)
    match = Fragment(" AND ".join(f"t.{quote_ident(k)} = d.{quote_ident(k)}" for k in key))
    key_t = Fragment(", ".join(f"t.{quote_ident(k)}" for k in key))
    return problems + [row.problem for row in run(conn, "verify_deleted_keys", {"deletes": deletes}, deletes=deletes,
                                                   match=match, key_t=key_t, **target)]


def run_report(conn: Connection, name: str) -> tuple[str, object]:
    """A named inspection query (report_*) with its SQL text, for printing both."""
    sql = query(name)
    return sql, conn.execute(text(sql))


def aggregate_violations(conn: Connection, pipeline: str, target: dict, contributions: str, key, measures_agg,
                         differs) -> list[str]:
    """An aggregate target against its contributions and the ledger (sql/queries/ledger_verify.sql)."""
    return [row.problem for row in run(conn, "verify_aggregate", {"pipeline": pipeline}, contributions=contributions,
                                        key=key, measures_agg=measures_agg, differs=differs, **target)]

"""Shapes of a pipeline's staging and target tables, and the SQL that fills them (from sql/queries)."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from . import ledger
from .errors import SpecError
from .identifiers import quote_ident
from . import partitions
from .partitions import Partition, plan_publish
from .spec import PipelineSpec
from .sqlfiles import Fragment, query

LINEAGE_TYPES = {"_topic": "text", "_partition": "integer", "_offset": "bigint", "_batch_id": "bigint"}
# information_schema.columns.data_type of each PostgreSQL type ledgerbatch creates
_INFO_TYPES = {"timestamptz": "timestamp with time zone"}


def staging_name(batch_id: int, attempt: int) -> str:
    return f"b{batch_id}_a{attempt}"


def bad_name(staging: str) -> str:
    """The attempt's table of bad records, beside its table of good rows."""
    return f"{staging}_bad"


def partition_name(table: str, batch_id: int) -> str:
    suffix = f"_b{batch_id}"
    return table.encode()[:63 - len(suffix)].decode(errors="ignore") + suffix


def _defs(spec: PipelineSpec) -> Fragment:
    return Fragment(",\n    ".join(f"{quote_ident(c.name)} {c.pg_type}" for c in spec.columns))


def _columns(spec: PipelineSpec) -> list[str]:
    return [c.name for c in spec.columns]


def _set_list(spec: PipelineSpec) -> Fragment:
    updated = _columns(spec) + list(LINEAGE_TYPES)
    return Fragment(", ".join(f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in updated))


def create_staging(conn: Connection, spec: PipelineSpec, staging: str, batch_id: int) -> None:
    conn.execute(text(query("create_staging", staging=staging, bad=bad_name(staging), defs=_defs(spec))),
                 {"batch_id": batch_id})


def staging_sql(spec: PipelineSpec, staging: str) -> dict[str, str]:
    """The statements an executor runs (psycopg2 parameters), by role."""
    names = dict(staging=staging, bad=bad_name(staging))
    return {
        "lock": query("staging_task_lock"),
        "delete": query("staging_delete_partition", **names),
        "copy": query("staging_copy", staging=staging, columns=_columns(spec)),
        "copy_bad": query("staging_copy_bad", bad=bad_name(staging)),
    }


def ensure_target(conn: Connection, spec: PipelineSpec) -> None:
    """Create the target on first use; refuse one whose columns disagree with the spec."""
    if spec.mode == "append":
        sql = query("create_target_append", schema=spec.target_schema, table=spec.target_table, defs=_defs(spec))
    else:
        sql = query("create_target_upsert", schema=spec.target_schema, table=spec.target_table,
                    defs=_defs(spec), key=list(spec.key))
    conn.execute(text(sql))
    actual = {r.column_name: r for r in ledger.table_columns(conn, spec.target_schema, spec.target_table)}
    expected = {c.name: c.pg_type for c in spec.columns} | LINEAGE_TYPES
    problems = []
    for name, pg_type in expected.items():
        col = actual.get(name)
        base = pg_type.split("(")[0]
        if col is None:
            problems.append(f"{name} is missing")
        elif col.data_type != _INFO_TYPES.get(base, base):
            problems.append(f"{name} is {col.data_type}, the spec says {pg_type}")
        elif base == "numeric" and f"numeric({col.numeric_precision},{col.numeric_scale})" != pg_type:
            problems.append(f"{name} is numeric({col.numeric_precision},{col.numeric_scale}), the spec says {pg_type}")
    if problems:
        raise SpecError(f"target table {spec.target_schema}.{spec.target_table} disagrees with the spec: {'; '.join(problems)}")


def staging_complete(conn: Connection, staging: str) -> bool:
    """Both staging tables exist and the good rows carry their batch id (an earlier version staged
    into one table without it)."""
    return conn.execute(text(query("staging_complete")), {"staging": staging, "bad": bad_name(staging)}).scalar_one()


def lock_staging(conn: Connection, staging: str) -> None:
    conn.execute(text(query("lock_staging", staging=staging, bad=bad_name(staging))))


def staged_counts(conn: Connection, staging: str) -> list:
    return conn.execute(text(query("staged_counts", staging=staging, bad=bad_name(staging)))).all()


def staged_overlap(conn: Connection, staging: str) -> int:
    return conn.execute(text(query("staged_overlap", staging=staging, bad=bad_name(staging)))).scalar_one()


def publish_rows(conn: Connection, spec: PipelineSpec, staging: str, batch_id: int, rows: int, replay: bool) -> None:
    """Staged good rows into the target. A replay first removes what earlier deliveries of its ranges
    left in the target (append) and in quarantine; an upsert replay keeps newer values."""
    target = dict(schema=spec.target_schema, table=spec.target_table)
    params = dict(staging=staging, columns=_columns(spec), **target)
    if replay:
        conn.execute(text(query("delete_quarantine_in_ranges")), {"batch_id": batch_id})
    if spec.mode == "upsert":
        name = "replay_upsert" if replay else "insert_upsert"
        conn.execute(text(query(name, key=list(spec.key), set_list=_set_list(spec), **params)), {"batch_id": batch_id})
        return
    if replay:
        conn.execute(text(query("delete_target_in_ranges", **target)), {"batch_id": batch_id})
    layout = conn.execute(text(query("target_layout")), target).one()
    plan = None  # a target created before targets were partitioned only takes copies
    if layout.partitioned:
        existing = [Partition(r.name, r.lower, r.upper) for r in conn.execute(text(query("target_partitions")), target)]
        plan = plan_publish(batch_id, rows, existing, partitions.ATTACH_MIN_ROWS)
    if plan is None or not plan.attach:
        conn.execute(text(query("insert_append", **params)))
        return
    if not layout.can_attach:
        raise SpecError(f"target {spec.target_schema}.{spec.target_table}: this login may not add partitions to it: "
                        f"it must own the table (or be a member of its owner role) and may CREATE in its schema")
    if plan.close:
        conn.execute(text(query("close_partition", partition=plan.close.name, **target)),
                     {"lower": plan.close.lower, "upper": batch_id})
    upper = Fragment("MAXVALUE" if plan.upper is None else str(int(plan.upper)))
    conn.execute(text(query("attach_partition", staging=staging, partition=partition_name(spec.target_table, batch_id),
                            upper=upper, **target)), {"batch_id": batch_id})


def quarantine_rows(conn: Connection, staging: str, batch_id: int, pipeline: str) -> int:
    return conn.execute(text(query("insert_quarantine", bad=bad_name(staging))),
                        {"batch_id": batch_id, "pipeline": pipeline}).rowcount


def drop_staging(conn: Connection, staging: str) -> None:
    conn.execute(text(query("drop_staging", staging=staging, bad=bad_name(staging))))


def drop_finished_staging(engine: Engine, pipeline: str) -> list[str]:
    """Best effort: staging tables of the pipeline's finished batches (a crash can leave them)."""
    with engine.connect() as conn:
        names = [r.table_name for r in conn.execute(text(query("finished_staging_tables")), {"pipeline": pipeline})]
    return drop_staging_quietly(engine, names)


def drop_staging_quietly(engine: Engine, names: list[str], lock_timeout_ms: int = 2000) -> list[str]:
    """Drop each table in its own short transaction; one still locked by a stalled attempt is left
    for a later call. Returns the tables that remain."""
    remaining = []
    for name in names:
        try:
            with engine.begin() as conn:
                conn.execute(text(query("set_lock_timeout")), {"ms": f"{lock_timeout_ms}ms"})
                drop_staging(conn, name)
        except OperationalError:
            remaining.append(name)
    return remaining

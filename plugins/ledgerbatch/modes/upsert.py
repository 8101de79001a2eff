"""`mode: upsert`: one row per key; within a batch the highest offset wins, across batches the later
batch. A replay replaces only rows whose value came from its ranges: newer values are kept."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from .. import tables
from ..identifiers import quote_ident
from ..ledger import Batch
from ..ranges import range_arrays
from ..schema import LINEAGE
from ..spec import PipelineSpec
from ..sqlfiles import Fragment, query
from ..states import BatchKind
from .base import TargetMode, target_names


class Upsert(TargetMode):
    rows_match_records = False  # several records of one key make one row

    def create_target(self, conn: Connection, spec: PipelineSpec) -> None:
        conn.execute(text(query("create_target_upsert", defs=tables.target_defs(spec), key=list(spec.key),
                                **target_names(spec))))

    def publish(self, conn: Connection, spec: PipelineSpec, batch: Batch) -> None:
        updated = tables.column_names(spec) + [c.name for c in LINEAGE]
        set_list = Fragment(", ".join(f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in updated))
        sql = query("insert_upsert" if batch.kind == BatchKind.LIVE else "replay_upsert", key=list(spec.key),
                    set_list=set_list, staging=batch.staging_table, columns=tables.column_names(spec),
                    **target_names(spec))
        conn.execute(text(sql), range_arrays(batch.ranges))

"""OpenLineage for every committed batch: which Kafka topics went into which PostgreSQL table.

Inputs are the topics (namespace `kafka://host:port` of the first bootstrap server, the naming spec's
form), the output is the target (`postgres://host:port`, `database.schema.table`) with its schema, its
column lineage and, once committed, the rows written. The run carries the `ledgerbatch_batch` facet: the
batch id, kind and offset ranges. The CLI emits START when a batch is planned and COMPLETE (or FAIL)
after its commit through openlineage-python, when OPENLINEAGE_URL or OPENLINEAGE_CONFIG is set; inside
Airflow the commit operator hands the same datasets and facets to the OpenLineage provider. Column lineage
comes from OpenLineage's own SQL parser (openlineage-sql) over the query or the per-column expressions;
a column with neither comes from the field of its name. Lineage never fails a batch.
"""
from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import uuid
from contextlib import contextmanager

import attr
from sqlalchemy.engine import make_url

from ledgerbatch.model.batch import Batch
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.ops.hooks import RunHook
from ledgerbatch.spec.pipeline import PipelineSpec

log = logging.getLogger(__name__)
PRODUCER = "https://github.com/ledgerbatch/ledgerbatch/tree/main/plugins/ledgerbatch/ops/lineage.py"
BATCH_FACET = "ledgerbatch_batch"
BATCH_FACET_SCHEMA = "https://github.com/ledgerbatch/ledgerbatch/blob/main/docs/lineage.md#the-ledgerbatch_batch-facet"


def kafka_namespace(bootstrap_servers: str) -> str:
    first = bootstrap_servers.split(",")[0].strip()
    return "kafka://" + first.split("://", 1)[-1]


def postgres_dataset(db_url: str, spec: PipelineSpec) -> tuple[str, str]:
    url = make_url(db_url)
    table = f"{url.database}.{spec.target_schema}.{spec.target_table}"
    return f"postgres://{url.host or 'localhost'}:{url.port or 5432}", table


def column_sources(spec: PipelineSpec, columns: list[str]) -> dict[str, list[str]]:
    """Each output column's source fields: parsed from the query or the column's expression (openlineage-sql);
    an untransformed column comes from the field of its name."""
    import openlineage_sql

    if spec.query is not None:
        parsed = openlineage_sql.parse([spec.query], dialect="spark").column_lineage
        return {c.descendant.name: sorted({s.name for s in c.lineage}) for c in parsed}
    out = {c: [c] for c in columns}
    for column, expression in spec.transform:
        parsed = openlineage_sql.parse([f"SELECT {expression} AS src FROM batch"], dialect="spark").column_lineage
        out[column] = sorted({s.name for c in parsed for s in c.lineage})
    return out


def datasets(spec: PipelineSpec, db_url: str, bootstrap_servers: str, batch: Batch | None = None,
             rows_written: int | None = None) -> tuple[list, list]:
    """(inputs, outputs) as openlineage-python datasets; `batch` gives a query's output columns."""
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.facet_v2 import column_lineage_dataset as cl
    from openlineage.client.facet_v2 import output_statistics_output_dataset as stats
    from openlineage.client.facet_v2 import schema_dataset

    recorded = batch is not None and batch.output_schema
    shape = BatchShape.recorded(spec, batch.output_schema) if recorded else BatchShape.of_spec(spec)
    namespace = kafka_namespace(bootstrap_servers)
    inputs = [InputDataset(namespace=namespace, name=topic) for topic in spec.topics]
    fields = [schema_dataset.SchemaDatasetFacetFields(name=c.name, type=c.pg_type) for c in shape.columns]
    facets = {"schema": schema_dataset.SchemaDatasetFacet(fields=fields, producer=PRODUCER)}
    sources = column_sources(spec, list(shape.names))
    if sources:
        facets["columnLineage"] = cl.ColumnLineageDatasetFacet(producer=PRODUCER, fields={
            column: cl.Fields(inputFields=[cl.InputField(namespace=namespace, name=topic, field=source)
                                           for topic in spec.topics for source in found],
                              transformationType="", transformationDescription="")
            for column, found in sorted(sources.items()) if found})
    output_facets = {} if rows_written is None else {
        "outputStatistics": stats.OutputStatisticsOutputDatasetFacet(rowCount=rows_written, producer=PRODUCER)}
    db_namespace, name = postgres_dataset(db_url, spec)
    return inputs, [OutputDataset(namespace=db_namespace, name=name, facets=facets, outputFacets=output_facets)]


def batch_facet(batch: Batch):
    return _batch_facet_class()(pipeline=batch.pipeline, batchId=batch.batch_id, kind=str(batch.kind),
                                ranges=[r.to_dict() for r in batch.ranges], producer=PRODUCER)


@functools.cache
def _batch_facet_class():
    """The `ledgerbatch_batch` run facet (defined on first use: openlineage-python is the [lineage] extra)."""
    from openlineage.client.facet_v2 import RunFacet

    @attr.define
    class LedgerbatchBatchRunFacet(RunFacet):
        pipeline: str
        batchId: int  # noqa: N815 - OpenLineage's camelCase
        kind: str
        ranges: list

        @staticmethod
        def _get_schema() -> str:
            return BATCH_FACET_SCHEMA

    return LedgerbatchBatchRunFacet


def run_id(batch: Batch) -> str:
    """One run per batch, the same for its START and COMPLETE."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"ledgerbatch:{batch.pipeline}:{batch.batch_id}"))


class Emitter(RunHook):
    """The CLI's events through openlineage-python, configured by its own environment; as a run's hook,
    a batch's START, then its COMPLETE or FAIL."""

    def __init__(self, spec: PipelineSpec, db_url: str, bootstrap_servers: str):
        self.spec, self.db_url, self.bootstrap_servers = spec, db_url, bootstrap_servers
        self.client = None
        if os.environ.get("OPENLINEAGE_URL") or os.environ.get("OPENLINEAGE_CONFIG"):
            with _guarded("client"):
                from openlineage.client import OpenLineageClient

                self.client = OpenLineageClient()

    @contextmanager
    def running(self, batch: Batch, enabled: bool = True):
        """START now, FAIL if the block raises; COMPLETE comes after its commit (`committed`)."""
        if enabled:
            self.emit("START", batch)
        try:
            yield
        except Exception:
            if enabled:
                self.emit("FAIL", batch)
            raise

    def committed(self, batch: Batch, result) -> None:
        self.emit("COMPLETE", batch, result.rows_written)

    def emit(self, state: str, batch: Batch, rows_written: int | None = None) -> None:
        if self.client is None:
            return
        with _guarded(f"{state} of batch {batch.batch_id}"):
            from openlineage.client.event_v2 import Job, Run, RunEvent, RunState

            inputs, outputs = datasets(self.spec, self.db_url, self.bootstrap_servers, batch, rows_written)
            namespace = os.environ.get("OPENLINEAGE_NAMESPACE", "ledgerbatch")
            self.client.emit(RunEvent(
                eventType=RunState[state], eventTime=dt.datetime.now(dt.timezone.utc).isoformat(), producer=PRODUCER,
                run=Run(runId=run_id(batch), facets={BATCH_FACET: batch_facet(batch)}),
                job=Job(namespace=namespace, name=f"ledgerbatch.{self.spec.name}"), inputs=inputs, outputs=outputs))


@contextmanager
def _guarded(what: str):
    """Lineage never fails a batch: log and carry on."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - whatever the client or its transport raises
        log.warning("lineage: %s not emitted: %s", what, exc)

"""DAG factory: one DAG per pipeline spec (`ledgerbatch_<name>`), the manual `ledgerbatch_backfill` and
`ledgerbatch_offsets` DAGs, and the daily `ledgerbatch_history` DAG."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import DAG, Asset, AssetAlias, AssetWatcher, Param

from ledgerbatch.airflow.hooks import LedgerHook
from ledgerbatch.airflow.operators import (
    ASSET_GROUP,
    CommitBatchOperator,
    MoveOffsetsOperator,
    PlanBatchOperator,
    PlanReplayOperator,
    ProcessBatchOperator,
    ReviewBatchOperator,
    UpkeepOperator,
    VerifyOperator,
)
from ledgerbatch.airflow.triggers import NewDataTrigger
from ledgerbatch.config import REPO_ROOT
from ledgerbatch.errors import SpecError
from ledgerbatch.model.partition_list import PATTERN as PARTITIONS_PATTERN
from ledgerbatch.spec.pipeline import PipelineSpec, parse_spec_file

log = logging.getLogger(__name__)

DEFAULT_SCHEDULE = "*/15 * * * *"  # a spec's `schedule:` overrides it
START = pendulum.datetime(2026, 1, 1, tz="UTC")
BATCH_ID = "{{ ti.xcom_pull(task_ids='plan') }}"
# What model/times.before_time reads: an age (30d, 12h, 90m, 45s) or an ISO-8601 date or time; the form refuses
# anything else at Trigger (before_time still judges the date itself).
BEFORE_PATTERN = r"^\s*(\d+[smhd]|\d{4}-\d{2}-\d{2}([T ]\d{2}(:\d{2}){0,2}(\.\d+)?(Z|[+-]\d{2}(:?\d{2})?)?)?)\s*$"
# Every run type but Airflow's own date backfill ("Backfill: run this Dag for a range of dates"): the ledger,
# not data intervals, decides what a run delivers, so a run per date would repeat the same work; the trigger
# dialog then offers it greyed out, and the API refuses it. The backfill of offsets is ledgerbatch_backfill.
RUN_TYPES = ["scheduled", "manual", "asset_triggered", "operator_triggered", "asset_materialization"]
REPLAYS = AssetAlias("ledgerbatch_replays")  # the backfill DAG's commits: an event on the replayed target's Asset
DEFAULT_ARGS = {
    "owner": "ledgerbatch",
    "retries": 3,
    "retry_delay": timedelta(seconds=20),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=10),
}
TASK_DOCS = {
    "plan": "Resume the pipeline's unfinished batch with its pinned ranges, or record the next batch "
            "(one range per partition, from the cursors to the read_committed end offsets). Nothing new: "
            "this task succeeds and the rest of the run is skipped.",
    "process": "spark-submit `spark_jobs/process_batch.py` (or, where the `spark_connect_default` connection or "
               "LEDGERBATCH_SPARK_REMOTE names a Spark Connect server, the same on a session of that server): read "
               "exactly the batch's ranges, parse, quarantine bad records, COPY into this attempt's staging table; "
               "the batch becomes `staged`. A retry starts a new attempt over the same ranges and fences the old one.",
    "commit": "One PostgreSQL transaction: compare-and-set the cursors, reconcile counts, move staged rows into "
              "the target. Already committed: no-op. A batch committed here makes an event on the target's Asset "
              "(`postgres://host:port/database/schema/table`) with the batch id, kind, ranges and counts as extra.",
    "verify": "`ledgerbatch verify`: committed ranges tile the log, counts reconcile, no duplicate coordinates, "
              "no orphan staging tables.",
}


def partitions_param() -> Param:
    """Plain text read by airflow/forms.py, not a JSON list: the form's JSON editor auto-closed brackets into
    invalid JSON and still sent the last valid value."""
    return Param(None, type=["null", "string"], pattern=PARTITIONS_PATTERN, title="Partitions",
                 description="Partition numbers and ranges, e.g. 0, 3 or 0-3; empty: all.")


def pipelines_dir() -> Path:
    """LEDGERBATCH_PIPELINES_DIR, else the repo's pipelines/ when run from the repo, else ./pipelines."""
    in_repo = REPO_ROOT / "pipelines"
    return Path(os.environ.get("LEDGERBATCH_PIPELINES_DIR") or (in_repo if in_repo.is_dir() else "pipelines")).resolve()


@dataclass(frozen=True)
class LeftOut:
    """A pipeline whose DAG is left out, and why (an invalid spec, a schedule Airflow refuses, ...)."""

    spec_path: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.spec_path.name}: {self.reason}"


def load_specs(directory: Path, left_out: list[LeftOut] | None = None) -> list[PipelineSpec]:
    """Valid specs; an invalid one is logged (and added to `left_out`) so that it cannot take the other DAGs
    down."""
    specs = []
    for path in sorted(directory.glob("*.yaml")):
        try:
            specs.append(parse_spec_file(path))
        except Exception as exc:  # noqa: BLE001  (one spec, whatever its fault, must not stop the others)
            reason = str(exc).removeprefix(f"{path}: ") if isinstance(exc, SpecError) else f"{type(exc).__name__}: {exc}"
            _leave_out(left_out, LeftOut(path, reason))
    return specs


def _leave_out(left_out: list[LeftOut] | None, item: LeftOut) -> None:
    log.error("ledgerbatch: leaving out pipeline spec %s: %s", item.spec_path, item.reason)
    if left_out is not None:
        left_out.append(item)


def target_asset(spec: PipelineSpec, hook: LedgerHook | None = None) -> Asset | None:
    """The Asset of the pipeline's target table (LedgerHook.get_asset_uri), or None (logged) when the ledger
    connection cannot be read while parsing: the DAG then loads without its outlet."""
    hook = hook or LedgerHook()
    try:
        return Asset(hook.get_asset_uri(spec.target_schema, spec.target_table), group=ASSET_GROUP)
    except Exception as exc:  # noqa: BLE001  (the DAG still works without its Asset)
        log.warning("ledgerbatch: pipeline %s: no outlet Asset for its target: connection %s cannot be read "
                    "while parsing: %s", spec.name, hook.ledger_conn_id, exc)
        return None


def new_data_asset(spec: PipelineSpec, directory: Path) -> Asset:
    """The Asset an event-driven pipeline's DAG is scheduled on: `x-ledgerbatch://pipelines/<name>/new-data`,
    watched by the pipeline's NewDataTrigger (Kafka end offsets against the ledger's cursors)."""
    name = f"ledgerbatch_{spec.name}_new_data"
    trigger = NewDataTrigger(pipeline=spec.name, pipelines_dir=str(directory))
    return Asset(name=name, uri=f"x-ledgerbatch://pipelines/{spec.name}/new-data", group=ASSET_GROUP,
                 watchers=[AssetWatcher(name=name, trigger=trigger)])


def schedule_of(spec: PipelineSpec, directory: Path):
    """The spec's `schedule:`: a cron expression or preset (default DEFAULT_SCHEDULE), or `on_new_data`."""
    if spec.event_driven:
        return [new_data_asset(spec, directory)]
    return spec.schedule or DEFAULT_SCHEDULE


def spark_pool() -> dict:
    """LEDGERBATCH_SPARK_POOL: the Airflow pool every `process` task (the Spark work) runs in, one slot each,
    so that its slots cap how many batches stage at once across all pipelines (docs/operations.md)."""
    pool = os.environ.get("LEDGERBATCH_SPARK_POOL", "").strip()
    return {"pool": pool} if pool else {}


def pipeline_dag(spec: PipelineSpec, directory: Path, hook: LedgerHook | None = None) -> DAG:
    common = dict(pipeline=spec.name, pipelines_dir=str(directory))
    asset = target_asset(spec, hook)
    with DAG(
        dag_id=f"ledgerbatch_{spec.name}",
        schedule=schedule_of(spec, directory),
        start_date=START,
        catchup=False,  # the ledger, not data intervals, decides what is new
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        tags=["ledgerbatch", f"pipeline:{spec.name}"],
        description=f"Delivers {', '.join(spec.topics)} into {spec.target_schema}.{spec.target_table} exactly once, "
                    f"one batch per run.",
        allowed_run_types=RUN_TYPES,
        auto_register=False,  # only build_dags' DAGs are exposed: one that fails below must not slip into the DagBag
        doc_md=f"Exactly-once delivery of {', '.join(spec.topics)} into "
               f"`{spec.target_schema}.{spec.target_table}` ({spec.mode}), at most {spec.max_records} "
               f"offsets per batch. Spec: `{directory / (spec.name + '.yaml')}`."
               + (" Event-driven: runs when its topics hold offsets the ledger has not delivered."
                  if spec.event_driven else ""),
    ) as dag:
        plan = PlanBatchOperator(task_id="plan", doc_md=TASK_DOCS["plan"], **common)
        process = ProcessBatchOperator(task_id="process", batch_id=BATCH_ID, doc_md=TASK_DOCS["process"],
                                       **spark_pool(), **common)
        commit = CommitBatchOperator(task_id="commit", batch_id=BATCH_ID, doc_md=TASK_DOCS["commit"],
                                     outlets=[asset] if asset else [], **common)
        verify = VerifyOperator(task_id="verify", doc_md=TASK_DOCS["verify"], retries=0, **common)
        plan >> process >> commit >> verify
    dag.validate()  # what the DagBag checks (a cron string, ...): fail here, for this pipeline alone
    return dag


def backfill_dag(specs: list[PipelineSpec], directory: Path, left_out: list[LeftOut] = ()) -> DAG:
    names = [s.name for s in specs] or ["(no pipelines)"]
    doc_md = ("Re-read an explicit range of a pipeline's topic. A range its batches already delivered is a "
              "**replay**: exactly the target rows (and quarantined records) of those source coordinates are "
              "replaced in one transaction. A range before the pipeline's start offset is a **backfill**. The "
              "live cursors never move. `dry_run` stages the result and reports the row diff without changing "
              "the target. `approve` (not a dry run) shows that diff under Required actions and commits only "
              "once a person approves it. Everything is recorded in `ledger.batches` (kind replay/backfill).")
    if left_out:
        doc_md += ("\n\n**Pipelines left out** (no DAG, not in this form; fix the spec and the next parse picks "
                   "it up):\n\n" + "\n".join(f"- `{item.spec_path}`: {item.reason}" for item in left_out))
    common = dict(pipeline="{{ params.pipeline }}", pipelines_dir=str(directory))
    with DAG(
        dag_id="ledgerbatch_backfill",
        schedule=None,
        start_date=START,
        catchup=False,
        default_args={**DEFAULT_ARGS, "retries": 1},
        tags=["ledgerbatch", "backfill"],
        description="Replay or backfill a range of a pipeline's topic by offsets or time; dry run by default.",
        allowed_run_types=RUN_TYPES,
        auto_register=False,
        doc_md=doc_md,
        params={
            "pipeline": Param(names[0], enum=names, title="Pipeline", description="Pipeline spec to replay."),
            # Every optional field is nullable with default None: the form opens valid with them empty.
            "topic": Param(None, type=["null", "string"], title="Topic",
                           description="Empty: the pipeline's only topic."),
            "partitions": partitions_param(),
            # exclusiveMinimum, not minimum: the form clamps a number below `minimum` silently (-5 became 0);
            # this one it refuses at Trigger.
            "from_offset": Param(None, type=["null", "integer"], exclusiveMinimum=-1, title="From offset",
                                 description="First offset (inclusive): 0 or more; with Until offset."),
            "until_offset": Param(None, type=["null", "integer"], exclusiveMinimum=0, title="Until offset",
                                  description="End offset (exclusive): above From offset."),
            "from_time": Param(None, type=["null", "string"], format="date-time", title="From time",
                               description="Or a time window instead of offsets: its start, resolved to offsets "
                                           "by the broker (where it supports timestamp look-ups)."),
            "until_time": Param(None, type=["null", "string"], format="date-time", title="Until time",
                                description="The end of the time window."),
            "dry_run": Param(True, type="boolean", title="Dry run", description="Stage and report the diff only."),
            "approve": Param(False, type="boolean", title="Approve before committing",
                             description="Before committing, show the diff under Required actions and wait "
                                         "for a person to approve it; a rejection abandons the batch."),
        },
    ) as dag:
        plan = PlanReplayOperator(task_id="plan", request="{{ params | tojson }}",
                                  doc_md="Resolve the request to offset ranges and record a replay/backfill batch.",
                                  **common)
        process = ProcessBatchOperator(task_id="process", batch_id=BATCH_ID, doc_md=TASK_DOCS["process"],
                                       **spark_pool(), **common)
        commit = CommitBatchOperator(task_id="commit", batch_id=BATCH_ID, dry_run="{{ params.dry_run }}",
                                     doc_md="Replace the target rows of the replayed coordinates in one "
                                            "transaction, or with dry_run report the diff and abandon the batch. "
                                            "A replay or backfill committed here makes an event on the target's "
                                            "Asset (through the alias `ledgerbatch_replays`).",
                                     outlets=[REPLAYS], **common)
        review = ReviewBatchOperator(task_id="review", batch_id=BATCH_ID,
                                     approve="{{ params.approve and not params.dry_run }}",
                                     doc_md="With `approve` (and not a dry run): show the staged diff and wait "
                                            "for a person to approve the commit or reject it (which abandons "
                                            "the batch). Otherwise it passes at once.", **common)
        verify = VerifyOperator(task_id="verify", doc_md=TASK_DOCS["verify"], retries=0, **common)
        plan >> process >> review >> commit >> verify
    return dag


def offsets_dag(specs: list[PipelineSpec], directory: Path) -> DAG:
    """`ledgerbatch_offsets`: `ledgerbatch offsets --set` with a form (ops/offsets.py)."""
    names = [s.name for s in specs] or ["(no pipelines)"]
    with DAG(
        dag_id="ledgerbatch_offsets",
        schedule=None,
        start_date=START,
        catchup=False,
        default_args={**DEFAULT_ARGS, "retries": 0},
        tags=["ledgerbatch", "offsets"],
        description="Move a pipeline's cursors to a time, an offset, the log start or its end; dry run by default.",
        allowed_run_types=RUN_TYPES,
        auto_register=False,
        doc_md="Move a pipeline's cursors to a time, an offset, the log start or its end, as `ledgerbatch offsets "
               "--set` does. Forward skips offsets, recorded as skipped ranges that `verify` accounts for; back is "
               "only allowed over skipped offsets (a delivered range is re-delivered with the backfill DAG). Refused "
               "while a batch is open. Every move is a row of `ledger.offset_moves` with who and why; `dry_run` "
               "(the default) only logs the moves.",
        params={
            "pipeline": Param(names[0], enum=names, title="Pipeline"),
            # The default runs as it is (with the default dry run, it only shows where the end is).
            "to": Param("latest", enum=["latest", "earliest", "time", "offset"], title="Move to",
                        description="The log's end, its start, a time (the first offset at or after it: fill in "
                                    "Time) or an offset (fill in Offset)."),
            "to_time": Param(None, type=["null", "string"], format="date-time", title="Time",
                             description="With Move to = time."),
            "to_offset": Param(None, type=["null", "integer"], exclusiveMinimum=-1, title="Offset",
                               description="With Move to = offset."),
            "topic": Param(None, type=["null", "string"], title="Topic", description="Empty: every topic."),
            "partitions": partitions_param(),
            "by": Param("", type="string", minLength=1, pattern=r"\S", title="By", description="Who moves the offsets."),
            "reason": Param("", type="string", minLength=1, pattern=r"\S", title="Reason",
                            description="Why (ticket, incident)."),
            "dry_run": Param(True, type="boolean", title="Dry run", description="Log the moves; change nothing."),
        },
    ) as dag:
        MoveOffsetsOperator(task_id="move", pipeline="{{ params.pipeline }}", pipelines_dir=str(directory),
                            request="{{ params | tojson }}",
                            doc_md="Resolve the target per partition and move the cursors in one transaction.")
    return dag


def history_dag(specs: list[PipelineSpec], directory: Path) -> DAG:
    """`ledgerbatch_history`: daily, each pipeline's upkeep as its spec asks (ops/history.py); by hand, a
    compaction or quarantine purge before a time."""
    with DAG(
        dag_id="ledgerbatch_history",
        schedule="@daily",
        start_date=START,
        catchup=False,
        default_args={**DEFAULT_ARGS, "retries": 1},
        tags=["ledgerbatch", "history"],
        description="Daily: compact each pipeline's ledger history and purge old quarantine, as its spec asks.",
        allowed_run_types=RUN_TYPES,
        auto_register=False,
        doc_md="Keep history bounded. For every pipeline, as its spec asks: fold batches older than "
               "`history.compact_after` into the ledger's checkpoints (`ledgerbatch compact`), drop quarantined "
               "records older than `errors.quarantine_retention` (`ledgerbatch quarantine purge`), and merge an "
               "append target's partitions down to `target.partitions.max`. Triggered by hand, `compact_before` "
               "and `purge_before` (ISO-8601 or an age such as 30d) compact or purge every pipeline before that "
               "time. No run depends on an earlier one. `dry_run` only counts what `purge_before` would drop.",
        params={
            "compact_before": Param(None, type=["null", "string"], pattern=BEFORE_PATTERN, title="Compact before",
                                    description="ISO-8601 (2026-01-31 or 2026-01-31T12:00:00) or an age such as "
                                                "30d, 12h, 90m; empty: as the specs ask."),
            "purge_before": Param(None, type=["null", "string"], pattern=BEFORE_PATTERN,
                                  title="Purge quarantine before",
                                  description="ISO-8601 or an age such as 90d; empty: as the specs ask."),
            # Off by default: the daily runs take the defaults, and they must do their work.
            "dry_run": Param(False, type="boolean", title="Dry run",
                             description="Only count the quarantined records Purge quarantine before would drop; "
                                         "nothing is compacted or purged, and the specs' own upkeep waits for "
                                         "the next run."),
        },
    ) as dag:
        for spec in specs:
            UpkeepOperator(task_id=f"upkeep_{spec.name}", pipeline=spec.name, pipelines_dir=str(directory),
                           compact_before="{{ params.compact_before }}", purge_before="{{ params.purge_before }}",
                           dry_run="{{ params.dry_run }}",
                           doc_md=f"Upkeep of pipeline {spec.name}.")
    return dag


def build_dags(directory: Path | None = None, left_out: list[LeftOut] | None = None) -> dict[str, DAG]:
    """`ledgerbatch_<name>` for every spec of `directory` (default: pipelines_dir()), and `ledgerbatch_backfill`.

    A spec that does not parse, or whose DAG cannot be built (e.g. an invalid `schedule:`), is left out alone:
    logged as `ledgerbatch: leaving out pipeline spec PATH: REASON`, appended to `left_out`, listed in the
    backfill DAG's docs; every other pipeline's DAG still loads.
    """
    directory = directory or pipelines_dir()
    left_out = [] if left_out is None else left_out
    dags, built, hook = {}, [], LedgerHook()
    for spec in load_specs(directory, left_out):
        try:
            dags[f"ledgerbatch_{spec.name}"] = pipeline_dag(spec, directory, hook)
            built.append(spec)
        except Exception as exc:  # noqa: BLE001  (this pipeline alone)
            _leave_out(left_out, LeftOut(directory / f"{spec.name}.yaml", f"{type(exc).__name__}: {exc}"))
    dags["ledgerbatch_backfill"] = backfill_dag(built, directory, left_out)
    dags["ledgerbatch_offsets"] = offsets_dag(built, directory)
    dags["ledgerbatch_history"] = history_dag(built, directory)
    return dags

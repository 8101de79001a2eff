"""Triggers: `NewDataTrigger` wakes an event-driven pipeline (`schedule: on_new_data`) when its topics hold
offsets the ledger has not delivered.

The trigger only says *that* there is something; the DAG run's `plan` task decides *what* a run delivers
(from the ledger, as every run does), so a trigger that fires twice never delivers anything twice.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from ledgerbatch.airflow.hooks import KafkaConfigHook, LedgerHook, settings_from_hooks
from ledgerbatch.spec.resolve import load_pipeline

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sqlalchemy.engine import Engine

    from ledgerbatch.model.batch import Batch
    from ledgerbatch.model.ranges import TopicPartition, Watermarks
    from ledgerbatch.spec.pipeline import PipelineSpec


@dataclass(frozen=True)
class Pending:
    """What one look found: offsets no batch covers yet, the unfinished batch, whether the pipeline ever ran."""

    offsets: int            # past the cursors and past the unfinished batch's ranges
    unfinished: int | None  # the unfinished live batch (a run resumes it)
    never_ran: bool         # no cursors yet: the first run records where the pipeline starts
    state: tuple            # the end offsets and the offsets already covered, this was computed from
    staging: bool = False   # an attempt of the unfinished batch is being staged now (its lease is live)
    paused: bool = False    # held still by `ledgerbatch pause`: nothing fires until it is resumed
    filling: bool = False   # batch.min_records: too few offsets yet, the oldest younger than batch.max_delay

    @property
    def waiting(self) -> bool:
        """Something is left to deliver, and the pipeline may deliver it now."""
        return (not self.paused and not self.filling
                and bool(self.offsets or self.never_ran or self.unfinished is not None))

    @property
    def reason(self) -> str:
        if self.offsets:
            return f"{self.offsets} offsets past the ledger's cursors"
        if self.never_ran:
            return "the pipeline has no cursors yet"
        return f"batch {self.unfinished} is unfinished" if self.unfinished is not None else ""


def pending(spec: PipelineSpec, ends: dict[TopicPartition, Watermarks], cursors: dict[TopicPartition, int],
            unfinished: Batch | None, staging: bool = False, paused: bool = False) -> Pending:
    """What a run of `spec` would find to do, by the planner's rules (planner.plan_from): an unfinished batch
    is resumed with its ranges; then each partition goes from its cursor (a pipeline without cursors starts at
    `source.start`, a partition added later at its log start) up to its end offset.

    Offsets the unfinished batch covers are not counted: a run is delivering them (or will resume them)."""
    from ledgerbatch.model.ranges import start_offsets

    covered = dict(cursors)
    for r in unfinished.ranges if unfinished is not None else ():
        covered[r.topic_partition] = max(covered.get(r.topic_partition, r.until_offset), r.until_offset)
    starts = start_offsets(ends, covered, spec.start if not cursors else "earliest")
    offsets = sum(max(0, wm.high - starts[tp]) for tp, wm in ends.items())
    state = (tuple(sorted((tp, wm.high) for tp, wm in ends.items())), tuple(sorted(covered.items())))
    return Pending(offsets, unfinished.batch_id if unfinished is not None else None, not cursors, state, staging,
                   paused)


class NewDataProbe:
    """One pipeline's look at Kafka and the ledger, through the clients every trigger of the triggerer shares
    (trigger_clients.py): its end offsets come in a round of looks with the other pipelines', its ledger
    queries from a small pool. Blocking: the trigger calls it in a thread."""

    def __init__(self, spec: PipelineSpec, engine: Engine, bootstrap_servers: str):
        self.spec = spec
        self.engine = engine
        self.bootstrap_servers = bootstrap_servers

    def end_offsets(self) -> dict[TopicPartition, Watermarks]:
        """Log start and read_committed end of every partition of the pipeline's topics: the planner's look
        (planner.plan_next -> kafka.watermarks, with the spec's Kafka options), so the same end offsets."""
        from ledgerbatch.source import kafka

        return kafka.watermarks(self.bootstrap_servers, self.spec.topics, dict(self.spec.kafka_options))

    def look(self) -> Pending:
        from ledgerbatch.ledger.batches import attempt_held, get_batch, open_live_batch_id
        from ledgerbatch.ledger.cursors import get_cursors
        from ledgerbatch.ledger.pauses import current_pause
        from ledgerbatch.plan.live import filling
        from ledgerbatch.stage.lease import LEASE_S

        ends = self.end_offsets()
        with self.engine.connect() as conn:
            open_id = open_live_batch_id(conn, self.spec.name)
            unfinished = get_batch(conn, open_id) if open_id is not None else None
            staging = open_id is not None and attempt_held(conn, open_id, LEASE_S)
            cursors = get_cursors(conn, self.spec.name, self.spec.topics)
            paused = current_pause(conn, self.spec.name) is not None
        found = pending(self.spec, ends, cursors, unfinished, staging, paused)
        if self.spec.min_records > 1 and unfinished is None and cursors and 0 < found.offsets < self.spec.min_records:
            found = replace(found, filling=filling(self.engine, self.spec, self.bootstrap_servers, ends, cursors))
        return found


class NewDataTrigger(BaseEventTrigger):
    """Fires when a pipeline has something to deliver: its topics' read_committed end offsets are past the
    ledger's cursors and past the ranges of its unfinished batch (or the pipeline never ran). Used by the
    AssetWatcher of the pipelines with `schedule: on_new_data`; one trigger per pipeline.

    It looks every `poll_interval` seconds and fires once per state: again only when the end offsets or the
    offsets covered (cursors, unfinished batch) have changed since it last fired. A run that planned all there
    was covers it, so the trigger stays quiet; a run that planned one batch of several (`max_records`) leaves
    offsets uncovered and the trigger fires for the next. An unfinished batch alone fires on the first look
    (after a triggerer restart), so that a batch left behind is resumed.

    A run it started can fail without delivering (its plan failed, or its batch failed and waits unfinished):
    while something is left to deliver, it fires again `refire_after` seconds after its last event, doubling
    the wait each time (up to an hour) until new offsets arrive, and never while an attempt of the unfinished
    batch is being staged (its lease is live).

    :param pipeline: Name of the pipeline spec, `<pipelines_dir>/<pipeline>.yaml`.
    :param pipelines_dir: Directory of the pipeline specs.
    :param ledger_conn_id: Connection of the ledger database (see LedgerHook), defaults to "ledgerbatch_db".
    :param kafka_conn_id: Connection whose extra holds the librdkafka settings (see KafkaConfigHook),
        defaults to "ledgerbatch_kafka".
    :param poll_interval: Seconds between two looks, defaults to 5.
    :param refire_after: Seconds before firing again for a state nothing has delivered, doubled each time,
        defaults to 60.
    """

    MAX_REFIRE_S = 3600.0

    def __init__(self, *, pipeline: str, pipelines_dir: str | Path,
                 ledger_conn_id: str = LedgerHook.default_conn_name,
                 kafka_conn_id: str = KafkaConfigHook.default_conn_name, poll_interval: float = 5.0,
                 refire_after: float = 60.0):
        super().__init__()
        self.pipeline = pipeline
        self.pipelines_dir = str(pipelines_dir)
        self.ledger_conn_id = ledger_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.poll_interval = float(poll_interval)
        self.refire_after = float(refire_after)
        self._probe: NewDataProbe | None = None
        self._clients = contextlib.ExitStack()  # the triggerer's shared clients, held from run() to cleanup()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "pipeline": self.pipeline,
            "pipelines_dir": self.pipelines_dir,
            "ledger_conn_id": self.ledger_conn_id,
            "kafka_conn_id": self.kafka_conn_id,
            "poll_interval": self.poll_interval,
            "refire_after": self.refire_after,
        })

    def _open_probe(self) -> NewDataProbe:
        """The connections (through the hooks), the spec with the Kafka connection's options, the probe on the
        clients the triggerer's triggers share."""
        from ledgerbatch.airflow import trigger_clients

        ledger_hook, kafka_hook = LedgerHook(self.ledger_conn_id), KafkaConfigHook(self.kafka_conn_id)
        settings = settings_from_hooks(ledger_hook, kafka_hook, self.pipelines_dir)
        spec = load_pipeline(settings, self.pipeline)
        engine = self._clients.enter_context(trigger_clients.shared(ledger_hook.get_url()))
        return NewDataProbe(spec, engine, settings.bootstrap_servers)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from asgiref.sync import sync_to_async

        from ledgerbatch.ops.outages import Outage, waitable

        self._probe = await sync_to_async(self._open_probe)()  # hooks read connections: as the providers do
        fired: tuple | None = None
        fired_at, backoff = 0.0, self.refire_after
        first, paused = True, False
        outage = Outage(self.pipeline, logger=self.log)
        while True:
            try:
                found = await asyncio.to_thread(self._probe.look)
            except Exception as exc:  # noqa: BLE001  (Kafka or the database away: keep watching, say so once)
                outage.failed(waitable(exc) or type(exc).__name__, exc, f"looking again every {self.poll_interval:g}s")
                await asyncio.sleep(self.poll_interval)
                continue
            outage.ok()
            # New offsets (or a pipeline that never ran), once per state; an unfinished batch on the first look
            # (a triggerer restart). The same state again only after a backoff, and never while an attempt is
            # staged: the run it started failed without delivering.
            now = asyncio.get_running_loop().time()
            if found.paused != paused:
                paused = found.paused
                self.log.info("%s: %s", self.pipeline, "paused: quiet until it is resumed" if paused else "resumed")
            new = not paused and not found.filling and (((found.offsets or found.never_ran) and found.state != fired)
                                                        or (first and found.unfinished is not None))
            stalled = fired is not None and found.waiting and not found.staging and now - fired_at >= backoff
            if new or stalled:
                reason = found.reason or f"batch {found.unfinished} is unfinished"
                if stalled:
                    reason += f"; nothing was delivered {now - fired_at:.0f}s after the last event"
                    backoff = min(2 * backoff, self.MAX_REFIRE_S)
                else:
                    backoff = self.refire_after
                fired, fired_at = found.state, now
                self.log.info("%s: %s", self.pipeline, reason)
                yield TriggerEvent({"pipeline": self.pipeline, "pending_offsets": found.offsets, "reason": reason})
            first = False
            await asyncio.sleep(self.poll_interval)

    async def cleanup(self) -> None:
        self._probe = None
        await asyncio.to_thread(self._clients.close)  # the last trigger to let go waits for the looks' thread

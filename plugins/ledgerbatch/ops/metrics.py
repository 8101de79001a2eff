"""Metrics through OpenTelemetry: one instrumentation path for the CLI, `run --follow` and Airflow.

One MeterProvider per process (the SDK's, kept apart from Airflow's own) with the readers the
environment asks for: OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._METRICS_ENDPOINT`) is set or,
inside Airflow, `[metrics] otel_on` is; a Prometheus endpoint when `run --follow --metrics-port N` or
`ledgerbatch metrics-serve` asks for one. A metric never fails a batch: recording is guarded, and an
exporter that cannot reach its collector only logs. Names follow OTel's semantic conventions
(`messaging.*` for what is read from Kafka); docs/observability.md lists every metric.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import contextmanager
from typing import Iterable

from ledgerbatch.errors import ConfigError
from ledgerbatch.model.batch import Batch
from ledgerbatch.ops.lag import PartitionLag, pipeline_lag
from ledgerbatch.ops.upkeep_failures import failure_counts
from ledgerbatch.stage.stamps import ages

log = logging.getLogger(__name__)
SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
FRESHNESS_SAMPLE = 10_000  # freshness observations a batch at most
FRESHNESS_BUCKETS = (0.25, 0.5, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 21600, 86400)


def kafka_attributes(pipeline: str, topic: str, partition: int) -> dict:
    return {"ledgerbatch.pipeline": pipeline, "messaging.system": "kafka", "messaging.destination.name": topic,
            "messaging.destination.partition.id": str(partition)}


class Metrics:
    """The instruments, on one MeterProvider. `readers`: the SDK's metric readers to export through."""

    def __init__(self, readers: list):
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource

        self.provider = MeterProvider(metric_readers=readers, resource=Resource.create({"service.name": "ledgerbatch"}))
        self.exporting = bool(readers)  # measuring lag reads Kafka and the ledger: only when someone listens
        meter = self.provider.get_meter("ledgerbatch")
        self._lags: dict[tuple[str, str, int], PartitionLag] = {}
        self._lock = threading.Lock()
        self.consumed = meter.create_counter(
            "messaging.client.consumed.messages", unit="{message}",
            description="Kafka records a committed batch delivered (good, bad or filtered), per partition")
        self.written = meter.create_counter("ledgerbatch.rows.written", unit="{row}",
                                            description="rows a committed batch wrote to the target")
        self.quarantined = meter.create_counter("ledgerbatch.records.quarantined", unit="{message}",
                                                description="records a committed batch quarantined (bad or refused)")
        self.rejected = meter.create_counter("ledgerbatch.rows.rejected", unit="{row}",
                                             description="staged rows the target refused, quarantined")
        self.superseded = meter.create_counter("ledgerbatch.records.superseded", unit="{message}",
                                               description="changes older than their key's newest, not applied")
        self.batches = meter.create_counter("ledgerbatch.batches.committed", unit="{batch}",
                                            description="batches committed, by kind (live, replay, backfill)")
        self.errors = meter.create_counter("ledgerbatch.errors", unit="{error}",
                                           description="phases that failed, by error.type")
        self.outages = meter.create_counter("ledgerbatch.outages", unit="{outage}",
                                            description="outages `run --follow` waited out, by dependency")
        self.outage_seconds = meter.create_counter("ledgerbatch.outage.duration", unit="s",
                                                   description="seconds `run --follow` waited for a dependency")
        meter.create_observable_counter(
            "ledgerbatch.upkeep.failures", [self._upkeep_failures], unit="{failure}",
            description="history upkeeps (rollup, compaction, purge, abandon) that failed and gave way, by reason")
        self.duration = meter.create_histogram(
            "ledgerbatch.batch.phase.duration", unit="s", description="wall time of a batch phase",
            explicit_bucket_boundaries_advisory=list(SECONDS_BUCKETS))
        self.freshness_seconds = meter.create_histogram(
            "ledgerbatch.freshness", unit="s", explicit_bucket_boundaries_advisory=list(FRESHNESS_BUCKETS),
            description="per record a committed batch delivered: its Kafka timestamp to the commit")
        meter.create_observable_gauge("ledgerbatch.lag.offsets", [self._observe("offsets")], unit="{message}",
                                      description="Kafka's read_committed end offset minus the ledger's cursor")
        meter.create_observable_gauge(
            "ledgerbatch.lag.oldest_undelivered.age", [self._observe("oldest_undelivered_age")], unit="s",
            description="now minus the Kafka timestamp of the oldest record not yet delivered (0 when caught up)")
        meter.create_observable_gauge(
            "ledgerbatch.lag.newest_delivered.age", [self._observe("newest_delivered_age")], unit="s",
            description="now minus the Kafka timestamp of the newest record delivered")

    def phase(self, phase: str, batch: Batch, seconds: float, committed_now: bool = False, rows_written: int = 0,
              rows_quarantined: int = 0, rows_rejected: int = 0) -> None:
        """One batch phase; the counters move only when this call committed the batch, so retries never
        count twice."""
        with _guarded("phase"):
            attrs = {"ledgerbatch.pipeline": batch.pipeline}
            self.duration.record(seconds, {**attrs, "ledgerbatch.phase": phase})
            if not committed_now:
                return
            self.batches.add(1, {**attrs, "ledgerbatch.batch.kind": str(batch.kind)})
            self.written.add(rows_written, attrs)
            self.quarantined.add(rows_quarantined, attrs)
            self.rejected.add(rows_rejected, attrs)
            self.superseded.add(batch.records_superseded, attrs)
            for r in batch.ranges:
                kafka = kafka_attributes(batch.pipeline, r.topic, r.partition)
                self.consumed.add(batch.range_counts.get(r.topic_partition) or 0, kafka)

    def freshness(self, pipeline: str, texts: list, now_ms: int) -> None:
        """Each record of a batch this process staged and just committed: produced -> committed, in seconds
        (stage/stamps.py: its timestamp bucket's middle). One observation a record, up to FRESHNESS_SAMPLE
        a batch: beyond, each bucket in proportion (an observation costs ~10 us; a batch of a million
        records would spend seconds on its metric)."""
        with _guarded("freshness"):
            attrs = {"ledgerbatch.pipeline": pipeline}
            seen = list(ages(texts, now_ms))
            scale = min(1.0, FRESHNESS_SAMPLE / max(1, sum(n for _, n in seen)))
            carry = 0.0
            for age, n in seen:
                carry += n * scale
                for _ in range(int(carry)):
                    self.freshness_seconds.record(age, attrs)
                carry -= int(carry)

    @contextmanager
    def failures(self, pipeline: str, phase: str):
        """Count an error of `phase` (by its class as error.type) and let it go on."""
        try:
            yield
        except Exception as exc:
            with _guarded("error"):
                self.errors.add(1, {"ledgerbatch.pipeline": pipeline, "ledgerbatch.phase": phase,
                                    "error.type": type(exc).__name__})
            raise

    def outage(self, pipeline: str, dependency: str, seconds: float) -> None:
        """An outage that ended after `seconds`."""
        with _guarded("outage"):
            attrs = {"ledgerbatch.pipeline": pipeline, "ledgerbatch.dependency": dependency}
            self.outages.add(1, attrs)
            self.outage_seconds.add(seconds, attrs)

    def lag(self, pipeline: str, lags: Iterable[PartitionLag]) -> None:
        """The pipeline's lag as measured now, in place of what it was (a topic taken out of its spec goes)."""
        with self._lock:
            self._forget(pipeline)
            for lag in lags:
                self._lags[(lag.pipeline, lag.topic, lag.partition)] = lag

    def forget(self, pipeline: str) -> None:
        """A pipeline no longer run here (its spec removed from a service): its lag gauges go."""
        with self._lock:
            self._forget(pipeline)

    def _forget(self, pipeline: str) -> None:
        for key in [k for k in self._lags if k[0] == pipeline]:
            del self._lags[key]

    def flush(self) -> None:
        with _guarded("flush"):
            self.provider.force_flush(10_000)

    @staticmethod
    def _upkeep_failures(_options):
        """The process's failed upkeeps so far (ops/upkeep_failures.py keeps them, so that a failure is counted
        even before the instruments are built)."""
        from opentelemetry.metrics import Observation

        return [Observation(n, {"ledgerbatch.pipeline": pipeline, "ledgerbatch.upkeep": upkeep, "error.type": error,
                                **({"db.response.status_code": sqlstate} if sqlstate else {})})
                for (pipeline, upkeep, error, sqlstate), n in failure_counts().items()]

    def _observe(self, what: str):
        from opentelemetry.metrics import Observation

        def callback(_options):
            now = time.time()
            with self._lock:
                lags = list(self._lags.values())
            out = []
            for lag in lags:
                value = lag.offsets if what == "offsets" else getattr(lag, what)(now)
                if value is not None:
                    out.append(Observation(value, kafka_attributes(lag.pipeline, lag.topic, lag.partition)))
            return out
        return callback


@contextmanager
def _guarded(what: str):
    """A metric never fails a batch: log and carry on."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - whatever the SDK or an exporter raises
        log.warning("metrics: %s not recorded: %s", what, exc)


_metrics: Metrics | None = None
_prometheus_port: int | None = None


def metrics(in_airflow: bool = False) -> Metrics:
    """The process's instruments, built on first use with the exporters the environment asks for
    (`in_airflow`: Airflow's [metrics] settings count too)."""
    global _metrics
    if _metrics is None:
        _metrics = Metrics(_otlp_readers(in_airflow))
    return _metrics


def forget_pipeline(pipeline: str) -> None:
    """Metrics.forget, where instruments were built."""
    if _metrics is not None:
        _metrics.forget(pipeline)


def record_lag(engine, spec, bootstrap_servers: str, in_airflow: bool = False) -> None:
    """Measure the pipeline's lag now (ops/lag.py) for the lag gauges, where metrics are exported."""
    m = metrics(in_airflow)
    if m.exporting:
        with _guarded("lag"):
            m.lag(spec.name, pipeline_lag(engine, spec, bootstrap_servers))


def serve_prometheus(port: int, host: str = "127.0.0.1") -> Metrics:
    """Serve the process's metrics for Prometheus on host:port (`/metrics`); before any other use."""
    global _metrics, _prometheus_port
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
    except ImportError:
        raise ConfigError("serving metrics for Prometheus needs its exporter: "
                          "pip install 'ledgerbatch[metrics]'") from None

    if _metrics is not None and _prometheus_port is None:
        raise RuntimeError("serve_prometheus must come before the first metric")
    if _metrics is None:
        try:
            start_http_server(port, addr=host)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
        _metrics, _prometheus_port = Metrics([PrometheusMetricReader(), *_otlp_readers()]), port
        log.info("metrics for Prometheus on http://%s:%d/metrics", host, port)
    return _metrics


def serve_lag(engine, specs: list, bootstrap_servers: str, port: int, host: str, interval_s: float,
              stop: threading.Event) -> None:
    """`ledgerbatch metrics-serve`: every pipeline's lag for Prometheus, measured every `interval_s` until
    `stop` (for pipelines run by Airflow, whose tasks send their counters over OTLP)."""
    m = serve_prometheus(port, host)
    log.info("measuring the lag of %d pipelines every %gs", len(specs), interval_s)
    while not stop.is_set():
        for spec in specs:
            with _guarded(f"{spec.name}'s lag"):
                m.lag(spec.name, pipeline_lag(engine, spec, bootstrap_servers))
        stop.wait(interval_s)


def _otlp_readers(in_airflow: bool = False) -> list:
    endpoint = _otlp_endpoint(in_airflow)
    if not endpoint:
        return []
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError:  # a metric never fails a batch: say what is missing, once
        log.warning("metrics: %s is set but the OTLP exporter is not installed: pip install 'ledgerbatch[metrics]'",
                    endpoint)
        return []
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    interval_ms = float(os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", "60000"))
    log.info("metrics over OTLP/HTTP to %s", endpoint)
    return [PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint), export_interval_millis=interval_ms)]


def _otlp_endpoint(in_airflow: bool) -> str | None:
    """OTEL_EXPORTER_OTLP_METRICS_ENDPOINT as is, OTEL_EXPORTER_OTLP_ENDPOINT + /v1/metrics, or Airflow's
    [metrics] otel_host/otel_port when otel_on (inside Airflow only)."""
    if os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        return os.environ["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"]
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/metrics"
    if not in_airflow:
        return None
    from airflow.configuration import conf

    if not conf.getboolean("metrics", "otel_on", fallback=False):
        return None
    scheme = "https" if conf.getboolean("metrics", "otel_ssl_active", fallback=False) else "http"
    return f"{scheme}://{conf.get('metrics', 'otel_host')}:{conf.getint('metrics', 'otel_port')}/v1/metrics"

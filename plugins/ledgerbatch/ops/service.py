"""`ledgerbatch run --follow P1 P2 ...` (or `--all`): many pipelines in one process and one Spark session.

Each pipeline follows in a thread of its own (ops/run.py: run_pipeline) with its own ledger state, pause, outage
waits and backoff, upkeep and metrics, so one pipeline's trouble stops or slows that pipeline alone: a batch over
its error budget stops it with the reason while the others go on. They share the process's Spark session (one
driver and JVM, or one Spark Connect session: Spark runs their jobs side by side) and its pool of ledger
connections. The pipelines folder is read again every `rescan_s`: a new spec starts following, a removed one
stops after the batch in hand, a changed one (another spec version) stops after its batch and starts again
under the new version; a file that does not load keeps the spec it last loaded with (SpecFolder). A pipeline
stopped by an error starts again when its spec changes, or `retry_stopped_s` later (its cause may have been
dealt with: a loss acknowledged, a batch abandoned); it stops again if not.

Their plain batches (no transform) are staged in turns (stage/turns.py): the batches that several pipelines'
threads stage at one time go to Spark as one job, so the batches a second grow with the pipelines instead of
each paying a Spark job's fixed cost. Their ledger connections share one pool (SQLAlchemy's: 5 kept, 10 more at
once, waited for beyond that), whatever their number; their end-offset looks are answered in rounds by one
consumer a cluster (source/looks.py).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from sqlalchemy.engine import Engine

from ledgerbatch.ledger.batches import get_batch, open_live_batch_id
from ledgerbatch.ops.metrics import forget_pipeline
from ledgerbatch.ops.outages import Backoff
from ledgerbatch.ops.run import RunSummary, Session, run_pipeline
from ledgerbatch.source import looks
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.stage.turns import Turns

log = logging.getLogger(__name__)
RESCAN_S = 10.0  # how often the pipelines folder is read again
RETRY_STOPPED_S = 300.0  # how long a pipeline stopped by an error waits before it is started again
SETTLED_S = 2.0  # a spec file unchanged for this long is not one being written


@dataclass
class Follower:
    """One pipeline's thread, and how it ended."""
    spec: PipelineSpec
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    summary: RunSummary | None = None
    error: BaseException | None = None
    ended_at: float | None = None
    finishing: bool = False  # under an old spec version, for the one batch left open under it


class SpecFolder:
    """The specs of a pipelines folder as they are now (all, or those `names`), loaded as `run` loads one (its
    name that of its file, its target no other pipeline's) by `load` (spec/resolve.py: load_pipeline, with the
    deployment's Kafka and registry settings). A file is taken only once it reads the same on two scans in a row or was last
    written SETTLED_S ago (not one being written, whose first half may parse as another spec); one that does not
    load (a bad edit) keeps the spec it last loaded with, or is left out if it never did, and is said once per
    change of it."""

    def __init__(self, directory: Path, names: tuple[str, ...] | None, load: Callable[[str], PipelineSpec]):
        self.directory, self.names, self.load = Path(directory), names, load
        self._read: dict[Path, bytes] = {}  # each file as the last scan read it
        self._loaded: dict[Path, PipelineSpec] = {}
        self._tried: dict[Path, bytes] = {}  # what each file held when it was last loaded, or refused and said so
        self._missing: tuple[str, ...] = ()

    def __call__(self) -> dict[str, PipelineSpec]:
        specs = {}
        for path in sorted(self.directory.glob("*.yaml")):
            data = None
            try:
                data = path.read_bytes()
                settled = self._read.get(path) == data or time.time() - path.stat().st_mtime >= SETTLED_S
                self._read[path] = data
                if settled and self._tried.get(path) != data:
                    self._tried[path] = data
                    self._loaded[path] = self.load(path.stem)
            except Exception as exc:  # noqa: BLE001 - whatever a file holds, the other pipelines go on
                kept = self._loaded.get(path)
                log.error("%s does not load (%s): %s", path, exc, f"{kept.name} goes on under the spec it last "
                          f"loaded with" if kept else "left out until it loads")
            spec = self._loaded.get(path)
            if spec is not None and (self.names is None or spec.name in self.names):
                specs[spec.name] = spec
        for gone in set(self._read) - set(self.directory.glob("*.yaml")):
            for known in (self._read, self._loaded, self._tried):
                known.pop(gone, None)
        missing = tuple(sorted(set(self.names or ()) - set(specs)))
        if missing and missing != self._missing:
            log.error("no spec of %s in %s loaded (yet): followed once one does", ", ".join(missing), self.directory)
        self._missing = missing
        return specs


class Service:
    def __init__(self, engine: Engine, db_url: str, bootstrap_servers: str, spark_factory: Callable,
                 specs: Callable[[], dict[str, PipelineSpec]], stop: threading.Event, idle_s: float = 1.0,
                 backoff: Backoff = Backoff(), upkeep_every_s: float = 60.0, rescan_s: float = RESCAN_S,
                 retry_stopped_s: float = RETRY_STOPPED_S):
        self.engine, self.db_url, self.bootstrap_servers = engine, db_url, bootstrap_servers
        # one for every pipeline, made on first use (anew after an outage); their plain batches staged in turns
        self.session = Session(spark_factory, Turns())
        self.specs, self.stop, self.idle_s, self.backoff = specs, stop, idle_s, backoff
        self.upkeep_every_s, self.rescan_s, self.retry_stopped_s = upkeep_every_s, rescan_s, retry_stopped_s
        self.followers: dict[str, Follower] = {}

    def serve(self) -> dict[str, Follower]:
        """Follow the pipelines until `stop` is set, then let each finish the batch in hand; how each ended."""
        with looks.shared():  # the pipelines' end-offset looks in rounds, one consumer a cluster (source/looks.py)
            return self._serve()

    def _serve(self) -> dict[str, Follower]:
        while True:
            try:
                self.reconcile(self.specs())
            except Exception as exc:  # noqa: BLE001 - the ledger away, say: the followers go on; next scan
                log.warning("the service could not look at its pipelines (%s): looking again in %gs", exc,
                            self.rescan_s)
            if self.stop.wait(self.rescan_s):
                break
        for f in self.followers.values():  # each stops after the batch in hand
            f.stop.set()
        for f in self.followers.values():
            f.thread.join()
        return self.followers

    def reconcile(self, wanted: dict[str, PipelineSpec]) -> None:
        """Start, stop or restart followers so that each wanted spec, as it is now, is followed once. A live
        batch open under the spec's old version (left by an outage while its follower stopped) finishes under
        that version first: under the new one it could not (spec.check_version)."""
        now = time.monotonic()
        for name, f in list(self.followers.items()):
            spec = wanted.get(name)
            changed = spec is not None and spec.version != f.spec.version
            if f.thread.is_alive():
                stale = spec is None or changed and not (f.finishing and self._open_under(f.spec))
                if stale and not f.stop.is_set():
                    log.info("%s: its spec was %s: stopping after the batch in hand", name,
                             "removed" if spec is None else "changed")
                    f.stop.set()
                continue
            due = f.error is None or now - f.ended_at >= self.retry_stopped_s
            if spec is None:
                del self.followers[name]
                forget_pipeline(name)  # else its last lag stays exported, as if it still lagged
            elif changed and self._open_under(f.spec):
                if due:
                    log.info("%s: a batch planned under spec version %s is open: finishing it under that version "
                             "before the new one (%s) applies", name, f.spec.version, spec.version)
                    self._start(f.spec, finishing=True)
            elif due or changed:
                self._start(spec)
        for name, spec in wanted.items():
            if name not in self.followers:
                self._start(spec)

    def _open_under(self, spec: PipelineSpec) -> bool:
        """Whether the pipeline's open live batch was planned under `spec`'s version."""
        with self.engine.connect() as conn:
            open_id = open_live_batch_id(conn, spec.name)
            return open_id is not None and get_batch(conn, open_id).spec_version in (
                spec.version, spec.version_before_redaction)

    def _start(self, spec: PipelineSpec, finishing: bool = False) -> None:
        f = Follower(spec, finishing=finishing)
        f.thread = threading.Thread(target=self._follow, args=(f,), name=f"follow-{spec.name}", daemon=True)
        self.followers[spec.name] = f
        log.info("%s: following (spec version %s; %d pipelines in this service)", spec.name, spec.version,
                 len(self.followers))
        f.thread.start()

    def _follow(self, f: Follower) -> None:
        try:
            f.summary = run_pipeline(self.engine, f.spec, self.db_url, self.bootstrap_servers, self.session,
                                     max_batches=1 if f.finishing else None, follow_idle_s=self.idle_s, stop=f.stop,
                                     backoff=self.backoff, upkeep_every_s=self.upkeep_every_s)
        except Exception as exc:  # noqa: BLE001 - one pipeline's stop is its own: the others go on
            f.error = exc
            log.error("%s stopped: %s; the other pipelines go on, and it starts again when its spec changes or in "
                      "%gs", f.spec.name, exc, self.retry_stopped_s)
        finally:
            f.ended_at = time.monotonic()


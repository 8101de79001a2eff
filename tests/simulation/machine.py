"""The simulation: a Hypothesis state machine whose rules are the product's operations, each drawn with its
arguments, interleaved, interrupted (a batch left planned or staged, as a killed process leaves it), and
checked after every step against the model (model.py): the target row for row, the quarantine, the cursors,
and `verify` clean. At the end of a history the open batch finishes, an hour passes, and compaction must
fold every batch with the checks still holding.
"""
from __future__ import annotations

import contextlib
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from sqlalchemy import text

from ledgerbatch.commit.modes.rollup import bound_partitions
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.model.batch import BatchStatus
from ledgerbatch.ops.abandon import abandon_batch
from ledgerbatch.ops.history import compact, purge_quarantine, upkeep
from ledgerbatch.ops.offsets import Target, set_offsets
from ledgerbatch.ops.pause import pause_pipeline, resume_pipeline
from ledgerbatch.ops.verify import verify
from ledgerbatch.plan.live import plan_next
from ledgerbatch.plan.replay import ReplayRequest, plan_replay, resolve_ranges
from tests.integration import staged
from tests.integration.staged import respec

from .model import Model, offsets
from .stand_ins import SERVERS, kafka_of
from .world import KINDS, PARTITIONS, Rules, World
from . import user_rules

PIPES = {  # mode -> staged.Pipe arguments
    "append": {"mode": "append"},
    "upsert": {"mode": "upsert"},
    "versioned": {"mode": "upsert", "version": "ts"},
    "changes": {"mode": "upsert", "deletes": True},
    "aggregate": {"mode": "aggregate"},
}


class Simulation(RuleBasedStateMachine):
    engine = None  # the session's engine and a temp dir for specs, set by the runner (run.py)
    directory: Path = None
    modes = tuple(PIPES)
    without: frozenset[str] = frozenset()  # `strand` and record kinds left out, to look past a fault found
    drawn: dict[str, int] = {}  # rule -> times drawn, over every history of the run
    histories: dict[str, list[int]] = {}  # mode -> [histories run, histories failing]

    def __init__(self):
        super().__init__()
        self.world = World()
        self.model = None
        self.pipe = None
        self.paused = False
        self.stranded: list[int] = []  # replays planned and walked away from (an interrupted `replay`)
        self._kafka = contextlib.ExitStack()
        self._kafka.enter_context(kafka_of(self.world))

    def _drawn(self, name: str) -> None:
        Simulation.drawn[name] = Simulation.drawn.get(name, 0) + 1

    # -- the pipeline

    @initialize(data=st.data(), attach_min_rows=st.integers(1, 4), first=st.integers(0, 6))
    def create(self, data, attach_min_rows, first):
        self.begin(data.draw(st.sampled_from(self.modes), label="mode"), attach_min_rows, first)

    def begin(self, mode: str, attach_min_rows: int = 4, first: int = 0) -> None:
        """A new pipeline that starts at the log's end: the `first` offsets of each partition are for backfills."""
        self.model = Model(mode, self.world)
        Simulation.histories.setdefault(mode, [0, 0])[0] += 1
        self.pipe = staged.Pipe(self.directory, max_ratio=1.0, **PIPES[mode])
        extra = {"source": {"start": "latest"}}
        if mode == "append":
            extra["target"] = {"partitions": {"max": 2, "attach_min_rows": attach_min_rows}}
        respec(self.pipe, **extra)
        for p in range(PARTITIONS):
            self.world.logs[p].kinds += ["good"] * first

    @rule(partition=st.integers(0, PARTITIONS - 1), data=st.data(), n=st.integers(1, 6))
    def produce(self, partition, data, n):
        kinds = [k for k in KINDS[self.model.mode] if k not in self.without]
        self.world.logs[partition].kinds += data.draw(st.lists(st.sampled_from(kinds), min_size=n, max_size=n))
        self._drawn("produce")

    @rule(partition=st.integers(0, PARTITIONS - 1), n=st.integers(1, 8))
    def retention(self, partition, n):
        """The log's start moves, never past what the live pipeline has still to read."""
        log = self.world.logs[partition]
        limit = min(self.model.cursors.get(partition, log.high), self._open_from(partition))
        log.low = max(log.low, min(log.low + n, limit))
        self._drawn("retention")

    # -- batches

    @rule()
    def run(self):
        """`ledgerbatch run`: the step Hypothesis draws most, a rule without arguments, so histories move on."""
        self.live("commit")

    @rule(stop=st.sampled_from(["commit", "planned", "staged"]))
    def live(self, stop):
        """Plan the next live batch (or resume the open one), stage it, commit it: or stop where a killed
        process would."""
        open_before = self._open_live()
        batch = plan_next(self.engine, self.pipe.spec, SERVERS)
        if not self.model.start and not self.paused:  # a paused pipeline does not start either
            self.model.start = {p: log.high for p, log in enumerate(self.world.logs)}
            self.model.cursors = dict(self.model.start)
        self._drawn("live")
        if batch is None:
            assert self.paused or not self.model.pending(), f"no batch planned, yet {self.model.pending()} is pending"
            return
        if open_before is None:  # a new batch: from each cursor to the log's end
            got = {r.partition: (r.from_offset, r.until_offset) for r in batch.ranges}
            assert got == self.model.pending(), f"planned {got}, expected {self.model.pending()}"
        else:
            assert batch.batch_id == open_before, f"planned batch {batch.batch_id} while {open_before} is open"
        self._finish(batch, stop)

    @rule(data=st.data(), partition=st.integers(0, PARTITIONS - 1), stop=st.sampled_from(["commit", "commit", "planned"]))
    def redeliver(self, data, partition, stop):
        """A replay or backfill of any range of the log (`ledgerbatch replay`, the backfill DAG)."""
        high = self.world.logs[partition].high
        if high == 0:
            return
        # the offsets where something changes (the log's start, the live start, the cursor), and any offset
        marks = sorted({0, high, self.world.logs[partition].low, self.model.start.get(partition, 0),
                        self.model.cursors.get(partition, 0)} - {high + 1})
        lo = data.draw(st.sampled_from(marks[:-1]) | st.integers(0, high - 1), label="from")
        hi = data.draw(st.sampled_from([m for m in marks if m > lo] or [high]) | st.integers(lo + 1, high), label="until")
        self.redeliver_range(partition, lo, hi, stop)

    def redeliver_range(self, partition: int, lo: int, hi: int, stop: str = "commit") -> None:
        expected = self.model.may_redeliver(partition, lo, hi)
        self._drawn(f"redeliver:{expected}")
        try:
            ranges = resolve_ranges(self.pipe.spec, SERVERS, ReplayRequest(self.pipe.topic, (partition,), lo, hi))
            batch = plan_replay(self.engine, self.pipe.spec, ranges)
        except LedgerbatchError as exc:
            lax = expected == "replay" and self.model.compacted and self.model.mode in ("changes", "aggregate")
            assert expected is None or (lax and "compacted" in str(exc)), \
                f"[{lo}, {hi}) of partition {partition} refused, yet it is a {expected}: {exc}"
            return
        assert expected is not None, f"[{lo}, {hi}) of partition {partition} accepted as a {batch.kind}: it must be refused"
        assert batch.kind == expected, f"[{lo}, {hi}) planned as a {batch.kind}, expected a {expected}"
        if stop == "planned" and "strand" not in self.without:
            self.stranded.append(batch.batch_id)
            return
        self._finish(batch, "commit")

    def _finish(self, batch, stop: str) -> None:
        if batch.status == BatchStatus.PLANNED:
            s = staged.begin(self.engine, self.pipe, batch.batch_id)
            if stop == "planned":
                return
            good, bad = self._records(batch.ranges)
            staged.fill(self.engine, self.pipe, s, good, bad)
            if stop == "staged":
                return
        elif stop != "commit":
            return
        commit_batch(self.engine, self.pipe.spec, batch.batch_id)
        self.model.deliver(str(batch.kind), batch.ranges)
        if str(batch.kind) == "live":
            for r in batch.ranges:
                self.model.cursors[r.partition] = r.until_offset

    def _records(self, ranges) -> tuple[list[tuple], list[tuple]]:
        """What the executors would stage: good rows and bad records, as staged.fill takes them."""
        good, bad = [], []
        for p, o in offsets(ranges):
            rec = self.world.record(p, o)
            if rec is None:
                bad.append((p, o, "poison: not JSON"))
            elif self.model.mode == "aggregate":
                good.append((p, o, rec.key, rec.amount))
            else:
                amount = rec.amount if rec.amount is not None or self.model.mode == "changes" else "0.00"
                good.append((p, o, rec.key, amount, rec.version))
        return good, bad

    @rule(stranded=st.booleans())
    def abandon_open(self, stranded):
        """`ledgerbatch abandon` of the open live batch (its offsets are planned again), or of a replay or
        backfill walked away from."""
        self._drawn("abandon_open")
        open_id = self.stranded.pop() if stranded and self.stranded else self._open_live()
        if open_id is not None:
            abandon_batch(self.engine, self.pipe.spec, open_id, by="sim", reason="abandoned by the simulation")

    # -- operations on the pipeline

    @rule(before=st.sampled_from(["now", "past"]))
    def compact_now(self, before):
        """`ledgerbatch compact --before`: fold what finished before now (or before an hour ago: nothing)."""
        at = datetime.now(timezone.utc) + (timedelta(seconds=1) if before == "now" else timedelta(hours=-1))
        done = compact(self.engine, self.pipe.spec, at)
        self.model.compacted |= done.batches > 0
        self._drawn("compact")

    @precondition(lambda self: self.model is not None and self.model.mode == "append")
    @rule(why=st.just("upkeep"))
    def rollup(self, why="upkeep"):
        """The partition rollup the upkeep runs: merge until the target is within target.partitions.max."""
        bound_partitions(self.engine, self.pipe.spec)
        with self.engine.connect() as conn:  # a rollup that gives way says so only in a log and a metric
            partitions = conn.execute(text("SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass(:t)"),
                                      {"t": f'public."{self.pipe.table}"'}).scalar_one()
        assert partitions <= 2, f"{partitions} partitions after the rollup, over target.partitions.max 2"
        self._drawn("rollup")

    @rule(why=st.just("retention"))
    def purge(self, why="retention"):
        """`ledgerbatch quarantine purge` of everything quarantined so far."""
        purge_quarantine(self.engine, self.pipe.spec, datetime.now(timezone.utc) + timedelta(seconds=1))
        self.model.quarantine.clear()
        self._drawn("purge")

    @precondition(lambda self: self.model is not None and self.model.start)
    @rule(why=st.just("skip"))
    def skip_to_latest(self, why="skip"):
        """`ledgerbatch offsets --to-latest`: refused while a live batch is open."""
        open_id = self._open_live()
        try:
            set_offsets(self.engine, self.pipe.spec, SERVERS, Target(latest=True), by="sim", reason="skip")
        except LedgerbatchError as exc:
            assert open_id is not None, f"moving the cursors to the end was refused: {exc}"
            return
        assert open_id is None, f"moved the cursors while batch {open_id} is open"
        self.model.cursors = {p: self.world.logs[p].high for p in self.model.cursors}
        self._drawn("skip_to_latest")

    @rule(why=st.sampled_from(["maintenance", "an incident"]))
    def pause_or_resume(self, why="the end of the history"):
        if self.paused:
            resume_pipeline(self.engine, self.pipe.spec, by="sim")
        else:
            pause_pipeline(self.engine, self.pipe.spec, by="sim", reason=why)
        self.paused = not self.paused
        self._drawn("pause_or_resume")

    @precondition(lambda self: self.model is not None and self.model.mode in ("append", "upsert"))
    @rule(which=st.sampled_from(["check", "trigger", "key_index"]))
    def user_ddl(self, which):
        """The user adds a rule of their own to the target, as on any big table."""
        if which == "key_index" and self.model.mode != "append" or getattr(self.model.rules, which):
            return
        self._drawn(f"user_ddl:{which}")
        if not user_rules.add(self.engine, self.pipe, which):
            return  # no target yet, or the index cannot hold a key already there
        self.model.rules = Rules(**{**self.model.rules.__dict__, which: True})

    # -- checks

    @invariant()
    def agrees(self):
        if self.pipe is None:
            return
        got = staged.target(self.engine, self.pipe) or []
        got = [t[:-1] for t in got]
        want = self.model.target()
        assert got == want, f"target differs from the model:\n got {_short(got)}\nwant {_short(want)}"
        assert self._quarantine() == self.model.quarantine, \
            f"quarantine differs:\n got {self._quarantine()}\nwant {self.model.quarantine}"
        if self.model.start:
            cursors = staged.cursors(self.engine, self.pipe)
            assert cursors == self.model.cursors, f"cursors {cursors}, expected {self.model.cursors}"
        problems = verify(self.engine, self.pipe.spec)
        assert not problems, f"verify: {problems}"

    def teardown(self):
        failed = _failed()  # a step failed: no settling on top of it
        try:
            if self.pipe is not None and not failed:
                self._settle()
        except Exception:
            failed = True
            raise
        finally:
            if self.pipe is not None and failed:
                Simulation.histories[self.model.mode][1] += 1
            self._kafka.close()

    def _settle(self):
        """The open batch finishes; an hour passes (stranded replays' leases lapse); the upkeep folds every batch."""
        if self.paused:
            self.pause_or_resume()
        open_id = self._open_live()
        if open_id is not None:
            self.live("commit")
        with self.engine.begin() as conn:
            conn.execute(text(
                "UPDATE ledger.batches SET updated_at = updated_at - interval '1 hour', heartbeat_at = "
                "heartbeat_at - interval '1 hour', committed_at = committed_at - interval '1 hour' WHERE pipeline = :p"),
                {"p": self.pipe.name})
        respec(self.pipe, history={"compact_after": "30m"})
        upkeep(self.engine, self.pipe.spec)
        with self.engine.connect() as conn:
            left = conn.execute(text("SELECT batch_id, kind, status FROM ledger.batches WHERE pipeline = :p"),
                                {"p": self.pipe.name}).all()
        assert not left, f"batches left unfolded an hour later: {left}"
        self.agrees()
        self._drawn("settle")

    def _quarantine(self) -> dict:
        with self.engine.connect() as conn:
            return {(r.partition, r.offset): r.sqlstate for r in conn.execute(text(
                'SELECT partition, "offset", sqlstate FROM ledger.quarantine WHERE pipeline = :p'), {"p": self.pipe.name})}

    def _open_live(self) -> int | None:
        with self.engine.connect() as conn:
            return conn.execute(text(
                "SELECT batch_id FROM ledger.batches WHERE pipeline = :p AND kind = 'live' "
                "AND status IN ('planned', 'staged') ORDER BY batch_id LIMIT 1"), {"p": self.pipe.name}).scalar()

    def _open_from(self, partition: int) -> int:
        """Where the open batches' ranges start in `partition` (retention may not pass what is being read)."""
        with self.engine.connect() as conn:
            low = conn.execute(text(
                "SELECT min(r.from_offset) FROM ledger.batch_ranges r JOIN ledger.batches b USING (batch_id) "
                "WHERE b.pipeline = :p AND r.partition = :part AND b.status IN ('planned', 'staged')"),
                {"p": self.pipe.name, "part": partition}).scalar()
        return self.world.logs[partition].high if low is None else low


def _short(rows: list[tuple]) -> list[tuple]:
    """Rows as a message shows them: a long key by its first characters."""
    return [tuple(f"{v[:12]}..." if isinstance(v, str) and len(v) > 40 else v for v in row) for row in rows]


def _failed() -> bool:
    """A step failed (Hypothesis's own StopTest, which ends a history that ran out of data, is no failure)."""
    return isinstance(sys.exc_info()[1], Exception)

"""Turns: the batches that many pipelines' threads stage at one time go to Spark as ONE job (ops/service.py).

A batch costs a Spark job's fixed overhead (scheduling, Python workers, a few hundred ms of CPU for a few
dozen records) whatever its size: one job a batch caps a machine at 2-3 batches a second in all. Here a
pipeline's thread hands its job (a plain one: no transform or query, whose Spark plans differ per pipeline) to
`Turns.stage` and waits. The first to arrive while no turn runs leads: it takes every job queued, runs them as
one job of at most two tasks a core (turn_tasks.py; each task a share of the ranges of about equal size:
model/ranges.py share_out), and hands each job its counts. Jobs that arrive meanwhile wait for the next turn, so a turn takes what piled up
during the last and the number of batches a second grows with the number of pipelines. Each pipeline keeps
one batch a turn; one with much to do gets bigger batches (its spec's batch limits), not more turns.

A leader first waits, GATHER_S at most, for every pipeline that staged lately (ACTIVE_S) to be queued: those
of the turn before are still committing, and a turn that started without them split the pipelines into two
cohorts taking turns (30 pipelines: turns of 19 and 11 batches alternating, each Spark job 0.6-0.8 s whatever
its size), doubling every pipeline's wait.

A job's own failure is its alone (turn_tasks.py); a failure of the whole Spark job (Spark's outage) is every
job's, and each pipeline's thread waits it out as it would its own."""
from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field

from ledgerbatch.model.ranges import share_out
from ledgerbatch.stage.job import StagingJob
from ledgerbatch.stage.turn_tasks import TURN_COUNTS, stage_turn

log = logging.getLogger(__name__)
GATHER_S = 0.25  # how long a leader waits at most for the pipelines staging lately to queue
ACTIVE_S = 5.0  # a pipeline that queued this recently is waited for


class TurnJobError(RuntimeError):
    """A job of a turn failed in its tasks: the message is its reason as its task saw it."""


@dataclass
class _Seat:
    job: StagingJob
    thread: int = field(default_factory=threading.get_ident)  # a pipeline's: each follows in a thread of its own
    done: bool = False
    rows: list = field(default_factory=list)
    error: BaseException | None = None


class Turns:
    def __init__(self, tasks_per_core: int = 2, gather_s: float = GATHER_S):
        self.tasks_per_core, self.gather_s = tasks_per_core, gather_s
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # a turn done, or the lead free
        self._arrivals = threading.Condition(lock)  # a job queued: only a gathering leader waits on it
        self._queue: list[_Seat] = []
        self._running = False
        self._seen: dict[int, float] = {}  # thread -> when it last queued or its turn ended
        self.turns = 0  # how many turns ran (for the logs and tests)

    def stage(self, spark, job: StagingJob, parallelism: int) -> list:
        """Stage `job` in a turn; its COUNTS rows (one a staged range). Raises TurnJobError for the job's own
        failure, Spark's error for the turn's. `parallelism`: the cluster's cores, if this thread leads."""
        seat = _Seat(job)
        with self._cond:
            self._queue.append(seat)
            self._seen[seat.thread] = time.monotonic()
            self._arrivals.notify()
            while not seat.done and self._running:
                self._cond.wait()
            if not seat.done:  # nobody runs a turn: this thread leads one with every job waiting
                self._running = True
                self._gather()
                turn, self._queue = self._queue, []
        if not seat.done:
            try:
                self._run(spark, turn, parallelism)
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()
        if seat.error is not None:
            raise seat.error
        return seat.rows

    def _gather(self) -> None:
        """Wait (holding the lead, the condition's lock released) until every pipeline that queued or had a turn
        end within ACTIVE_S is queued again, or gather_s passed: those that did not come then are not waited for
        again until they queue, so a trickle or a pipeline in an outage costs the others one wait, not one a turn."""
        deadline = time.monotonic() + self.gather_s
        while True:
            now = time.monotonic()
            self._seen = {t: at for t, at in self._seen.items() if now - at < ACTIVE_S}
            queued = {seat.thread for seat in self._queue}
            if self._seen.keys() <= queued:
                return
            if now >= deadline:  # those that did not come (a trickle, a pipeline waiting out an outage) are not
                self._seen = {t: at for t, at in self._seen.items() if t in queued}  # waited for again till they queue
                return
            self._arrivals.wait(deadline - now)

    def _run(self, spark, turn: list[_Seat], parallelism: int) -> None:
        started = time.monotonic()
        jobs = tuple(seat.job for seat in turn)
        items = tuple((j, r) for j, job in enumerate(jobs) for r in range(len(job.ranges)))
        try:
            shares = share_out([jobs[j].ranges[r].span for j, r in items], self.tasks_per_core * parallelism)
            task = functools.partial(stage_turn, jobs=jobs, items=items, shares=shares)
            rows = spark.range(0, len(shares), 1, len(shares)).mapInArrow(task, TURN_COUNTS).collect()
        except BaseException as exc:
            for seat in turn:
                seat.error = exc
        else:
            for row in rows:
                seat = turn[row.job]
                if row.error is not None:
                    seat.error = TurnJobError(row.error)
                else:
                    seat.rows.append(row)
        finally:
            with self._cond:
                ended = time.monotonic()
                for seat in turn:
                    seat.done = True
                    self._seen[seat.thread] = ended
                self.turns += 1
        log.info("turn %d: %d batches (one a pipeline), %d ranges, in one Spark job (%.2fs)", self.turns, len(jobs),
                 len(items), time.monotonic() - started)

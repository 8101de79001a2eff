"""Crash points for fault-injection tests: LEDGERBATCH_CRASH_AT=<point> SIGKILLs the whole process group there.

Points: after_plan, mid_read (in an executor, after the first records of a range), after_stage,
before_commit (inside the commit transaction), after_commit. The whole group dies: driver, Spark
JVM and Python workers. Unset in normal operation; the tests start the runner in its own group.
"""
from __future__ import annotations

import os
import signal
import sys

POINTS = ("after_plan", "mid_read", "after_stage", "before_commit", "after_commit")
TERMINATE_POINTS = ("before_commit", "compaction_step", "rollup_swap")


def terminate_point(conn, name: str) -> None:
    """LEDGERBATCH_TERMINATE_AT=<point>: the database ends this connection's backend there
    (pg_terminate_backend), as a failover or an operator would. TERMINATE_POINTS, each inside its transaction
    before COMMIT: a batch's commit, a compaction step, the rollup's swap."""
    if os.environ.get("LEDGERBATCH_TERMINATE_AT") == name:
        print(f"fault injection: pg_terminate_backend at {name}", file=sys.stderr, flush=True)
        conn.exec_driver_sql("SELECT pg_terminate_backend(pg_backend_pid())")


def arm() -> None:
    """Called by the runner before Spark starts: executors (in PySpark's own process groups) learn
    which group to kill through the environment they inherit."""
    point = os.environ.get("LEDGERBATCH_CRASH_AT")
    if point and point not in POINTS:
        raise ValueError(f"LEDGERBATCH_CRASH_AT={point} is not a crash point ({', '.join(POINTS)})")
    terminate = os.environ.get("LEDGERBATCH_TERMINATE_AT")
    if terminate and terminate not in TERMINATE_POINTS:
        raise ValueError(f"LEDGERBATCH_TERMINATE_AT={terminate} is not a point ({', '.join(TERMINATE_POINTS)})")
    if point:
        os.environ.setdefault("LEDGERBATCH_CRASH_PGID", str(os.getpgid(0)))


def crash_point(name: str) -> None:
    if os.environ.get("LEDGERBATCH_CRASH_AT") == name:
        print(f"fault injection: SIGKILL at {name}", file=sys.stderr, flush=True)
        runner = int(os.environ.get("LEDGERBATCH_CRASH_PGID") or os.getpgid(0))
        os.killpg(runner, signal.SIGKILL)
        os.killpg(os.getpgid(0), signal.SIGKILL)  # an executor's own group: PySpark's daemon and workers

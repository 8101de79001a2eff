"""Crash points for fault-injection tests: LEDGERBATCH_CRASH_AT=<point> SIGKILLs the whole process group there.

Points: after_plan, after_stage, before_commit (inside the commit transaction), after_commit.
Unset in normal operation; the tests start the runner in its own process group.
"""
from __future__ import annotations

import os
import signal
import sys

POINTS = ("after_plan", "after_stage", "before_commit", "after_commit")


def crash_point(name: str) -> None:
    if os.environ.get("LEDGERBATCH_CRASH_AT") == name:
        print(f"fault injection: SIGKILL at {name}", file=sys.stderr, flush=True)
        os.killpg(os.getpgid(0), signal.SIGKILL)

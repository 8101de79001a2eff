"""Run the simulation for a while: rounds of histories, each round with a seed of its own (printed, so a
failing round replays with LEDGERBATCH_SIM_SEED=<seed>). Hypothesis shrinks a failing history to a minimal
one and prints it step by step.

    python -m tests.simulation.run --minutes 60 [--seed N] [--modes append,changes] [--keep-going]
        [--without strand|tamper|interfere|offsets|lose|KIND ...] [--no-shrink] [--examples 10] [--steps 40]
"""
from __future__ import annotations

import argparse
import atexit
import logging
import os
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as with_seed
from hypothesis.stateful import run_state_machine_as_test

from .machine import PIPES, Simulation


def explore(engine, seconds: float, first_seed: int | None = None, examples: int = 10, steps: int = 40,
            modes: tuple[str, ...] = tuple(PIPES), keep_going: bool = False, shrink: bool = True,
            without: frozenset[str] = frozenset()) -> list[int]:
    """Rounds of `examples` histories of up to `steps` steps until `seconds` pass; the failing rounds' seeds.
    Without `keep_going` the first failure is raised (after Hypothesis shrank it)."""
    Simulation.engine = engine
    Simulation.directory = Path(tempfile.mkdtemp(prefix="ledgerbatch-sim-"))
    replay = os.environ.get("LEDGERBATCH_SIM_SEED")
    rng = random.Random(first_seed)
    deadline, failed = time.monotonic() + seconds, []
    while True:
        seed = int(replay) if replay else rng.randrange(1 << 30)
        print(f"simulation round: LEDGERBATCH_SIM_SEED={seed} modes={','.join(modes)}", flush=True)
        machine = type("Simulation", (Simulation,), {})
        machine.modes, machine.without = modes, without
        factory = with_seed(seed)(lambda: machine())
        try:
            run_state_machine_as_test(factory, settings=settings(
                max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
                suppress_health_check=list(HealthCheck),
                phases=list(Phase) if shrink else [Phase.generate]))
        except Exception:
            if not keep_going:
                raise
            traceback.print_exc()
            failed.append(seed)
        if replay or time.monotonic() >= deadline:
            return failed


def drop_database(engine, name: str) -> None:
    from ledgerbatch.ledger.engine import make_engine
    from sqlalchemy import text

    engine.dispose()
    admin = make_engine(engine.url.set(database="postgres").render_as_string(hide_password=False))
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def main(argv=None) -> int:
    from ledgerbatch.config import Settings
    from ledgerbatch.ledger.engine import fresh_database, make_engine
    from ledgerbatch.ledger.migrations import migrate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--modes", default=",".join(PIPES))
    parser.add_argument("--keep-going", action="store_true")
    parser.add_argument("--without", choices=["strand", "tamper", "interfere", "offsets", "lose", "poison", "negative", "flagged",
                                              "long", "tombstone", "aborted"],
                        action="append", default=[], help="to look past a fault found: strand, never walk away from "
                        "a planned replay; tamper, interfere, offsets, lose, never draw that rule; a record kind, never produced")
    parser.add_argument("--no-shrink", action="store_true", help="report a failing history as found, unshrunk")
    parser.add_argument("--examples", type=int, default=10, help="histories per round")
    parser.add_argument("--steps", type=int, default=40, help="steps per history, at most")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the product's warnings (skips, pauses) are the history's own steps
    # a database of its own: runs side by side never share one
    name = f"ledgerbatch_simulation_{os.getpid()}"
    engine = make_engine(fresh_database(Settings.from_env().db_url, name))
    migrate(engine)
    atexit.register(drop_database, engine, name)
    failed = explore(engine, args.minutes * 60, args.seed, examples=args.examples, steps=args.steps,
                     modes=tuple(args.modes.split(",")), keep_going=args.keep_going,
                     shrink=not args.no_shrink, without=frozenset(args.without))
    print(f"steps by rule: {dict(sorted(Simulation.drawn.items()))}")
    print("histories by mode (run, failing; Hypothesis replays a failing one while it shrinks): "
          + ", ".join(f"{m} {n} {f}" for m, (n, f) in sorted(Simulation.histories.items())))
    print(f"failing seeds: {failed}" if failed else "no failing history")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The warm one-batch contender of bench.run at two versions side by side, against the floor on the same data:
did a change slow the big batch (attached as a partition, metadata only) down?

    python -m bench.warm_ab --before GIT_REV [--records 1000000] [--partitions 32] [--runs 3]

The other version is checked out in a temporary git worktree and run with its `plugins/` first on
PYTHONPATH (its own package, SQL and Spark job); runs are interleaved per round: floor, before, after.
Prints each one's medians and its ratio to the floor's. Its databases are prefixed `lb_ab_`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("LEDGERBATCH_BENCH_DB_PREFIX", "lb_ab_")

from . import common, floor, lb  # noqa: E402
from .common import DB_PREFIX, REPO, BrokerProcess  # noqa: E402
from ledgerbatch.dev.demodata import produce_orders  # noqa: E402

TOPIC = "ab_orders"


def warm(bootstrap: str, workdir: Path, records: int, plugins: Path | None) -> float:
    """bench.run's warm contender (lb.run_warm), on the package in `plugins` when given; its plan + process +
    commit seconds."""
    env_of = lb.child_env
    if plugins:
        lb.child_env = lambda **kw: common.child_env(PYTHONPATH=str(plugins), **kw)
    try:
        name = f"{DB_PREFIX}{'before' if plugins else 'after'}"
        result = lb.run_warm(bootstrap, TOPIC, name, workdir, records)
    finally:
        lb.child_env = env_of
    if result["rows"] != records:
        raise RuntimeError(f"{result['rows']} rows for {records} records")
    return result["wall_s"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.warm_ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, metavar="GIT_REV")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--partitions", type=int, default=32)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="lb_ab_"))
    before = workdir / "before"
    subprocess.run(["git", "worktree", "add", "--detach", str(before), args.before], cwd=REPO, check=True,
                   capture_output=True)
    broker = BrokerProcess({TOPIC: args.partitions})
    walls = {"floor": [], "before": [], "after": []}
    try:
        produce_orders(broker.bootstrap, TOPIC, args.records, args.partitions)
        for i in range(args.runs):
            print(f"round {i + 1}/{args.runs}", file=sys.stderr, flush=True)
            walls["floor"].append(floor.run(broker.bootstrap, TOPIC, args.partitions, f"{DB_PREFIX}floor")["wall_s"])
            walls["before"].append(warm(broker.bootstrap, workdir, args.records, before / "plugins"))
            walls["after"].append(warm(broker.bootstrap, workdir, args.records, None))
    finally:
        broker.close()
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=REPO, capture_output=True)
    medians = {k: statistics.median(v) for k, v in walls.items()}
    print(json.dumps({"before": args.before, "records": args.records, "runs": args.runs,
                      "walls_s": {k: [round(w, 3) for w in v] for k, v in walls.items()},
                      "median_s": {k: round(v, 3) for k, v in medians.items()},
                      "ratio_to_floor": {k: round(medians[k] / medians["floor"], 3) for k in ("before", "after")}},
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

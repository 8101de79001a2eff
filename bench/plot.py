"""The benchmark's figure: throughput, peak memory by role, small-batch latency, scaling with the ledger, and
the aggregate's time a record at growing batch sizes."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from .report import CONTENDERS  # noqa: E402

ROLES = [("python", "driver / Python"), ("jvm", "JVM"), ("executor", "Spark Python workers")]


def plot(r: dict, path: Path) -> None:
    c, records = r["contenders"], r["config"]["records"]
    labels = ["floor", "peer", "lb cold", "lb warm", "lb Avro\nwarm", "lb aggregate\nwarm", "lb filter\nwarm",
              "lb 4 batches"]
    fig, ((thr, mem, lat), (scale, size, spare)) = plt.subplots(2, 3, figsize=(20, 8))
    fig.delaxes(spare)
    fig.suptitle(f"ledgerbatch benchmark: {records:,} records, {r['config']['partitions']} partitions, "
                 f"median of {r['config']['runs']} (on {r['started'][:10]})")

    rates = [records / c[k]["wall_s"] for k, _ in CONTENDERS]
    thr.bar(labels, rates, color=["grey", "tab:orange", "tab:blue", "tab:green", "tab:olive", "tab:purple", "tab:brown",
                                  "tab:cyan"])
    thr.set_title("throughput (records/s, higher is better)")
    for i, v in enumerate(rates):
        thr.annotate(f"{v:,.0f}", (i, v), ha="center", va="bottom")

    bottom = [0.0] * len(CONTENDERS)
    for role, name in ROLES:
        values = [c[k]["memory_mib"].get(role, 0) for k, _ in CONTENDERS]
        mem.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    mem.set_title("peak memory (summed PSS, MiB)")
    mem.legend()

    lr = r["latency"]
    names = ["cold", "warm"]
    values = [lr[n]["median_s"] or 0 for n in names]
    lat.bar(names, values, color=["tab:red", "tab:green"])
    lat.axhline(12, color="tab:red", ls="--", lw=1, label="cold target 12 s")
    lat.axhline(3, color="tab:green", ls="--", lw=1, label="warm target 3 s")
    for i, n in enumerate(names):
        lat.annotate("n/a" if lr[n]["median_s"] is None else f"{values[i]:.2f} s", (i, values[i]), ha="center", va="bottom")
    lat.set_title("100 records, produced -> committed (s)")
    lat.legend()

    append = [s for s in r["scaling"] if s.get("mode", "append") == "append"]
    aggregate = [s for s in r["scaling"] if s.get("mode") == "aggregate"]
    ns = [s["historic_batches"] for s in append]
    scale.plot(ns, [s["plan_s"] for s in append], "o-", label="plan")
    scale.plot(ns, [s["commit_s"] for s in append], "s-", label="commit")
    scale.plot(ns, [s["plan_commit_s"] for s in append], "^-", label="plan + commit")
    if aggregate:
        scale.plot([s["historic_batches"] for s in aggregate], [s["plan_commit_s"] for s in aggregate], "v--",
                   label="plan + commit, aggregate")
    scale.set_xscale("log")
    scale.set_xlabel("historic batches in the ledger")
    scale.set_ylim(bottom=0)
    scale.set_title("one 100-record batch vs. ledger size (s)")
    scale.legend()

    _sizes(size, r)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _sizes(ax, r: dict) -> None:
    """µs a record of the warm aggregate and the floor: the main runs' batch, then each --sizes batch."""
    c, records = r["contenders"], r["config"]["records"]
    points = [(records, c["ledgerbatch_aggregate_warm"]["wall_s"], c["floor"]["wall_s"])]
    points += [(x["records"], x["aggregate_s"], x["floor_s"]) for x in r.get("sizes") or []]
    points.sort()
    ns = [n for n, _, _ in points]
    ax.plot(ns, [a / n * 1e6 for n, a, _ in points], "o-", color="tab:purple", label="lb aggregate warm")
    ax.plot(ns, [f / n * 1e6 for n, _, f in points], "s--", color="grey", label="floor")
    ax.set_xscale("log")
    ax.set_xlabel("records in the batch")
    ax.set_ylim(bottom=0)
    ax.set_title("time a record (µs) vs. batch size")
    ax.legend()

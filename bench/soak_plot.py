"""The soak's figure (bench/soak.py): each series against the batches committed, for both pipelines."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

SERIES = [("plan_commit_s", "plan + commit per batch (s)"), ("lookup_ms", "lookup by coordinates (ms)"),
          ("count_planning_ms", "count(*) WHERE customer, planning (ms)"), ("ledger_bytes", "ledger size (MiB)"),
          ("partitions", "target partitions"), ("verify_ledger_s", "verify, its ledger part (s)")]


def plot(result: dict, path: Path) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(18, 8))
    fig.suptitle(f"ledgerbatch history soak: compaction and quarantine retention after "
                 f"{result['config']['compact_after']:g}s, at most 16 partitions ({result['started'][:10]})")
    for ax, (key, title) in zip(axes.flat, SERIES):
        for name, colour in (("soak_append", "tab:blue"), ("soak_upsert", "tab:orange")):
            if key == "plan_commit_s":
                ys = result["per_batch_plan_commit_s"][name]
                step = max(1, len(ys) // 400)  # a median per step of batches keeps the line readable
                xs = list(range(0, len(ys), step))
                ys = [sorted(ys[i:i + step])[len(ys[i:i + step]) // 2] for i in xs]
            else:
                xs = [s[name]["batches"] for s in result["samples"]]  # the ledger is one: its size is shared
                ys = [s["ledger_bytes"] / 2 ** 20 if key == "ledger_bytes" else s[name][key] for s in result["samples"]]
            ax.plot(xs, ys, label=name, color=colour, linewidth=1)
        ax.set_title(title)
        ax.set_xlabel("batches committed")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)

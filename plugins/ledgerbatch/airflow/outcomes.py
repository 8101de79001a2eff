"""A task's outcome as the one line a person reads in the UI (the task's return value, its XCom) and in its
log: what the batch covers, what it did, where to look next."""
from __future__ import annotations

from ledgerbatch.model.batch import Batch
from ledgerbatch.model.range_text import compact_ranges, ranges_line


def dry_run_line(batch: Batch, diff) -> str:
    """`dry run of replay batch 5, orders[0] [0, 100): 100 unchanged, 0 added, ...; target untouched`."""
    return (f"dry run of {batch.kind} batch {batch.batch_id}, {ranges_line(batch.ranges)}: {diff.unchanged} "
            f"unchanged, {diff.added} added, {diff.removed} removed, {diff.changed} changed, {diff.quarantined} "
            f"quarantined; target untouched")


def commit_line(batch: Batch, target: str, result) -> str:
    """`replay batch 5 committed into public.orders, 2 ranges: ...: 99 rows written, 1 quarantined (...)`."""
    done = "was already committed" if result.already_committed else "committed"
    line = (f"{batch.kind} batch {batch.batch_id} {done} into {target}, {compact_ranges(batch.ranges)}: "
            f"{result.rows_written} row{'' if result.rows_written == 1 else 's'} written, {result.rows_quarantined} "
            f"quarantined")
    if result.rows_quarantined:
        line += f" (read them: SELECT * FROM ledger.quarantine WHERE batch_id = {batch.batch_id})"
    return line


def moves_line(pipeline: str, dry_run: bool, target, moves) -> str:
    """The offsets DAG's moves, one clause per partition."""
    what = "dry run, nothing moved" if dry_run else "moved"
    return f"{pipeline} {target} ({what}): " + "; ".join(map(str, moves))


def upkeep_line(pipeline: str, counts: dict) -> str:
    return f"{pipeline}: " + ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in counts.items())

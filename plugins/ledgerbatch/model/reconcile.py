"""Pure reconciliation of a batch's counts (no I/O)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ledgerbatch.errors import OVER_BUDGET, ReconcileError


@dataclass(frozen=True)
class Counts:
    records_read: int
    rows_written: int
    rows_quarantined: int
    rows_deleted: int = 0  # change pipelines: records that deleted a key
    records_skipped: int = 0  # change pipelines: records skipped by design (tombstones)
    rows_rejected: int = 0  # staged rows the target refused at publish (commit/rejects.py)
    records_superseded: int = 0  # versioned upserts: changes older than their key's newest (commit/modes/versioned.py)

    def __repr__(self) -> str:
        changes = (f", rows_deleted={self.rows_deleted}, records_skipped={self.records_skipped}"
                   if self.rows_deleted or self.records_skipped else "")
        return (f"Counts(records_read={self.records_read}, rows_written={self.rows_written}, "
                f"rows_quarantined={self.rows_quarantined}{changes})")


def set_aside_counts(counts: Counts, published) -> Counts:
    """The counts after the publish moved rows it did not publish (refused, superseded) out of written and
    deleted; `published` is the batch as the ledger holds it then."""
    return replace(counts, rows_written=published.rows_written, rows_deleted=published.rows_deleted,
                   rows_rejected=published.rows_rejected, records_superseded=published.records_superseded)


def check_error_budget(counts: Counts, policy: str, max_ratio: float, min_bad: int = 0) -> None:
    """Too many bad records (or any, under policy `fail`) fails the batch before anything is committed;
    rows the target refused count as bad. The ratio trips only above `min_bad` bad records, so a small
    batch that happens to end on a few poison records does not stop the pipeline."""
    bad, read = counts.rows_quarantined + counts.rows_rejected, counts.records_read
    refused = f" ({counts.rows_rejected} refused by the target)" if counts.rows_rejected else ""
    if bad and policy == "fail":
        raise ReconcileError(f"{bad} of {read} records are bad{refused} and errors.policy is fail")
    if read and bad > min_bad and bad / read > max_ratio:
        floor = f" and more than errors.min_bad {min_bad}" if min_bad else ""
        raise ReconcileError(
            f"{bad} of {read} records are bad{refused} ({bad / read:.1%}), {OVER_BUDGET} {max_ratio:.1%}{floor}"
        )


def reconcile(ledger: Counts, staged: Counts) -> None:
    """The staged table must hold exactly what the executors reported, and read = written + deleted +
    skipped + quarantined."""
    if ledger.records_read != ledger.rows_written + ledger.rows_deleted + ledger.records_skipped + ledger.rows_quarantined:
        changes = (f" + rows_deleted {ledger.rows_deleted} + records_skipped {ledger.records_skipped}"
                   if ledger.rows_deleted or ledger.records_skipped else "")
        raise ReconcileError(
            f"records_read {ledger.records_read} != rows_written {ledger.rows_written}{changes} + rows_quarantined {ledger.rows_quarantined}"
        )
    if staged != ledger:
        raise ReconcileError(f"staging table holds {staged} but the ledger recorded {ledger}")


def reconcile_ranges(expected: dict[tuple[str, int], int], staged: dict[tuple[str, int], int]) -> None:
    """Each range's staged rows must match the records read from it."""
    for tp in sorted(set(expected) | set(staged)):
        if expected.get(tp, 0) != staged.get(tp, 0):
            raise ReconcileError(
                f"{tp[0]}[{tp[1]}]: {staged.get(tp, 0)} rows staged but {expected.get(tp, 0)} records read"
            )


def query_counts(reads: dict[tuple[str, int], tuple[int, int]], output_rows: int, aggregate: bool) -> tuple[int, int | None]:
    """A query pipeline's (records filtered, groups written) from what its tasks read (records, bad per
    range) and the rows its query gave. Append and upsert queries give at most one row per record
    (each keeps its coordinates); an aggregate query's groups are counted apart from the records."""
    good = sum(records - bad for records, bad in reads.values())
    if aggregate:
        return 0, output_rows
    if output_rows > good:
        raise ReconcileError(f"the query gave {output_rows} rows for {good} good records: an append or upsert "
                             f"query gives at most one row per record")
    return good - output_rows, None


def reconcile_query(batch, bad: dict[tuple[str, int], int], output_rows: int, aggregate: bool) -> None:
    """A query pipeline's staging against its ledger record: the bad records, per range and in all,
    and the query's output (rows, or an aggregate's groups)."""
    if sum(bad.values()) != batch.rows_quarantined:
        raise ReconcileError(f"batch {batch.batch_id}: staging holds {sum(bad.values())} bad records but the ledger "
                             f"recorded {batch.rows_quarantined}")
    for tp, n in sorted(bad.items()):
        if n > (batch.range_counts.get(tp) or 0):
            raise ReconcileError(f"{tp[0]}[{tp[1]}]: {n} bad records staged but {batch.range_counts.get(tp) or 0} "
                                 f"records read")
    expected = batch.groups_written if aggregate else batch.rows_written
    if output_rows != expected:
        raise ReconcileError(f"batch {batch.batch_id}: staging holds {output_rows} {'groups' if aggregate else 'rows'} "
                             f"but the ledger recorded {expected}")

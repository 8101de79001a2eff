"""Pure reconciliation of a batch's counts (no I/O)."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ReconcileError


@dataclass(frozen=True)
class Counts:
    records_read: int
    rows_written: int
    rows_quarantined: int


def check_error_budget(counts: Counts, policy: str, max_ratio: float) -> None:
    """Too many bad records (or any, under policy `fail`) fails the batch before anything is committed."""
    bad, read = counts.rows_quarantined, counts.records_read
    if bad and policy == "fail":
        raise ReconcileError(f"{bad} of {read} records are bad and errors.policy is fail")
    if read and bad / read > max_ratio:
        raise ReconcileError(
            f"{bad} of {read} records are bad ({bad / read:.1%}), more than errors.max_ratio {max_ratio:.1%}"
        )


def reconcile(ledger: Counts, staged: Counts) -> None:
    """The staged table must hold exactly what the executors reported, and read = written + quarantined."""
    if ledger.records_read != ledger.rows_written + ledger.rows_quarantined:
        raise ReconcileError(
            f"records_read {ledger.records_read} != rows_written {ledger.rows_written} + rows_quarantined {ledger.rows_quarantined}"
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

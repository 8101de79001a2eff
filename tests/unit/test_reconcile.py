import pytest

from ledgerbatch.errors import ReconcileError
from ledgerbatch.model.reconcile import Counts, check_error_budget, reconcile, reconcile_ranges


def test_reconcile_accepts_matching_counts():
    reconcile(Counts(10, 8, 2), Counts(10, 8, 2))


def test_reconcile_rejects_read_not_equal_written_plus_quarantined():
    with pytest.raises(ReconcileError, match="records_read 10 != rows_written 8 \\+ rows_quarantined 1"):
        reconcile(Counts(10, 8, 1), Counts(10, 8, 1))


def test_reconcile_rejects_staging_that_differs_from_the_ledger():
    with pytest.raises(ReconcileError, match="staging table holds"):
        reconcile(Counts(10, 8, 2), Counts(11, 9, 2))


def test_reconcile_ranges_per_partition():
    reconcile_ranges({("t", 0): 3, ("t", 1): 0}, {("t", 0): 3})
    with pytest.raises(ReconcileError, match=r"t\[1\]: 2 rows staged but 0 records read"):
        reconcile_ranges({("t", 0): 3, ("t", 1): 0}, {("t", 0): 3, ("t", 1): 2})


def test_error_budget():
    check_error_budget(Counts(100, 95, 5), "quarantine", 0.05)
    with pytest.raises(ReconcileError, match="more than errors.max_ratio"):
        check_error_budget(Counts(100, 94, 6), "quarantine", 0.05)
    with pytest.raises(ReconcileError, match="errors.policy is fail"):
        check_error_budget(Counts(100, 99, 1), "fail", 1.0)
    check_error_budget(Counts(0, 0, 0), "fail", 0.0)


def test_min_bad_is_a_floor_under_the_ratio():
    """12 poison records that end a trickle are 100% of their batch: under the floor they pass."""
    check_error_budget(Counts(12, 0, 12), "quarantine", 0.5, min_bad=100)
    check_error_budget(Counts(200, 100, 100), "quarantine", 0.05, min_bad=100)  # not above the floor
    with pytest.raises(ReconcileError, match=r"101 of 200 records are bad \(50.5%\), more than errors.max_ratio "
                                             r"5.0% and more than errors.min_bad 100"):
        check_error_budget(Counts(200, 99, 101), "quarantine", 0.05, min_bad=100)
    with pytest.raises(ReconcileError, match="errors.policy is fail"):  # fail means any bad record
        check_error_budget(Counts(12, 11, 1), "fail", 0.5, min_bad=100)

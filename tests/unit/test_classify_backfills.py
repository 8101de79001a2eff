import pytest

from ledgerbatch.model.batch import BatchKind, RangeRefused, classify


def test_a_backfill_is_refused_with_the_reason_the_ledger_gives():
    assert classify(0, 10, 10, 1000, from_offset=0, horizon=1000) == BatchKind.BACKFILL
    with pytest.raises(RangeRefused, match="no batch delivered these offsets, but a backfill of them is refused: why"):
        classify(0, 10, 10, 1000, from_offset=0, backfill_refused="why")
    assert classify(10, 10, 10, 1000, from_offset=0, backfill_refused="why") == BatchKind.REPLAY  # replays: not


def test_offsets_whose_delivery_the_ledger_lost_count_as_delivered_and_refuse_a_mixed_range():
    assert classify(4, 10, 10, 1000, from_offset=0, unknown=6) == BatchKind.REPLAY
    with pytest.raises(RangeRefused, match="5 of its 10 offsets were compacted before the ledger kept exactly"):
        classify(0, 10, 10, 1000, from_offset=0, unknown=5)
    with pytest.raises(RangeRefused, match="3 of its 10 offsets were delivered"):
        classify(3, 10, 10, 1000, from_offset=0)

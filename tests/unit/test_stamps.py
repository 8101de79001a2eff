"""Record timestamps counted for the freshness metric (stage/stamps.py)."""
from ledgerbatch.source.reader import Records
from ledgerbatch.stage import stamps
from ledgerbatch.stage.stamps import Kept, Stamps, ages


def chunk(timestamps):
    return Records(list(range(len(timestamps))), [None] * len(timestamps), [b""] * len(timestamps), timestamps)


def test_records_are_counted_by_timestamp_as_they_pass_and_those_without_one_are_left_out():
    s = Stamps()
    passed = list(s.seen([chunk([1_000, 1_050, 1_250, None]), chunk([1_299, -1])]))
    assert len(passed) == 2  # every chunk goes on, unchanged
    assert dict(s.buckets) == {10: 2, 12: 2} and s.resolution == 100
    assert sorted(ages([s.text()], now_ms=3_050)) == [(1.8, 2), (2.0, 2)]  # from each bucket's middle


def test_many_distinct_times_coarsen_tenfold_and_keep_every_record(monkeypatch):
    monkeypatch.setattr(stamps, "MAX_BUCKETS", 10)
    s = Stamps()
    list(s.seen([chunk(list(range(0, 2_000, 100)))]))  # 20 buckets of 100 ms: more than 10
    assert s.resolution == 1_000 and dict(s.buckets) == {0: 10, 1: 10}
    assert Stamps().text() is None  # an empty range gives nothing


def test_an_attempt_is_taken_once_and_what_is_never_committed_is_forgotten(monkeypatch):
    monkeypatch.setattr(stamps, "KEPT", 2)
    kept = Kept()
    for attempt in (1, 2, 3):
        kept.keep(7, attempt, [f"a{attempt}"])
    assert kept.take(7, 1) == []  # the oldest left, at most KEPT kept
    assert kept.take(7, 3) == ["a3"] and kept.take(7, 3) == []

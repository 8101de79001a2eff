import datetime as dt

import pyarrow as pa
import pyarrow.csv as pcsv

from ledgerbatch.stage.csv_copy import _csv_ready

UTC = dt.timezone.utc


def _csv(array) -> bytes:
    sink = pa.BufferOutputStream()
    pcsv.write_csv(pa.table({"x": array}), sink, pcsv.WriteOptions(include_header=False))
    return sink.getvalue().to_pybytes()


def test_utc_timestamps_are_written_as_the_csv_writer_would():
    values = [dt.datetime(1, 1, 1, tzinfo=UTC), dt.datetime(2026, 11, 23, 17, 4, 5, 123456, tzinfo=UTC), None,
              dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)]
    for unit in ("us", "ms", "s"):
        array = pa.array(values, pa.timestamp("us", tz="UTC")).cast(pa.timestamp(unit, tz="UTC"), safe=False)
        # The text is quoted as a string, which PostgreSQL's CSV reads as the same value (a null stays unquoted).
        assert _csv(_csv_ready(array)).replace(b'"', b"") == _csv(array)
        assert b'""' not in _csv(_csv_ready(array))


def test_other_columns_are_left_alone():
    for array in (pa.array([1, None]), pa.array(["a"]), pa.array([0], pa.timestamp("us")),
                  pa.array([0], pa.timestamp("us", tz="Europe/Paris"))):
        assert _csv_ready(array) is array

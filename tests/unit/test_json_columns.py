"""The chunk path of `format: json` (json_columns.py) against the per-record path: wherever it answers, its
columns equal the per-record path's, and it never answers for a chunk that holds a bad record."""
import datetime as dt
import itertools
import json
import random
from decimal import Decimal

import pytest

from ledgerbatch.dev.demodata import order
from ledgerbatch.formats.json_columns import JsonColumns
from ledgerbatch.formats.parse import Parser
from ledgerbatch.source.reader import Records

COLUMNS = "s STRING, i INT, b BIGINT, h SMALLINT, d DECIMAL(12,2), w DECIMAL(38,10), f DOUBLE, r FLOAT, " \
          "ok BOOLEAN, ts TIMESTAMP, day DATE"


def columns(ddl=COLUMNS):
    from ledgerbatch.formats.schema import parse_schema

    return parse_schema(ddl)


def compare(values, ddl=COLUMNS, required=()) -> bool:
    """Both paths over one chunk; True when the chunk path answered (and agreed)."""
    cols = columns(ddl)
    each = Parser(cols, required)
    each.chunked = None
    expected = each.parse("t", 0, Records(list(range(len(values))), [None] * len(values), values))
    got = JsonColumns(cols, required).arrays(values)
    if got is None:
        return False
    assert expected.column("_error").null_count == len(values), \
        f"the chunk path took a chunk with a bad record: {expected.column('_error').drop_null().to_pylist()[:3]}"
    for col, array in zip(cols, got):
        assert array.type == expected.column(col.name).type, col.name
        assert array.to_pylist() == expected.column(col.name).to_pylist(), col.name
    return True


def test_the_demo_orders_take_the_chunk_path():
    assert compare([order(i) for i in range(10_000)], "order_id STRING, customer STRING, amount DECIMAL(12,2), "
                                                      "ts TIMESTAMP", required=("order_id",))


def test_the_parser_takes_it_for_plain_json_only():
    cols = columns()
    assert Parser(cols).chunked is not None
    assert Parser(columns("s STRING, raw BINARY")).chunked is None
    assert Parser(columns("s STRING, tags ARRAY<STRING>")).chunked is None
    from ledgerbatch.formats.parse import make_parser

    assert make_parser(cols, ("s",), "json", {}, (), changes=True).chunked is None


def _timestamp(rng: random.Random) -> str:
    day = f"{rng.choice(['2026', '2024', '1970', '0001', '9999'])}-{rng.choice(['01', '02', '12'])}-" \
          f"{rng.choice(['01', '28', '29', '31'])}"
    if rng.random() < 0.15:
        return day
    clock = rng.choice(["03", "03:04", "03:04:05", "23:59:59"])
    if ":" in clock and clock.count(":") == 2 and rng.random() < 0.5:
        clock += "." + "123456789"[:rng.randint(1, 6)]
    zone = rng.choice(["", "Z", "+00:00", "-00:00", "+05:30", "-08:00", "+0530", "+05", "+23:59", "-23:59"])
    return day + rng.choice("T ") + clock + zone


def _record(rng: random.Random) -> dict:
    """A record of every column type, written in the many ways JSON producers write them."""
    doc = {
        "s": rng.choice(["x", "", "café", "日本", "😀 emoji", "tab\there", "quote\" and \\ slash", "NUL-free"]),
        "i": rng.randint(-2**31, 2**31 - 1), "b": rng.randint(-2**63, 2**63 - 1), "h": rng.randint(-2**15, 2**15 - 1),
        "d": rng.choice([f"{rng.randint(-10**9, 10**9) / 100:.2f}", rng.randint(-10**9, 10**9),
                         Decimal(rng.randint(-10**11, 10**11)).scaleb(-2), "1e3", "-0.5", "0.10"]),
        "w": str(Decimal(rng.randint(-10**27, 10**27)).scaleb(-10)),
        "f": rng.choice([rng.uniform(-1e300, 1e300), rng.random(), rng.randint(-10**20, 10**20), 0.1, -0.0, 5e-324]),
        "r": rng.choice([rng.uniform(-3e38, 3e38), rng.random(), rng.randint(-10**6, 10**6), 1e-45]),
        "ok": rng.choice([True, False]),
        "ts": _timestamp(rng),
        "day": rng.choice(["2026-11-23", "2024-02-29", "0001-01-01", "9999-12-31"]),
        "extra": rng.choice([[1, {"x": None}], {"deep": [[[]]]}, "NaN or Infinity as text", None, 1.5e300]),
    }
    for name in rng.sample(sorted(doc), rng.randint(0, 3)):  # missing fields and explicit nulls
        if rng.random() < 0.5:
            del doc[name]
        else:
            doc[name] = None
    return doc


def _dumps(doc: dict, rng: random.Random) -> bytes:
    text = json.dumps(doc, default=str, ensure_ascii=rng.random() < 0.5,
                      separators=rng.choice([(",", ":"), (", ", ": "), (" , ", " : ")]))
    return (text + rng.choice(["", " ", "\t"])).encode()


def test_random_records_agree_and_mostly_take_the_chunk_path():
    rng = random.Random(13)
    taken = 0
    for _ in range(300):
        chunk = [_dumps(_record(rng), rng) for _ in range(rng.randint(1, 20))]
        taken += compare(chunk)
    assert taken > 50  # the shortcut is taken, not only declined


@pytest.mark.parametrize("value", [
    # Arrow takes these; Python's json (and so the per-record path) does not, or reads them otherwise.
    b'{"s":"x","extra":NaN}', b'{"s":"x","extra":-Infinity}', b'{"s":"x","extra":Inf}', b'{"s":"x","extra":-Inf}',
    b'{"s":"x","extra":-NaN}', b'{"s":"x","extra":[1, Inf]}', b'{"s":"x","extra":1e-40056105555952976624}',
    b'{"s":"x","extra":1.5E+0999999999999999999}', b'{"s":"Info: NaN is text"}', b'\xef\xbb\xbf{"s":"x"}', b' {"s":"x"}',
    b'{"s":"x","extra":' + b"[" * 3000 + b"]" * 3000 + b"}", b'{"s":"x","extra":' + b"9" * 5000 + b"}",
    b'{"s":"x","extra":"\xff"}', b'{"s":"x"}{"s":"y"}', b"null", b"[1]", b"", b"   ",
    b'{"d":"12345678901.5"}', b'{"w":"' + b"9" * 29 + b'"}', b'{"ts":"0000-01-01T00:00:00"}',
    b'{"ts":"0001-01-01T00:00:00+01:00"}', b'{"ts":"9999-12-31T23:00:00-05:00"}', b'{"day":"0000-01-01"}',
    b'{"r":1e39}', b'{"s":"nul\\u0000"}', b'{"s":"\\ud800"}', b'{"s":1}', b'{"i":1.0}', b'{"i":2147483648}',
    b'{"d":"1.005"}', b'{"d":" 1.5"}', b'{"d":"1_0"}', b'{"ts":"2026-11-01T01:02:03.1234567"}', b'{"ok":1}',
    b'{"s":"x","s":"y"}', b'{"\\u0073":"escaped key"}', b'{"s":"line\nbreak"}', b'{"s":"cr\rhere"}',
    b'{"day":"20261101"}', b'{"ts":"2026-W44-1"}', b'{"f":1e400}', b'{"f":-11657660570502012e+299}', b'{"r":11657660570502012e+299}', b'{"s":"x"} x', b'{"s":"x",}',
])
def test_edge_values_alone_and_in_a_chunk(value):
    compare([value])
    compare([b'{"s":"a"}', value, b'{"s":"b"}'])


def test_required_columns_missing_go_record_by_record():
    assert not compare([b'{"s":"x"}', b'{"i":1}'], required=("s",))
    assert compare([b'{"s":"x"}', b'{"s":"y","i":1}'], required=("s",))


def test_timestamps_of_every_shape_agree():
    rng = random.Random(7)
    shapes = {_timestamp(rng) for _ in range(3000)}
    shapes |= {f"2026-11-01{sep}{clock}{zone}" for sep, clock, zone in itertools.product(
        "T t", ["01", "01:02", "0102", "01:02:03", "010203", "01:02:03.5", "01:02:03,5", "24:00", "23:59:60"],
        ["", "Z", "z", "+01", "+0100", "+01:00", "+01:00:30", "+24:00", " Z"])}
    for shape in sorted(shapes):
        compare([json.dumps({"ts": shape}).encode()])


def test_mutated_records_never_disagree():
    """Random byte edits of good records: whatever they become, both paths agree."""
    rng = random.Random(11)
    alphabet = b'{}[]":,.-+0123456789eEaNIfnt \\u\xff\x00'
    tokens = [b"NaN", b"Inf", b"-Inf", b"Infinity", b"nan", b"inf", b"null", b"true", b"1e999", b"-0", b"01", b".5",
              b"\\u0000", b"\\ud800", b"\\ud83d\\ude00", b"\xef\xbb\xbf", b"\t", b'"s":', b'"s":1,', b"{}", b"[[[", b"]]]"]
    for _ in range(3000):
        value = bytearray(_dumps(_record(rng), rng))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(value))
            edit = rng.random()
            if edit < 0.3:
                value[at] = rng.choice(alphabet)
            elif edit < 0.5:
                del value[at]
            elif edit < 0.7:
                value.insert(at, rng.choice(alphabet))
            else:
                value[at:at + rng.randint(0, 3)] = rng.choice(tokens)
        compare([bytes(value)])


def test_utc_and_epoch_bounds():
    assert compare([b'{"ts":"0001-01-01T00:00:00Z","day":"0001-01-01"}', b'{"ts":"9999-12-31T23:59:59.999999Z"}'])
    assert compare([b'{"ts":"1970-01-01T00:00:00+00:00"}'])
    cols = columns("ts TIMESTAMP")
    got = JsonColumns(cols, ()).arrays([b'{"ts":"2026-11-01T01:00:00+01:00"}'])
    assert got[0].to_pylist()[0] == dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)


def test_decimals_of_every_size_and_exponent_agree():
    """Arrow scales a decimal up without an overflow check: only a read type with room for it is safe."""
    rng = random.Random(5)
    for _ in range(4000):
        scale = rng.randint(0, 38)
        precision = rng.randint(max(scale, 1), 38)
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 80)))
        point = rng.randint(0, len(digits))
        number = (rng.choice(["", "-"]) + (digits[:point] or "0") + ("." + digits[point:] if digits[point:] else "")
                  + (f"e{rng.randint(-90, 90)}" if rng.random() < 0.5 else ""))
        value = number if rng.random() < 0.5 else f'"{number}"'
        compare([f'{{"w":{value}}}'.encode()], f"w DECIMAL({precision},{scale})")
    assert compare([b'{"w":"1e27"}', b'{"w":-99999999999999999999999999.9999999999}'], "w DECIMAL(38,10)")

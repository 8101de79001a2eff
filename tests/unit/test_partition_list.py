"""Partitions typed as text in the Airflow forms: model/partition_list.py."""
import re

import pytest

from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.model.partition_list import MAX_PARTITIONS, PATTERN, parse_partitions


@pytest.mark.parametrize("text, partitions", [
    ("0", (0,)),
    ("0, 3", (0, 3)),
    ("3,0", (0, 3)),
    ("0-3", (0, 1, 2, 3)),
    (" 0 - 2 , 7 ", (0, 1, 2, 7)),
    ("1-1", (1,)),
    ("2, 0-3, 2", (0, 1, 2, 3)),
])
def test_numbers_and_ranges_give_each_partition_once_in_order(text, partitions):
    assert re.fullmatch(PATTERN, text)
    assert parse_partitions(text) == partitions


@pytest.mark.parametrize("text", [None, "", "   "])
def test_empty_is_every_partition(text):
    assert parse_partitions(text) is None


@pytest.mark.parametrize("text", ["[0]", "0,", ",0", "a", "-1", "0 3", "0--3", "0-", "1.5"])
def test_what_the_pattern_refuses_parse_refuses_too(text):
    assert not re.fullmatch(PATTERN, text)
    with pytest.raises(LedgerbatchError, match=re.escape(f"partitions {text!r}: write partition numbers")):
        parse_partitions(text)


def test_a_backwards_range_passes_the_pattern_and_is_refused_by_name():
    assert re.fullmatch(PATTERN, "3-0")
    with pytest.raises(LedgerbatchError, match="the range 3-0 runs backwards; write 0-3"):
        parse_partitions("3-0")


def test_a_huge_range_is_refused_not_expanded():
    with pytest.raises(LedgerbatchError, match=f"more than {MAX_PARTITIONS} partitions"):
        parse_partitions(f"0-{MAX_PARTITIONS}")
    assert len(parse_partitions(f"0-{MAX_PARTITIONS - 1}")) == MAX_PARTITIONS

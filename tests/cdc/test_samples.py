"""The saved Debezium samples (tests/cdc/samples/, made by make_samples.py) are complete and mean what they say.

No JVM and no database: this is also the shape a decoder test over the samples takes.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from . import scenario
from .make_samples import SETTINGS, file_name

SAMPLES = Path(__file__).resolve().parent / "samples"


def load(name: str) -> list[dict]:
    lines = [json.loads(line) for line in (SAMPLES / name).read_text().splitlines()]
    for line in lines:
        line["key"] = base64.b64decode(line["key_b64"])
        line["value"] = None if line["value_b64"] is None else base64.b64decode(line["value_b64"])
    return lines


@pytest.mark.parametrize("schemas_enable, decimal_mode", SETTINGS,
                         ids=[file_name(*s).removesuffix(".jsonl") for s in SETTINGS])
def test_samples_match_the_scenario(schemas_enable, decimal_mode):
    lines = load(file_name(schemas_enable, decimal_mode))
    ops = {(line["replica_identity"], line["op"]) for line in lines}
    assert {("full", op) for op in ("r", "c", "u", "d", None)} <= ops
    assert {("default", op) for op in ("u", "d", None)} <= ops
    for line in lines:
        key = json.loads(line["key"])
        assert set(key) == ({"schema", "payload"} if schemas_enable else {"id"})
        assert (key["payload"] if schemas_enable else key) == line["expect_key"]
        if line["op"] is None:
            assert line["value"] is None  # a tombstone: the key of the deleted row, a null value
            continue
        value = json.loads(line["value"])
        assert ("schema" in value) == schemas_enable
        envelope = value["payload"] if schemas_enable else value
        assert envelope["op"] == line["op"] and envelope["source"]["table"] == line["table"]
        for image in ("before", "after"):
            got = scenario.as_text(scenario.decode_image(envelope[image], decimal_mode))
            assert got == line[f"expect_{image}"], (line["offset"], image)

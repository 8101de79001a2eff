"""Debezium envelopes give the positions `target.version` may order by (spec ENVELOPE_VERSIONS), for upserts
and deletes alike."""
import json

from ledgerbatch.formats.decoders.base import DELETE, UPSERT
from ledgerbatch.formats.decoders.catalog import make_change_decoder
from ledgerbatch.spec.pipeline import ENVELOPE_VERSIONS


def _event(op: str, **extra) -> bytes:
    return json.dumps({"op": op, "before": {"id": 3} if op == "d" else None, "after": {"id": 3, "name": "x"}
                       if op != "d" else None, **extra}).encode()


def test_upserts_and_deletes_carry_the_envelope_positions():
    decoder = make_change_decoder("debezium", {})
    positions = {"source": {"lsn": 24023128, "ts_ms": 1700000000001}, "ts_ms": 1700000000002}
    upsert = decoder.decode_change(None, _event("u", **positions))
    delete = decoder.decode_change(None, _event("d", **positions))
    keyed = decoder.decode_change(b'{"id": 3}', json.dumps({"op": "d", "before": None, **positions}).encode())
    expected = {"_source_lsn": 24023128, "_source_ts_ms": 1700000000001, "_ts_ms": 1700000000002}
    assert upsert == (UPSERT, {"id": 3, "name": "x", **expected})
    assert delete == (DELETE, {"id": 3, **expected}) and keyed == (DELETE, {"id": 3, **expected})
    assert set(expected) == set(ENVELOPE_VERSIONS.values())


def test_an_envelope_without_positions_gives_none():
    change, fields = make_change_decoder("debezium", {}).decode_change(None, _event("c"))
    assert change == UPSERT and fields["_source_lsn"] is None and fields["_ts_ms"] is None

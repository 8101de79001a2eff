"""The model: what the target, the quarantine and the cursors must hold after the committed deliveries, in
the order they committed (pure; the machine feeds it each commit). Each record's fate is judged by the
target's rules at the commit that last delivered it. The rules per mode, as the docs state them:

- append: every delivered record once, as a row or quarantined; a replay replaces its ranges' rows.
- upsert: every row judged by the target's rules in offset order; within a batch a key's highest offset
  the target took wins, across live batches the later batch wins; a replay or backfill replaces
  a key's row only where that row came from the replayed ranges (or the key has none), and removes its
  ranges' rows whose key it no longer gives a row.
- versioned (upsert with target.version): a key's highest version delivered wins, whatever the order.
- changes (target.deletes): a key's last change delivered (by offset; keys live in one partition) wins: a
  row, or no row after a tombstone. No backfill or replay brings back a key a later change deleted.
- aggregate: a group per key, the count and sum of every delivered record.
Poison records are quarantined in every mode; offsets of aborted Kafka transactions hold no record: no row,
nothing quarantined, never lost.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from .world import Record, Rules, World

Coord = tuple[int, int]  # (partition, offset)


def offsets(ranges) -> list[Coord]:
    return [(r.partition, o) for r in ranges for o in range(r.from_offset, r.until_offset)]


def inside(c: Coord, ranges) -> bool:
    return any(r.partition == c[0] and r.from_offset <= c[1] < r.until_offset for r in ranges)


def value(rec: Record, mode: str) -> str | None:
    """The amount the row holds: a tombstone is a delete only where the pipeline takes changes."""
    return rec.amount if rec.amount is not None or mode == "changes" else "0.00"


@dataclass
class Model:
    mode: str
    world: World
    rules: Rules = field(default_factory=Rules)
    delivered: set[Coord] = field(default_factory=set)  # offsets committed live and backfill batches delivered
    quarantine: dict[Coord, str | None] = field(default_factory=dict)  # coordinate -> SQLSTATE (None: poison)
    rows: dict = field(default_factory=dict)  # append: coordinate -> 1; upsert: key -> coordinate
    start: dict[int, int] = field(default_factory=dict)  # the live start of each partition
    cursors: dict[int, int] = field(default_factory=dict)
    compacted: bool = False
    skipped: set[Coord] = field(default_factory=set)  # offsets `offsets --to-...` skipped forward over

    def deliver(self, kind: str, ranges) -> None:
        """A committed batch of `kind` (live, backfill, replay) over `ranges`."""
        coords = offsets(ranges)
        if kind != "replay":
            assert not self.delivered & set(coords), f"{kind} delivers offsets delivered before: {ranges}"
            self.delivered |= set(coords)
        else:
            assert set(coords) <= self.delivered, f"a replay of offsets never delivered: {ranges}"
        for c in coords:
            self.quarantine.pop(c, None)
        for c in coords:
            if self.world.record(*c) is None and self.world.held(*c):
                self.quarantine[c] = None
        if self.mode == "append":
            self._append(coords)
        elif self.mode == "upsert":
            self._upsert(kind, coords, ranges)

    def _append(self, coords: list[Coord]) -> None:
        for c in coords:
            self.rows.pop(c, None)
            rec = self.world.record(*c)
            if rec is not None:
                refused = rec.refused(self.rules, self.mode)
                if refused:
                    self.quarantine[c] = refused
                else:
                    self.rows[c] = 1

    def _upsert(self, kind: str, coords: list[Coord], ranges) -> None:
        accepted: dict[str, Coord] = {}  # each key's last row the target took, in offset order
        for c in coords:
            rec = self.world.record(*c)
            if rec is None:
                continue
            refused = rec.refused(self.rules, self.mode)
            if refused:  # every row is judged, a key's last or not
                self.quarantine[c] = refused
            elif rec.key not in accepted or accepted[rec.key][1] < c[1]:
                accepted[rec.key] = c
        if kind != "live":  # a replay or backfill never overwrites a value from outside its ranges
            for key, c in list(self.rows.items()):
                if inside(c, ranges) and key not in accepted:
                    del self.rows[key]
            accepted = {k: c for k, c in accepted.items() if k not in self.rows or inside(self.rows[k], ranges)}
        self.rows.update(accepted)

    # -- what the database must hold (as tests/integration/staged.py reads it, without batch ids)

    def target(self) -> list[tuple]:
        if self.mode == "append":
            return sorted(self._row(c) for c in self.rows)
        if self.mode == "upsert":
            return sorted(self._row(c) for c in self.rows.values())
        good = sorted((c for c in self.delivered if self.world.record(*c) is not None))
        if self.mode == "aggregate":
            groups = defaultdict(lambda: [0, Decimal(0)])
            for c in good:
                rec = self.world.record(*c)
                groups[rec.key][0] += 1
                groups[rec.key][1] += Decimal(rec.amount)
            return sorted((k, n, str(total)) for k, (n, total) in groups.items())
        last: dict[str, Coord] = {}
        for c in good:  # by offset within each partition; keys live in one partition each
            rec = self.world.record(*c)
            if self.mode == "changes" or rec.key not in last or self.world.record(*last[rec.key]).version < rec.version:
                last[rec.key] = c
        return sorted(self._row(c) for c in last.values() if value(self.world.record(*c), self.mode) is not None)

    def _row(self, c: Coord) -> tuple:
        rec = self.world.record(*c)
        return (c[0], c[1], rec.key, value(rec, self.mode))

    def fails(self, ranges, max_ratio: float, policy: str = "quarantine", min_bad: int = 0,
              on_reject: str = "quarantine") -> str | None:
        """Why a batch over `ranges` fails, or None: `budget` for its bad records (poison, or rows the target
        refuses: any under errors.policy fail, else more than errors.min_bad of them and more than
        errors.max_ratio of the records it reads), `refused` for a row the target refuses under
        errors.on_reject fail (the commit checks the poison against the budget first, then publishes)."""
        read = [c for c in offsets(ranges) if self.world.held(*c)]
        poison = sum(1 for c in read if self.world.record(*c) is None)
        refused = sum(1 for c in read if self.world.record(*c) is not None
                      and self.world.record(*c).refused(self.rules, self.mode))

        def over(bad: int) -> bool:
            return bool(bad) and (policy == "fail" or (bad > min_bad and bad / len(read) > max_ratio))
        if over(poison):
            return "budget"
        if refused and on_reject == "fail":
            return "refused"
        return "budget" if over(poison + refused) else None

    def pending(self) -> dict[int, tuple[int, int]]:
        """The live ranges a new batch must plan: from each cursor to the log's end."""
        return {p: (cur, self.world.logs[p].high) for p, cur in self.cursors.items() if self.world.logs[p].high > cur}

    def may_redeliver(self, partition: int, lo: int, hi: int) -> str | None:
        """`replay`, `backfill`, or None where the range must be refused."""
        coords = {(partition, o) for o in range(lo, hi)}
        if partition not in self.start or lo < self.world.logs[partition].low:
            return None
        if coords <= self.delivered:
            return "replay"
        if not coords & self.delivered and hi <= self.start[partition]:
            return "backfill"
        return None

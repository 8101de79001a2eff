"""Moving a pipeline's cursors on purpose (`ledgerbatch offsets --set`), decided without I/O: what each
partition's move is. Forward skips offsets (recorded as skipped); back is only allowed over offsets that
no batch delivered (ops/offsets.py checks the ledger); a partition without a cursor starts there."""
from __future__ import annotations

from dataclasses import dataclass

from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.model.ranges import TopicPartition, Watermarks


@dataclass(frozen=True)
class Move:
    topic: str
    partition: int
    cursor: int | None  # where the cursor stands; None: the pipeline has none here yet
    to: int

    @property
    def kind(self) -> str:
        if self.cursor is None:
            return "start"
        return "skip" if self.to > self.cursor else "back" if self.to < self.cursor else "stay"

    def __str__(self) -> str:
        where = f"{self.topic}[{self.partition}]"
        return {"start": f"{where}: starts at {self.to}",
                "skip": f"{where}: {self.cursor} -> {self.to}, skips [{self.cursor}, {self.to}) ({self.to - (self.cursor or 0)} offsets)",
                "back": f"{where}: {self.cursor} -> {self.to}, back over [{self.to}, {self.cursor}) (skipped before, "
                        f"delivered by the next run)",
                "stay": f"{where}: stays at {self.to}"}[self.kind]


def plan_moves(cursors: dict[TopicPartition, int], ends: dict[TopicPartition, Watermarks],
               targets: dict[TopicPartition, int]) -> list[Move]:
    """The move of every partition in `targets` from its cursor; a target outside the log is refused."""
    moves = []
    for tp, to in sorted(targets.items()):
        wm = ends[tp]
        if not wm.low <= to <= wm.high:
            raise LedgerbatchError(f"{tp[0]}[{tp[1]}]: offset {to} is outside the log, which holds [{wm.low}, {wm.high})")
        moves.append(Move(tp[0], tp[1], cursors.get(tp), to))
    return moves

"""The target-mode contract: one suite every mode of modes/ passes (Dagster's storage tests are the
model). Batches are staged by hand (staged.py), so it needs only PostgreSQL; each crash point of the
commit kills a real child process in every mode. A new mode adds a subclass with its MODE."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.commit.modes.catalog import MODES, mode_for
from ledgerbatch.errors import SpecError
from ledgerbatch.model.batch import BatchKind, BatchStatus
from ledgerbatch.ops.verify import verify

from .staged import (TS, Pipe, Staged, batch, commit_in_child, cursors, parked, qrow, quarantine, refused, row,
                     staged_batch, staging_tables, start_commit_in_child, target, target_shape, wait_for_lock_waiters)

pytestmark = pytest.mark.integration
T0, T1, T2, T3 = TS, "2026-11-21T10:00:01Z", "2026-11-21T10:00:02Z", "2026-11-21T10:00:03Z"


class TargetModeContract:
    __test__ = False
    MODE: str
    COLUMNS = ["order_id", "customer", "amount", "ts", "_topic", "_partition", "_offset", "_batch_id"]
    REFUSED_ROWS_QUARANTINED = True  # a mode whose rows are records quarantines the rows its target refuses

    @staticmethod
    def expect(rows: list[tuple]) -> list[tuple]:
        """The target rows (staged.target) the mode makes of these records (staged.row), in target order."""
        return rows

    def test_ensure_target_creates_the_spec_shape_once(self, engine, make_pipe):
        p = make_pipe(mode=self.MODE)
        mode = mode_for(p.spec)
        with engine.begin() as conn:
            mode.ensure_target(conn, p.spec, target_shape(p))
            mode.ensure_target(conn, p.spec, target_shape(p))  # a second run finds it in shape
            columns = [r.column_name for r in conn.execute(text(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' "
                "AND table_name = :t ORDER BY ordinal_position"), {"t": p.table})]
        assert columns == self.COLUMNS

    def test_live_batches_publish_every_record_once(self, engine, make_pipe):
        p = make_pipe(mode=self.MODE)
        first = staged_batch(engine, p, {0: (0, 3)}, good=[(0, 0, "o-0", "1.00"), (0, 1, "o-1", "2.00")],
                             bad=[(0, 2, "bad")])
        commit_batch(engine, p.spec, first.batch_id)
        second = staged_batch(engine, p, {0: (3, 5)}, good=[(0, 3, "o-3", "3.00"), (0, 4, "o-4", "4.00")])
        commit_batch(engine, p.spec, second.batch_id)
        assert target(engine, p) == self.expect([row(0, 0, "o-0", "1.00", first.batch_id), row(0, 1, "o-1", "2.00", first.batch_id),
                                     row(0, 3, "o-3", "3.00", second.batch_id), row(0, 4, "o-4", "4.00", second.batch_id)])
        assert quarantine(engine, p) == [qrow(0, 2, first.batch_id, "bad")]
        assert cursors(engine, p) == {0: 5}
        assert verify(engine, p.spec) == []

    def test_replay_replaces_what_its_ranges_delivered(self, engine, make_pipe):
        p = make_pipe(mode=self.MODE)
        live = staged_batch(engine, p, {0: (0, 3)}, good=[(0, 0, "o-0", "1.00"), (0, 1, "o-1", "2.00")],
                            bad=[(0, 2, "bad")])
        commit_batch(engine, p.spec, live.batch_id)
        replay = staged_batch(engine, p, {0: (0, 3)}, good=[(0, 0, "o-0", "9.00"), (0, 1, "o-1", "2.00"),
                                                            (0, 2, "o-2", "7.00")], kind=BatchKind.REPLAY)
        result = commit_batch(engine, p.spec, replay.batch_id)
        assert (result.already_committed, result.rows_written, result.rows_quarantined) == (False, 3, 0)
        assert target(engine, p) == self.expect([row(0, 0, "o-0", "9.00", replay.batch_id), row(0, 1, "o-1", "2.00", replay.batch_id),
                                     row(0, 2, "o-2", "7.00", replay.batch_id)])
        assert quarantine(engine, p) == []
        assert cursors(engine, p) == {0: 3}  # a replay never moves the live cursors
        assert verify(engine, p.spec) == []

    def _refusing_target(self, engine, p: Pipe) -> None:
        """The target as the user tightened it: amounts of 100 and more are refused."""
        with engine.begin() as conn:
            mode_for(p.spec).ensure_target(conn, p.spec, target_shape(p))
            conn.execute(text(f'ALTER TABLE public."{p.table}" ADD CONSTRAINT small_amounts CHECK (amount < 100)'))

    def test_rows_the_target_refuses_are_quarantined_and_a_replay_retries_them(self, engine, make_pipe):
        p = make_pipe(mode=self.MODE, max_ratio=0.9)
        self._refusing_target(engine, p)
        good = [(0, 0, "o-0", "1.00"), (0, 1, "o-1", "500.00"), (0, 2, "o-2", "2.00"), (0, 3, "o-3", "300.00")]
        live = staged_batch(engine, p, {0: (0, 5)}, good=good, bad=[(0, 4, "bad")])
        if not self.REFUSED_ROWS_QUARANTINED:
            with pytest.raises(Exception, match="small_amounts"):
                commit_batch(engine, p.spec, live.batch_id)
            assert target(engine, p) == [] and quarantine(engine, p) == [] and cursors(engine, p) == {0: 0}
            return
        result = commit_batch(engine, p.spec, live.batch_id)
        assert (result.rows_written, result.rows_quarantined, result.rows_rejected) == (2, 1, 2)
        assert target(engine, p) == self.expect([row(0, 0, "o-0", "1.00", live.batch_id),
                                                 row(0, 2, "o-2", "2.00", live.batch_id)])
        assert refused(engine, p) == [(0, 1, live.batch_id, "23514", "small_amounts", "o-1"),
                                      (0, 3, live.batch_id, "23514", "small_amounts", "o-3")]
        assert quarantine(engine, p)[2] == qrow(0, 4, live.batch_id, "bad")
        assert "refused by the target: new row for relation" in quarantine(engine, p)[0][3]
        b = batch(engine, live.batch_id)
        assert (b.records_read, b.rows_written, b.rows_quarantined, b.rows_rejected) == (5, 2, 1, 2)
        assert cursors(engine, p) == {0: 5}
        assert verify(engine, p.spec) == []

        # The user widens the constraint and replays: the refused rows are delivered, their quarantine cleared.
        with engine.begin() as conn:
            conn.execute(text(f'ALTER TABLE public."{p.table}" DROP CONSTRAINT small_amounts'))
        replay = staged_batch(engine, p, {0: (0, 5)}, good=good, bad=[(0, 4, "bad")], kind=BatchKind.REPLAY)
        assert commit_batch(engine, p.spec, replay.batch_id).rows_rejected == 0
        assert target(engine, p) == self.expect([row(0, off, oid, amount, replay.batch_id) for _, off, oid, amount in good])
        assert refused(engine, p) == [] and quarantine(engine, p) == [qrow(0, 4, replay.batch_id, "bad")]
        assert verify(engine, p.spec) == []

    def test_on_reject_fail_fails_the_batch_with_nothing_written(self, engine, make_pipe):
        p = make_pipe(mode=self.MODE, on_reject="fail")
        self._refusing_target(engine, p)
        s = staged_batch(engine, p, {0: (0, 2)}, good=[(0, 0, "o-0", "1.00"), (0, 1, "o-1", "500.00")])
        with pytest.raises(Exception, match="small_amounts"):
            commit_batch(engine, p.spec, s.batch_id)
        assert target(engine, p) == [] and quarantine(engine, p) == [] and cursors(engine, p) == {0: 0}
        assert batch(engine, s.batch_id).status == BatchStatus.STAGED  # a retry after the fix commits it

    def test_refused_rows_count_against_the_error_budget(self, engine, make_pipe):
        p = make_pipe(mode=self.MODE, max_ratio=0.25)
        self._refusing_target(engine, p)
        s = staged_batch(engine, p, {0: (0, 3)}, good=[(0, 0, "o-0", "1.00"), (0, 1, "o-1", "500.00"),
                                                       (0, 2, "o-2", "600.00")])
        with pytest.raises(Exception, match="2 of 3 records are bad \\(2 refused by the target\\)"
                           if self.REFUSED_ROWS_QUARANTINED else "small_amounts"):
            commit_batch(engine, p.spec, s.batch_id)
        assert target(engine, p) == [] and quarantine(engine, p) == [] and cursors(engine, p) == {0: 0}

    def test_a_replay_and_a_live_commit_interleaved_commit_one_after_the_other(self, engine, db_url, make_pipe):
        """The live commit has written the target and not yet committed (parked) when a replay of the
        batch before it commits: the replay waits for the target, then decides on what the live commit
        left, so the result is the serial one."""
        p = make_pipe(mode=self.MODE)
        first = staged_batch(engine, p, {0: (0, 2)}, good=[(0, 0, "o-0", "1.00"), (0, 1, "o-1", "2.00")])
        commit_batch(engine, p.spec, first.batch_id)
        live = staged_batch(engine, p, {0: (2, 4)}, good=[(0, 2, "o-1", "5.00"), (0, 3, "o-3", "3.00")])
        replay = staged_batch(engine, p, {0: (0, 2)}, good=[(0, 0, "o-0", "1.50"), (0, 1, "o-1", "2.00")],
                              kind=BatchKind.REPLAY)
        with parked(engine, live.batch_id):
            live_commit = start_commit_in_child(db_url, p, live.batch_id)
            assert wait_for_lock_waiters(engine, 1) == ["transactionid"]  # the live commit, before its COMMIT
            replay_commit = start_commit_in_child(db_url, p, replay.batch_id)
            assert wait_for_lock_waiters(engine, 2) == ["transactionid", "advisory"]  # the replay waits for the target
        for child in (live_commit, replay_commit):
            out, err = child.communicate(timeout=60)
            assert child.returncode == 0, err[-2000:]
        assert target(engine, p) == self.expect_interleaved(first.batch_id, live.batch_id, replay.batch_id)
        assert cursors(engine, p) == {0: 4}
        assert verify(engine, p.spec) == []

    @staticmethod
    def expect_interleaved(first: int, live: int, replay: int) -> list[tuple]:
        """The interleaving test's target: the replay's rows of [0, 2), the live batch's of [2, 4)."""
        return [row(0, 0, "o-0", "1.50", replay), row(0, 1, "o-1", "2.00", replay),
                row(0, 2, "o-1", "5.00", live), row(0, 3, "o-3", "3.00", live)]

    # The out-of-order case: versions T0 < T1 < T2 < T3 arrive late, early and twice.
    OUT_OF_ORDER = ([(0, 0, "o-1", "1.00", T3), (0, 1, "o-2", "2.00", T1), (0, 2, "o-2", "3.00", T0)],
                    [(0, 3, "o-1", "4.00", T2), (0, 4, "o-2", "5.00", T2)])

    @staticmethod
    def expect_out_of_order(first: int, second: int, replay: int) -> tuple[list[tuple], tuple[int, int, int]] | None:
        """The target after OUT_OF_ORDER's two batches and a replay of the first, and the changes each of
        the three superseded; None: the mode refuses `target.version`."""
        return None

    def test_changes_that_arrive_out_of_order(self, engine, make_pipe):
        expected = self.expect_out_of_order(0, 0, 0)
        if expected is None:
            with pytest.raises(SpecError, match=f"target.version orders the changes of a key: it needs target.mode "
                                                f"upsert, not {self.MODE}"):
                make_pipe(mode=self.MODE, version="ts")
            return
        p = make_pipe(mode=self.MODE)
        first, second = self.OUT_OF_ORDER
        one = staged_batch(engine, p, {0: (0, 3)}, good=first)
        commit_batch(engine, p.spec, one.batch_id)
        two = staged_batch(engine, p, {0: (3, 5)}, good=second)
        commit_batch(engine, p.spec, two.batch_id)
        replay = staged_batch(engine, p, {0: (0, 3)}, good=first, kind=BatchKind.REPLAY)
        commit_batch(engine, p.spec, replay.batch_id)
        rows, superseded = self.expect_out_of_order(one.batch_id, two.batch_id, replay.batch_id)
        assert target(engine, p) == rows
        for b, n in zip((one, two, replay), superseded):
            counted = batch(engine, b.batch_id)
            assert (counted.records_superseded, counted.rows_written) == (n, counted.records_read - n)
        assert verify(engine, p.spec) == []

    def test_rows_match_records_says_whether_verify_may_count(self, engine, make_pipe):
        p = make_pipe(mode=self.MODE)
        s = staged_batch(engine, p, {0: (0, 2)}, good=[(0, 0, "same", "1.00"), (0, 1, "same", "2.00")])
        commit_batch(engine, p.spec, s.batch_id)
        assert len(target(engine, p)) == (2 if mode_for(p.spec).rows_match_records else 1)
        assert verify(engine, p.spec) == []

    @staticmethod
    def _crash_batch(engine, p: Pipe) -> Staged:
        return staged_batch(engine, p, {0: (0, 3), 1: (0, 2)},
                            good=[(0, 0, "o-0", "1.00"), (0, 2, "o-2", "1.00"), (1, 0, "o-10", "1.00"), (1, 1, "o-11", "1.00")],
                            bad=[(0, 1, "bad")])


    @staticmethod
    def _assert_nothing_committed(engine, p: Pipe, s: Staged) -> None:
        b = batch(engine, s.batch_id)
        assert (b.status, b.attempt) == (BatchStatus.STAGED, 1)
        assert cursors(engine, p) == {0: 0, 1: 0}
        assert target(engine, p) is None  # even the CREATE TABLE of the target rolled back
        assert quarantine(engine, p) == []
        assert staging_tables(engine, s.batch_id) == [s.staging, f"{s.staging}_bad"]

    def _assert_committed_once(self, engine, p: Pipe, s: Staged) -> None:
        assert target(engine, p) == self.expect([row(0, 0, "o-0", "1.00", s.batch_id), row(0, 2, "o-2", "1.00", s.batch_id),
                                     row(1, 0, "o-10", "1.00", s.batch_id), row(1, 1, "o-11", "1.00", s.batch_id)])
        assert quarantine(engine, p) == [qrow(0, 1, s.batch_id, "bad")]
        assert cursors(engine, p) == {0: 3, 1: 2}
        assert batch(engine, s.batch_id).status == BatchStatus.COMMITTED
        assert staging_tables(engine, s.batch_id) == []
        assert verify(engine, p.spec) == []

    def test_child_commit_without_faults(self, engine, db_url, make_pipe):
        p = make_pipe(mode=self.MODE)
        s = self._crash_batch(engine, p)
        done = commit_in_child(db_url, p, s.batch_id)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "already_committed=False, rows_written=4, rows_quarantined=1" in done.stdout
        self._assert_committed_once(engine, p, s)

    @pytest.mark.parametrize("point", ["before_commit", "after_commit"])
    def test_sigkill_at_each_crash_point_then_the_retry_commits_once(self, point, engine, db_url, make_pipe):
        p = make_pipe(mode=self.MODE)
        s = self._crash_batch(engine, p)
        crashed = commit_in_child(db_url, p, s.batch_id, LEDGERBATCH_CRASH_AT=point)
        assert crashed.returncode == -9, crashed.stderr[-2000:]
        assert f"fault injection: SIGKILL at {point}" in crashed.stderr
        if point == "before_commit":  # inside the transaction: all of it rolled back
            self._assert_nothing_committed(engine, p, s)
        else:
            self._assert_committed_once(engine, p, s)

        result = commit_batch(engine, p.spec, s.batch_id)  # waits for the killed backend's locks
        assert (result.already_committed, result.rows_written, result.rows_quarantined) == (point == "after_commit", 4, 1)
        self._assert_committed_once(engine, p, s)

    def test_backend_terminated_inside_the_commit_then_the_retry_commits(self, engine, db_url, make_pipe):
        p = make_pipe(mode=self.MODE)
        s = self._crash_batch(engine, p)
        failed = commit_in_child(db_url, p, s.batch_id, LEDGERBATCH_TERMINATE_AT="before_commit")
        assert failed.returncode == 1, failed.stderr[-2000:]
        assert "fault injection: pg_terminate_backend at before_commit" in failed.stderr
        assert "OperationalError" in failed.stderr
        self._assert_nothing_committed(engine, p, s)

        again = commit_in_child(db_url, p, s.batch_id)
        assert again.returncode == 0, again.stderr[-2000:]
        self._assert_committed_once(engine, p, s)
        assert commit_batch(engine, p.spec, s.batch_id).already_committed


def test_every_mode_runs_the_contract():
    assert {cls.MODE for cls in TargetModeContract.__subclasses__()} == set(MODES)


class TestAppend(TargetModeContract):
    __test__ = True
    MODE = "append"


class TestUpsert(TargetModeContract):
    __test__ = True
    MODE = "upsert"

    @staticmethod
    def expect_interleaved(first: int, live: int, replay: int) -> list[tuple]:
        # o-1's newer value (offset 2, the live batch) stays: the replay's offset 1 is older
        return [row(0, 0, "o-0", "1.50", replay), row(0, 2, "o-1", "5.00", live), row(0, 3, "o-3", "3.00", live)]

    @staticmethod
    def expect_out_of_order(first: int, second: int, replay: int):
        # without a version the higher offset wins, the later batch's; the replay's rows are all replaced
        return [row(0, 3, "o-1", "4.00", second), row(0, 4, "o-2", "5.00", second)], (0, 0, 0)


class TestVersionedUpsert(TargetModeContract):
    """`upsert` with `target.version: ts`: the contract's rows share one ts, so the higher coordinate wins
    as it does without a version; OUT_OF_ORDER's versions decide."""
    __test__ = True
    MODE = "upsert"
    expect_interleaved = staticmethod(TestUpsert.expect_interleaved)

    @pytest.fixture
    def make_pipe(self, make_pipe):
        return lambda **kw: make_pipe(version="ts", **kw)

    @staticmethod
    def expect_out_of_order(first: int, second: int, replay: int):
        # o-1's T3 (offset 0) stays and its replay re-applies it; o-2's T2 (offset 4) beats T1 and T0, also replayed
        return [row(0, 0, "o-1", "1.00", replay), row(0, 4, "o-2", "5.00", second)], (1, 1, 2)


class TestAggregate(TargetModeContract):
    """Groups by order id (staged.GROUPS): each record of the contract is its order's only one."""
    __test__ = True
    MODE = "aggregate"
    COLUMNS = ["order_id", "n", "amount", "_batch_id"]
    REFUSED_ROWS_QUARANTINED = False  # a group stands for records nobody can name: a refused one fails the batch

    @staticmethod
    def expect(rows: list[tuple]) -> list[tuple]:
        return sorted((oid, 1, amount, batch_id) for _, _, oid, amount, batch_id in rows)

    @staticmethod
    def expect_interleaved(first: int, live: int, replay: int) -> list[tuple]:
        # each group holds the last batch that changed it; o-1 sums the replay's 2.00 and the live 5.00
        return [("o-0", 1, "1.50", replay), ("o-1", 2, "7.00", replay), ("o-3", 1, "3.00", live)]

    def test_a_group_only_a_superseded_batch_made_disappears(self, engine, make_pipe):
        p = make_pipe(mode=self.MODE)
        first = staged_batch(engine, p, {0: (0, 2)}, good=[(0, 0, "o-0", "1.00"), (0, 1, "o-1", "2.00")])
        commit_batch(engine, p.spec, first.batch_id)
        second = staged_batch(engine, p, {0: (2, 3)}, good=[(0, 2, "o-1", "5.00")])
        commit_batch(engine, p.spec, second.batch_id)
        # The first batch replayed without o-0 (its query now drops it): o-0 goes, o-1 is recomputed.
        replay = staged_batch(engine, p, {0: (0, 2)}, good=[(0, 1, "o-1", "3.00")], kind=BatchKind.REPLAY)
        commit_batch(engine, p.spec, replay.batch_id)
        assert target(engine, p) == [("o-1", 2, "8.00", replay.batch_id)]  # the last batch that changed it
        assert verify(engine, p.spec) == []

"""Committing positions, asynchronously: what to commit, and what each outcome means.

The position of each partition comes from its ``OffsetTracker`` (the lowest offset still in
flight); only positions ahead of the last committed one are sent. A commit is sent and the loop
goes on polling; the outcomes the client reports (``ConsumerPort.commit_results``, served by the
loop's own poll) are applied here on the poll thread by ``tick``, through each ``CommitRun``'s
seed 001 rules (``kworkers.consumer.commit``), and become tracker state, metrics and one log
line.

Which commits are in flight: at most one periodic run per consumer; a revoke's run besides it
(it must go out while the partitions are still this member's, and is never sent again once the
callback returned: a resend after the new owner committed could move the position back); the
drain's run (the loop polls for its outcome, bounded). A late success of an earlier attempt
marks what it names committed; nothing ever moves a position backwards.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from kworkers.clock import Clock
from kworkers.consumer.commit import CommitOutcome, CommitRun, ErrorKind, Run
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.ports import TP, ConsumerPort
from kworkers.metrics import Metrics

log = logging.getLogger("kworkers.consumer")
#: every commit sent and every outcome reported, at DEBUG (a fault run's evidence: which member
#: committed what, when, and what the coordinator answered; ``tests/apps/ledger_worker.py``
#: turns it on with ``KWORKERS_TEST_COMMIT_LOG=1``)
trail = logging.getLogger("kworkers.consumer.commits")


def _positions(offsets: Mapping[TP, int]) -> str:
    return " ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(offsets.items()))


class Committer:
    def __init__(self, consumer: ConsumerPort, metrics: Metrics, group: str, clock: Clock,
                 timeout_s: float) -> None:
        self.consumer = consumer
        self.group = group
        self.clock = clock
        self.timeout_s = timeout_s
        #: the runs sent and not finished, oldest first
        self.runs: list[CommitRun] = []
        #: every wait scheduled before an attempt, in order (seed 001's sequences, for tests)
        self.waits: list[float] = []
        self._m_commits = metrics.commits.labels(group)
        self._m_uncertain = metrics.commit_uncertain.labels(group)
        self._m_failures = metrics.commit_failures.labels(group)
        self._m_deferred = metrics.commit_deferred.labels(group)
        self._m_timeouts = metrics.commit_timeouts.labels(group)
        self._m_duration = metrics.commit_duration.labels(group)

    # ------------------------------------------------------------------ what to commit

    @staticmethod
    def collect_unreported(targets: Sequence[PartitionState]) -> None:
        """Completes offsets a runner still stuck on a later record finished but not reported
        (a revoke or a drain commits them instead of redelivering them)."""
        for ps in targets:
            for lane in ps.all_lanes():
                for offset in list(lane.done):
                    ps.tracker.complete(offset)

    def advance_past_markers(self, targets: Sequence[PartitionState]) -> int:
        """Partitions with nothing in flight whose consumer read past their last record
        (transaction markers after a redrive or any transactional producer) move to the
        consumer's position, so committed reaches the log end (``OffsetTracker.advance``).
        Returns how many moved (each asks for a commit)."""
        idle = [ps for ps in targets if ps.tracker.window == 0 and not ps.revoking]
        if not idle:
            return 0
        try:
            positions = self.consumer.position([ps.tp for ps in idle])
        except Exception:  # not assigned any more, or closing: nothing to advance
            return 0
        moved = 0
        for ps in idle:
            pos = positions.get(ps.tp)
            if pos is not None and ps.tracker.advance(pos):
                moved += 1
        return moved

    # ------------------------------------------------------------------ sending

    @property
    def periodic_in_flight(self) -> bool:
        return any(r.why == "periodic" for r in self.runs)

    @property
    def due(self) -> bool:
        """A commit wanted before the interval (never, for plain commits)."""
        return False

    def start(self, targets: Sequence[PartitionState], why: str, last_chance: bool = False,
              resendable: bool = True) -> CommitRun | None:
        """Sends the targets' positions; None when none moved since the last commit."""
        positions: dict[TP, int] = {}
        for ps in targets:
            pos = ps.tracker.committable()
            if pos is not None:
                positions[ps.tp] = pos
        if not positions:
            return None
        run = CommitRun(positions, why, self.timeout_s, last_chance=last_chance,
                        resendable=resendable)
        self.runs.append(run)
        self._send(run)
        return run

    def probe(self, targets: Sequence[PartitionState],
              committed_only: bool = False) -> CommitRun | None:
        """A fenced member asks whether it still is one: a commit of what it would commit
        anyway (its position, else its committed offset; only the latter with
        ``committed_only``), which the coordinator accepts only from a member of the current
        generation. Never sent again; None: nothing to send."""
        positions: dict[TP, int] = {}
        for ps in targets:
            pos = ps.tracker.position if ps.tracker.position is not None and \
                not committed_only else ps.tracker.committed
            if pos is not None:
                positions[ps.tp] = pos
        if not positions:
            return None
        run = CommitRun(positions, "probe", self.timeout_s, resendable=False)
        self.runs.append(run)
        self._send(run)
        return run

    def _send(self, run: CommitRun) -> None:
        run.send(self.clock.monotonic())
        if trail.isEnabledFor(logging.DEBUG):
            trail.debug("commit sent (%s, attempt %d): %s", run.why, run.attempts,
                        _positions(run.positions))
        self.consumer.commit_async(dict(run.positions))

    def settle(self, targets: Sequence[PartitionState]) -> None:
        """``targets`` are no longer this member's: runs covering them are not sent again
        (their outstanding attempt, sent while they were, may still answer)."""
        gone = {ps.tp for ps in targets}
        for run in self.runs:
            if gone & set(run.positions):
                run.stop_resending()

    def wait(self, run: Run | None, wait_s: float, parts: Mapping[TP, PartitionState]) -> None:
        """A revoke's commit is sent and never waited for (its outcome, if it comes, is
        applied by a later tick); the exactly-once committer waits here."""

    def close(self) -> None:
        """Nothing of its own to close (the consumer's commits go with the consumer)."""

    # ------------------------------------------------------------------ outcomes

    def tick(self, parts: Mapping[TP, PartitionState]) -> list[CommitRun]:
        """Applies the outcomes reported since the last tick, sends what is due again, times
        out what went unanswered; returns the runs that finished."""
        now = self.clock.monotonic()
        for offsets, error in self.consumer.commit_results():
            if trail.isEnabledFor(logging.DEBUG):
                trail.debug("commit %s: %s", "ok" if error is None else f"refused ({error})",
                            _positions(offsets))
            run = next((r for r in self.runs if r.sent_at is not None and r.matches(offsets)),
                       None)
            if run is None:  # an earlier attempt's answer, after its run moved on
                if error is None:
                    self._mark(offsets, parts)
                continue
            run.result(now, error, None if error is None else self._kind(error))
        finished: list[CommitRun] = []
        for run in list(self.runs):
            if not run.done and run.expired(now):
                self._m_timeouts.inc()
                log.warning("%s %s commit unanswered for %.0fs: counted as a retryable "
                            "timeout", self.group, run.why, run.timeout_s)
                run.timed_out(now)
            if not run.done and run.due(now):
                self._send(run)
            if run.done:
                self.runs.remove(run)
                self.waits += run.waits
                self._apply(run, parts)
                finished.append(run)
        return finished

    def _kind(self, error: BaseException) -> ErrorKind:
        if self.consumer.is_rebalancing(error):
            return ErrorKind.REBALANCING
        if self.consumer.is_retryable(error):
            return ErrorKind.RETRYABLE
        return ErrorKind.PERMANENT

    @staticmethod
    def _mark(offsets: Mapping[TP, int], parts: Mapping[TP, PartitionState]) -> None:
        for tp, pos in offsets.items():
            ps = parts.get(tp)
            if ps is not None:
                ps.tracker.mark_committed(pos)

    def _apply(self, run: CommitRun, parts: Mapping[TP, PartitionState]) -> None:
        outcome, why = run.outcome, run.why
        if run.first_sent_at is not None:  # a run that ended unsent took no time of the broker
            self._m_duration.observe(max(0.0, self.clock.monotonic() - run.first_sent_at))
        if outcome is CommitOutcome.COMMITTED:
            self._mark(run.positions, parts)
            self._m_commits.inc()
        elif outcome is CommitOutcome.DEFERRED:
            self._m_deferred.inc()
            log.log(logging.WARNING if why != "periodic" else logging.INFO,
                    "%s commit deferred: the group is rebalancing (%s)%s", why, run.error,
                    "; the next owner may get these records again" if why != "periodic"
                    else "")
        elif outcome is CommitOutcome.UNCERTAIN:
            self._m_uncertain.inc()
            log.warning("%s commit outcome uncertain after %d attempts (%s); a redelivery may "
                        "follow", why, run.attempts, run.error)
        else:
            self._m_failures.inc()
            log.warning("%s commit failed after %d attempts (%s); left to the next commit or "
                        "a redelivery", why, run.attempts, run.error)

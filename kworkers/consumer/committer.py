"""Committing positions: what to commit, seed 001's retry rules, and what the outcome means.

The position of each partition comes from its ``OffsetTracker`` (the lowest offset still in
flight); only positions ahead of the last committed one are sent. The retry rules and the
UNCERTAIN outcome are ``commit_with_retry``'s; this module turns outcomes into tracker state,
metrics and one log line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from kworkers.consumer.commit import REBALANCE_WAITS, CommitOutcome, commit_with_retry
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.ports import TP, ConsumerPort
from kworkers.metrics import Metrics

log = logging.getLogger("kworkers.consumer")
#: commits with no later one for their partitions: refusals by a rebalance are retried briefly
LAST_CHANCE = frozenset({"revoke", "drain"})


class Committer:
    def __init__(self, consumer: ConsumerPort, metrics: Metrics, group: str) -> None:
        self.consumer = consumer
        self.group = group
        self._m_commits = metrics.commits.labels(group)
        self._m_uncertain = metrics.commit_uncertain.labels(group)
        self._m_failures = metrics.commit_failures.labels(group)
        self._m_deferred = metrics.commit_deferred.labels(group)
        #: how commit retries wait (a seam: tests record the waits instead of sleeping)
        self.sleep: Callable[[float], None] = time.sleep

    def commit(self, targets: Sequence[PartitionState], why: str) -> CommitOutcome | None:
        """Commits the targets' positions; None when none moved since the last commit."""
        positions: dict[TP, int] = {}
        for ps in targets:
            pos = ps.tracker.committable()
            if pos is not None:
                positions[ps.tp] = pos
        if not positions:
            return None
        last_chance = why in LAST_CHANCE
        result = commit_with_retry(lambda: self.consumer.commit(positions),
                                   self.consumer.is_retryable, self.sleep,
                                   is_rebalancing=self.consumer.is_rebalancing,
                                   rebalance_waits=REBALANCE_WAITS if last_chance else ())
        if result.outcome is CommitOutcome.COMMITTED:
            for ps in targets:
                if ps.tp in positions:
                    ps.tracker.mark_committed(positions[ps.tp])
            self._m_commits.inc()
        elif result.outcome is CommitOutcome.DEFERRED:
            self._m_deferred.inc()
            log.log(logging.WARNING if last_chance else logging.INFO,
                    "%s commit deferred: the group is rebalancing (%s)%s", why, result.error,
                    "; the next owner may get these records again" if last_chance else "")
        elif result.outcome is CommitOutcome.UNCERTAIN:
            self._m_uncertain.inc()
            log.warning("%s commit outcome uncertain after %d attempts (%s); a redelivery may "
                        "follow", why, result.attempts, result.error)
        else:
            self._m_failures.inc()
            log.warning("%s commit failed after %d attempts (%s); left to the next commit or "
                        "a redelivery", why, result.attempts, result.error)
        return result.outcome

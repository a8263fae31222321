"""When to commit, and what a failed commit means.

Commit policy: a frozen value with a clock-free decision function, so the loop asks
``should_commit(now, since_last, completions)`` and tests drive it by hand. One commit is a
broker round trip; committing per message caps a consumer near 1k msg/s, so the default is once
a second (or after many completions, whichever comes first).

Commit retry: a retryable commit error is retried in place, with the same offsets, at most five
attempts with waits of 100, 200, 400 and 800 ms. A permanent error on the first attempt is
reported as a confirmed failure (the next commit or a redelivery covers it). A permanent error
*after* a retryable one is uncertain: an earlier attempt may have committed. It is counted once
and never reported as a confirmed failure.

A commit refused because the group is rebalancing (rebalance in progress, an old generation or
member epoch) is neither: the broker refused it for now, and the waits would only stall the
poll thread, and with it every retained partition, while the rebalance completes (it completes
only if this member keeps polling). A periodic commit so refused is DEFERRED at once: nothing
was committed, the positions stay tracked, and the next commit carries them. A commit that is
the last chance for its partitions (at a revoke, or the drain before leaving) has no next
commit: it is retried with short waits (``REBALANCE_WAITS``: 20 ms doubling, 1.26 s in all),
since the group accepts commits again as soon as the rebalance step completes, and the
seed's coarser waits would hold the retained partitions longer than needed. Only when those
are spent is it DEFERRED (the next owner may get the records again: the receiver absorbs them).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kworkers.clock import Seconds
from kworkers.errors import ConfigError

COMMIT_RETRY_WAITS: tuple[float, ...] = (0.1, 0.2, 0.4, 0.8)
#: waits between attempts of a last-chance commit the group refuses while it rebalances
REBALANCE_WAITS: tuple[float, ...] = (0.02, 0.04, 0.08, 0.16, 0.32, 0.64)


@dataclass(frozen=True)
class CommitPolicy:
    interval_s: Seconds = 1.0
    #: a safety valve for very high rates; the interval rules below ~1M records/s
    max_completions: int = 1_000_000

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ConfigError(f"commit interval must be > 0 s, got {self.interval_s}")
        if self.max_completions < 1:
            raise ConfigError(f"commit max_completions must be >= 1, got {self.max_completions}")

    def should_commit(self, now: float, last_commit_at: float, completions: int) -> bool:
        """True when there is something to commit and the interval or the count says so."""
        if completions <= 0:
            return False
        return completions >= self.max_completions or now - last_commit_at >= self.interval_s


class CommitOutcome(enum.Enum):
    COMMITTED = "committed"
    #: confirmed not committed: a redelivery or the next commit covers it
    FAILED = "failed"
    UNCERTAIN = "uncertain"  # a retryable error, then a permanent one: it may have committed
    #: refused while the group rebalances: not committed; the next commit carries it
    DEFERRED = "deferred"


@dataclass(frozen=True)
class CommitResult:
    outcome: CommitOutcome
    attempts: int
    error: BaseException | None = None


def commit_with_retry(
    commit: Callable[[], None],
    is_retryable: Callable[[BaseException], bool],
    sleep: Callable[[float], None],
    waits: Sequence[float] = COMMIT_RETRY_WAITS,
    is_rebalancing: Callable[[BaseException], bool] = lambda _exc: False,
    rebalance_waits: Sequence[float] = (),
) -> CommitResult:
    """Runs ``commit`` until it succeeds, fails for good, is deferred by a rebalance (once
    ``rebalance_waits`` are spent: none for a periodic commit), or the retry budget is spent."""
    saw_retryable = False
    retries = rebalance_retries = 0
    attempts = 0
    while True:
        attempts += 1
        try:
            commit()
            return CommitResult(CommitOutcome.COMMITTED, attempts)
        except Exception as exc:  # classified below; nothing is swallowed silently
            if is_rebalancing(exc):
                if rebalance_retries < len(rebalance_waits):
                    sleep(rebalance_waits[rebalance_retries])
                    rebalance_retries += 1
                    continue
                outcome = CommitOutcome.UNCERTAIN if saw_retryable else CommitOutcome.DEFERRED
                return CommitResult(outcome, attempts, exc)
            if not is_retryable(exc):
                outcome = CommitOutcome.UNCERTAIN if saw_retryable else CommitOutcome.FAILED
                return CommitResult(outcome, attempts, exc)
            saw_retryable = True
            if retries == len(waits):
                return CommitResult(CommitOutcome.FAILED, attempts, exc)
            sleep(waits[retries])
            retries += 1

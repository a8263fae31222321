"""When to commit, and what a commit's outcome means over its attempts: both pure.

Commit policy: a frozen value with a clock-free decision function, so the loop asks
``should_commit(now, since_last, completions)`` and tests drive it by hand. One commit is a
broker round trip; committing per message caps a consumer near 1k msg/s, so the default is once
a second (or after many completions, whichever comes first).

Commits are asynchronous: the poll loop sends one and goes back to polling; its outcome comes
back through the consumer's commit callback, which the loop's own poll serves, so it is applied
on the poll thread (``Committer``). Nothing ever waits on the broker there: a frozen broker
costs the loop nothing but the commit, and SIGTERM, heartbeats and the breaker keep running.

``CommitRun`` is one commit's life over its attempts, seed 001's rules as a state machine driven
by outcomes and time, never by sleeping:

- a retryable error is sent again, with the same offsets, after 100, 200, 400 and 800 ms of
  loop time: five attempts in all, then FAILED;
- a permanent error on the first attempt is a confirmed failure (FAILED: the next commit or a
  redelivery covers it); a permanent error *after* a retryable one is UNCERTAIN (an earlier
  attempt may have committed), counted once, never reported as a confirmed failure;
- an attempt outstanding past ``CommitPolicy.timeout_s`` (a hung broker answers nothing) counts
  as a retryable timeout: the run goes on as above, so a hung broker ends in FAILED or
  UNCERTAIN within the seed's five attempts, never in a wait without end;
- a refusal because the group is rebalancing (rebalance in progress, an old generation or
  member epoch) is neither: a periodic commit so refused is DEFERRED at once (the next commit
  carries its positions); a commit that is the last chance for its partitions (the drain before
  leaving) is sent again after ``REBALANCE_WAITS`` (20 ms doubling, 1.26 s in all), since the
  group accepts commits again as soon as the rebalance step completes; only when those are
  spent is it DEFERRED (the next owner may get the records again: the receiver absorbs them).

How an outcome is matched to what was sent: each run knows the positions it sent, and a commit
callback reports the offsets it committed. A report with other offsets is an earlier run's
(one that timed out and was sent again meanwhile): its success still marks those positions
committed (a position never moves backwards, so a late success can only confirm what it
names), its failure is dropped. At most one periodic run is in flight per consumer.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from kworkers.clock import Seconds
from kworkers.errors import ConfigError

TP = tuple[str, int]

COMMIT_RETRY_WAITS: tuple[float, ...] = (0.1, 0.2, 0.4, 0.8)
#: waits between attempts of a last-chance commit the group refuses while it rebalances
REBALANCE_WAITS: tuple[float, ...] = (0.02, 0.04, 0.08, 0.16, 0.32, 0.64)


@dataclass(frozen=True)
class CommitPolicy:
    interval_s: Seconds = 1.0
    #: a safety valve for very high rates; the interval rules below ~1M records/s
    max_completions: int = 1_000_000
    #: a commit attempt the broker has not answered this long counts as a retryable timeout
    #: (it is reported, and sent again by seed 001's rules)
    timeout_s: Seconds = 10.0

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ConfigError(f"commit interval must be > 0 s, got {self.interval_s}")
        if self.max_completions < 1:
            raise ConfigError(f"commit max_completions must be >= 1, got {self.max_completions}")
        if not self.timeout_s > 0:
            raise ConfigError(f"commit timeout_s must be > 0 s, got {self.timeout_s}")

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


class Run(Protocol):
    """A commit as the poll loop follows it: a ``CommitRun``, or an exactly-once transaction
    (``kworkers.consumer.transactional.TxnRun``)."""

    why: str
    outcome: CommitOutcome | None

    @property
    def done(self) -> bool: ...


class ErrorKind(enum.Enum):
    """What a refused attempt says (the adapter classifies the client's errors)."""

    RETRYABLE = "retryable"
    REBALANCING = "rebalancing"
    PERMANENT = "permanent"


@dataclass
class CommitRun:
    """One commit over its attempts (see the module doc). Mutable, owned by the poll thread."""

    positions: Mapping[TP, int]
    why: str
    timeout_s: float
    #: the drain's commit, which has no next one: refusals by a rebalance are retried briefly
    last_chance: bool = False
    #: False once its partitions may be another member's: a run never sent again ends where
    #: the rules would send it again (a revoke's run is so from the start)
    resendable: bool = True
    attempts: int = 0
    #: when the attempt now outstanding was sent (None: none is)
    sent_at: float | None = None
    #: when the first attempt was sent (the commit's latency counts from here)
    first_sent_at: float | None = None
    #: when the next attempt is due (None: none is scheduled)
    resend_at: float | None = None
    outcome: CommitOutcome | None = None
    error: BaseException | None = None
    #: every wait scheduled before an attempt, in order (seed 001's sequences are checked on it)
    waits: list[float] = field(default_factory=list)
    _retries: int = 0
    _rebalance_retries: int = 0
    _saw_retryable: bool = False

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def send(self, now: float) -> None:
        """An attempt goes out now."""
        self.attempts += 1
        self.sent_at = now
        if self.first_sent_at is None:
            self.first_sent_at = now
        self.resend_at = None

    def due(self, now: float) -> bool:
        """A scheduled attempt is due: send it."""
        return self.resend_at is not None and now >= self.resend_at

    def expired(self, now: float) -> bool:
        """The outstanding attempt has been waiting past the commit timeout."""
        return self.sent_at is not None and now - self.sent_at >= self.timeout_s

    def matches(self, offsets: Mapping[TP, int]) -> bool:
        """Whether a commit report names exactly what this run sent."""
        return dict(offsets) == dict(self.positions)

    def result(self, now: float, error: BaseException | None, kind: ErrorKind | None) -> None:
        """The outstanding attempt's outcome: success (``error`` None) or a refusal."""
        self.sent_at = None
        if error is None:
            self._finish(CommitOutcome.COMMITTED, None)
            return
        self.error = error
        if kind is ErrorKind.REBALANCING:
            waits = REBALANCE_WAITS if self.last_chance else ()
            if self.resendable and self._rebalance_retries < len(waits):
                self._schedule(now, waits[self._rebalance_retries])
                self._rebalance_retries += 1
                return
            self._finish(CommitOutcome.UNCERTAIN if self._saw_retryable
                         else CommitOutcome.DEFERRED, error)
            return
        if kind is ErrorKind.RETRYABLE:
            self._saw_retryable = True
            if not self.resendable or self._retries == len(COMMIT_RETRY_WAITS):
                self._finish(CommitOutcome.FAILED, error)
                return
            self._schedule(now, COMMIT_RETRY_WAITS[self._retries])
            self._retries += 1
            return
        self._finish(CommitOutcome.UNCERTAIN if self._saw_retryable
                     else CommitOutcome.FAILED, error)

    def timed_out(self, now: float) -> None:
        """The outstanding attempt went unanswered past the timeout: a retryable error."""
        self.result(now, TimeoutError(f"commit unanswered for {self.timeout_s:g}s"),
                    ErrorKind.RETRYABLE)

    def stop_resending(self) -> None:
        """Its partitions are no longer this member's: it is never sent again. An attempt
        scheduled is dropped (the run ends, not committed); one outstanding may still answer."""
        self.resendable = False
        if self.resend_at is not None:
            self._end_unsent()

    def _schedule(self, now: float, wait: float) -> None:
        self.waits.append(wait)
        self.resend_at = now + wait

    def _end_unsent(self) -> None:
        self._finish(CommitOutcome.UNCERTAIN if self._saw_retryable else CommitOutcome.FAILED,
                     self.error)

    def _finish(self, outcome: CommitOutcome, error: BaseException | None) -> None:
        self.outcome = outcome
        self.error = error
        self.resend_at = None

"""How long to wait before the next attempt: exponential backoff with full jitter.

The schedule is ``d_n = min(initial * backoff**(n-1), max_interval)`` for the attempt ``n``
that just failed, and the delay actually used is a uniform draw in ``[0, d_n)`` ("full
jitter"). Jitter replaces the backoff rather than adding to it: a burst of records that failed
together must not come back together, and the expected wait halves (``d_n / 2``).

Both steps are pure functions so a test can check the hand-worked schedule exactly; the only
state is the random generator, which sits behind ``JitterSource`` so tests can switch it off.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Protocol

from kworkers.clock import Seconds

DEFAULT_INITIAL = 1.0
DEFAULT_BACKOFF = 2.0
DEFAULT_MAX_INTERVAL = 60.0
DEFAULT_MAX_ATTEMPTS = 5


def _unset(x: float) -> bool:
    # NaN and inf count as unset too: either would turn the schedule into a hot loop or a
    # wait of forever, and a config typo should not do that.
    return not math.isfinite(x) or x <= 0


@dataclass(frozen=True)
class RetryPolicy:
    """A retry schedule. Zero or negative fields mean "default" (see ``normalized``).

    ``non_retryable`` names failure types (``kworkers.errors.failure_type``) that go to the
    DLQ after one attempt, for errors the handler cannot or does not mark itself.
    """

    initial: Seconds = DEFAULT_INITIAL
    backoff: float = DEFAULT_BACKOFF
    max_interval: Seconds = DEFAULT_MAX_INTERVAL
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    non_retryable: tuple[str, ...] = ()

    def normalized(self) -> RetryPolicy:
        """The policy with unset fields replaced by defaults.

        A policy left empty (all zeros, as config files and protobufs often leave it) must not
        retry in a hot loop, so zero means 1 s / x2 / 60 s / 5 attempts, never "no wait".
        A factor below 1 would shrink the wait with every failure; it counts as unset too.
        """
        if (not _unset(self.initial) and not _unset(self.max_interval)
                and not _unset(self.backoff) and self.backoff >= 1.0 and self.max_attempts > 0):
            return self  # already normal: the failure path asks once per failed record
        backoff_ = self.backoff
        if _unset(backoff_) or backoff_ < 1.0:
            backoff_ = DEFAULT_BACKOFF
        return replace(
            self,
            initial=DEFAULT_INITIAL if _unset(self.initial) else self.initial,
            backoff=backoff_,
            max_interval=DEFAULT_MAX_INTERVAL if _unset(self.max_interval) else self.max_interval,
            max_attempts=DEFAULT_MAX_ATTEMPTS if self.max_attempts <= 0 else self.max_attempts,
        )


def backoff(policy: RetryPolicy, n: int) -> float:
    """Seconds to wait before attempt ``n + 1``, after attempt ``n`` (``n >= 1``) failed.

    The first retry waits exactly ``initial``: the exponent is ``n - 1``, for the attempt that
    failed, not the one about to run.
    """
    if n < 1:
        raise ValueError(f"attempt must be >= 1, got {n}")
    p = policy.normalized()
    try:
        d = p.initial * p.backoff ** (n - 1)
    except OverflowError:  # a record that failed 10,000 times still gets the cap, not a crash
        return p.max_interval
    return min(d, p.max_interval)


def jitter(d: float, u: float) -> float:
    """Full jitter: ``u * d`` for a uniform ``u`` in ``[0, 1)``, so the result is in ``[0, d)``."""
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u must be in [0, 1), got {u!r}")
    if not d >= 0.0:
        raise ValueError(f"delay must be >= 0, got {d!r}")
    return u * d


class JitterSource(Protocol):
    """Turns a backoff into the delay actually used; the seam tests replace with ``no_jitter``."""

    def __call__(self, d: float) -> float: ...


class SeededJitter:
    """Full jitter from a generator of its own.

    Its own ``random.Random`` (not the module-level one) so a seed reproduces a run's delays
    whatever else in the process draws random numbers.
    """

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def __call__(self, d: float) -> float:
        return jitter(d, self._rng.random())


def no_jitter(d: float) -> float:
    """The backoff unchanged: for tests that check exact due times, or jitter switched off."""
    return d

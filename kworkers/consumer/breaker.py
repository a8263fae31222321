"""A circuit breaker: stop hammering a dependency that is down (seed 003, section 4).

Retry tiers keep a failed record safe, but in an outage every record fails, and a worker
without a breaker moves its whole backlog into the tiers at full speed: load on the failing
dependency, on the broker, and a retry storm when it comes back. With the breaker open the
worker starts no new record: its partitions are paused, records already fetched wait in memory
(bounded by ``max_in_flight``), the backlog stays in Kafka, uncommitted. After a cool-down one
probe record runs (half-open); its success closes the breaker, its retryable failure opens it
again for twice the cool-down (up to ``max_cooldown_s``), so a long outage costs one probe per
cool-down, not a flood.

Only retryable failures count: a non-retryable one (bad input) says nothing about the
dependency. The breaker never drops, skips or commits past a record; it only delays starts.

Pure: time comes from the injected clock, the window is counted in one-second buckets, and the
poll loop reads ``state``; runners call ``admit`` before a record and ``record`` after it.
"""

from __future__ import annotations

import enum
import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kworkers.clock import Clock, Seconds
from kworkers.errors import ConfigError


class State(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerPolicy:
    #: open when retryable failures / attempts over the window reach this
    failure_ratio: float = 0.5
    #: the sliding window, whole seconds
    window_s: int = 10
    #: attempts the window must hold before it can open (one unlucky record is not an outage)
    min_attempts: int = 20
    #: open → half-open after this many seconds (jittered by up to a fifth, so a pool of
    #: workers does not probe in step)
    cooldown_s: Seconds = 5.0
    #: each failed probe doubles the cool-down, up to this
    max_cooldown_s: Seconds = 60.0

    def __post_init__(self) -> None:
        if not (isinstance(self.failure_ratio, int | float) and 0 < self.failure_ratio <= 1):
            raise ConfigError(f"breaker.failure_ratio: a number in (0, 1], got "
                              f"{self.failure_ratio!r}")
        if not isinstance(self.window_s, int) or isinstance(self.window_s, bool) \
                or not 1 <= self.window_s <= 3600:
            raise ConfigError(f"breaker.window_s: whole seconds from 1 to 3600, got "
                              f"{self.window_s!r}")
        if not isinstance(self.min_attempts, int) or self.min_attempts < 1:
            raise ConfigError(f"breaker.min_attempts: a whole number >= 1, got "
                              f"{self.min_attempts!r}")
        for name in ("cooldown_s", "max_cooldown_s"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"breaker.{name}: a positive number of seconds, got {v!r}")
        if self.max_cooldown_s < self.cooldown_s:
            raise ConfigError(f"breaker.max_cooldown_s ({self.max_cooldown_s}) must be >= "
                              f"cooldown_s ({self.cooldown_s})")


Transition = Callable[[State, State, str], None]


class Breaker:
    def __init__(self, policy: BreakerPolicy, clock: Clock,
                 on_transition: Transition | None = None,
                 rng: random.Random | None = None) -> None:
        self.policy = policy
        self.clock = clock
        self.on_transition = on_transition
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self.state = State.CLOSED
        # one bucket per second of the window: [second, attempts, failures]
        self._buckets = [[-1, 0, 0] for _ in range(policy.window_s)]
        self._cooldown = policy.cooldown_s
        self._reopen_at = 0.0
        self._probe_out = False

    def admit(self) -> bool:
        """May a runner start a record now? (closed: yes; open: no, until the cool-down ends
        and this caller gets the one probe; half-open: only the probe)."""
        if self.state is State.CLOSED:  # the hot path: no lock
            return True
        with self._lock:
            if self.state is State.OPEN and self.clock.monotonic() >= self._reopen_at:
                self._move(State.HALF_OPEN, "cool-down over: one probe record")
            if self.state is State.HALF_OPEN and not self._probe_out:
                self._probe_out = True
                return True
            return False

    def would_admit(self) -> bool:
        """Whether ``admit`` could say yes now (lock-free: the poll loop asks it every step to
        know whether restarting held lanes is worth it)."""
        if self.state is State.OPEN:
            return self.clock.monotonic() >= self._reopen_at
        return self.state is State.CLOSED or not self._probe_out

    def cooldown_ends(self) -> float | None:
        """While open: when the cool-down ends and a probe may start (monotonic), the end of
        the hold it puts on every partition (``stall.overdue``: a breaker still open well past
        it never half-opened); None otherwise."""
        return self._reopen_at if self.state is State.OPEN else None

    def record(self, outcome: bool | None) -> None:
        """After a record: True = succeeded, False = retryable failure, None = neither counts
        (a non-retryable failure: bad input says nothing about the dependency)."""
        with self._lock:
            if self.state is State.HALF_OPEN:
                if outcome is None:
                    self._probe_out = False  # inconclusive: let another record probe
                elif outcome:
                    self._cooldown = self.policy.cooldown_s
                    self._reset_window()
                    self._move(State.CLOSED, "probe succeeded")
                else:
                    self._cooldown = min(self._cooldown * 2, self.policy.max_cooldown_s)
                    self._open("probe failed")
                return
            if outcome is None or self.state is State.OPEN:
                return  # late results of records started before it opened do not count
            now = int(self.clock.monotonic())
            b = self._buckets[now % len(self._buckets)]
            if b[0] != now:
                b[0], b[1], b[2] = now, 0, 0
            b[1] += 1
            if not outcome:
                b[2] += 1
                self._judge(now)

    def _judge(self, now: int) -> None:
        oldest = now - len(self._buckets) + 1
        attempts = failures = 0
        for second, a, f in self._buckets:
            if second >= oldest:
                attempts += a
                failures += f
        p = self.policy
        if attempts >= p.min_attempts and failures >= p.failure_ratio * attempts:
            self._open(f"{failures} of {attempts} attempts failed in {p.window_s}s")

    def _open(self, why: str) -> None:
        jitter = 1 + self._rng.random() / 5
        self._reopen_at = self.clock.monotonic() + self._cooldown * jitter
        self._probe_out = False
        self._reset_window()
        self._move(State.OPEN, f"{why}; next probe in {self._cooldown * jitter:.1f}s")

    def _reset_window(self) -> None:
        for b in self._buckets:
            b[0], b[1], b[2] = -1, 0, 0

    def _move(self, to: State, why: str) -> None:
        old, self.state = self.state, to
        if self.on_transition is not None and old is not to:
            self.on_transition(old, to, why)

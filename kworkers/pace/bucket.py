"""The token bucket itself: one pure decision, and the in-process bucket of ``scope="replica"``.

The bucket is stored as one number, its *theoretical arrival time* (``tat``, the generic cell
rate algorithm's form of a token bucket): the moment it would be full again. Taking ``g`` tokens
moves it ``g / rate`` later; the bucket may run at most ``capacity / rate`` ahead of now. One
number is what makes a shared bucket cheap: one row (PostgreSQL) or one key (Redis), read and
written in one atomic step on the store's own clock, so replicas' clocks never meet.

Why grants in any window ``[s, t]`` are at most ``capacity + rate * (t - s)``: the first grant
after ``s`` starts from ``tat >= s``, each grant moves ``tat`` by ``g / rate``, and after any
grant ``tat <= now + capacity / rate``; so ``G / rate <= t + capacity / rate - s``.

The stores repeat ``decide`` in their own language (Lua, SQL) only where the step must be
atomic on the server; the contract suite (``tests/unit/test_pace_buckets.py``) holds every
backend to the same answers.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Protocol

from kworkers.clock import Clock

#: a float rounding must never grant a token the arithmetic did not mean
EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Grant:
    """What a bucket answered: ``granted`` tokens (0 to the number asked), and when none were,
    how long until one will be (``retry_after`` seconds)."""

    granted: int
    retry_after: float = 0.0


def decide(tat: float | None, now: float, want: int, rate: float,
           capacity: float) -> tuple[Grant, float]:
    """Take up to ``want`` tokens from the bucket whose arrival time is ``tat`` (None: a
    bucket never used, full): the grant and the bucket's new arrival time."""
    base = now if tat is None or tat < now else tat
    avail = math.floor((now - base) * rate + capacity + EPSILON)
    granted = max(0, min(want, avail))
    if granted == 0:
        return Grant(0, max(0.0, base + (1 - capacity) / rate - now)), base
    return Grant(granted), base + granted / rate


class BucketStore(Protocol):
    """Where buckets live: in the process (``LocalBuckets``) or in the pool's store
    (``kworkers.pace.redis``, ``kworkers.pace.postgres``), read on the store's clock."""

    #: its calls leave the process (an async runner makes them off the event loop)
    remote: bool

    def take(self, name: str, want: int, rate: float, capacity: float) -> Grant: ...

    def close(self) -> None: ...


class LocalBuckets:
    """Buckets in this process (``scope="replica"``), on its monotonic clock."""

    remote = False

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._tat: dict[str, float] = {}

    def take(self, name: str, want: int, rate: float, capacity: float) -> Grant:
        with self._lock:
            now = self.clock.monotonic()
            grant, tat = decide(self._tat.get(name), now, want, rate, capacity)
            if tat <= now:
                self._tat.pop(name, None)  # full again: the same as a bucket never used
            else:
                self._tat[name] = tat
            if len(self._tat) > 10_000:  # many keys: forget the ones full again
                for k in [k for k, t in self._tat.items() if t <= now]:
                    del self._tat[k]
            return grant

    def close(self) -> None:
        return None

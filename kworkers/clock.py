"""Time as a seam: logic takes a ``Clock`` so tests drive it by hand and never sleep."""

from __future__ import annotations

import time
from typing import Annotated, Protocol

Seconds = Annotated[float, "seconds"]
"""A duration in seconds: settings read it from ``500ms``, ``1s``, ``2m``, ``1h`` or a number."""


class Clock(Protocol):
    def now(self) -> float:
        """Wall time, seconds since the epoch (due times cross processes, so wall time)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (deadlines, commit intervals)."""
        ...


class SystemClock:
    # The C functions themselves, not methods around them: the hot path reads the clock a few
    # times per record, and a Python frame per reading was ~5 % of a no-op record's CPU.
    now = staticmethod(time.time)
    monotonic = staticmethod(time.monotonic)


class FakeClock:
    """A clock tests move by hand; wall and monotonic time advance together."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def monotonic(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._t += seconds

    def set(self, t: float) -> None:
        if t < self._t:
            raise ValueError("a clock does not go back")
        self._t = t

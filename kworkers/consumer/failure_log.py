"""Failures as rate-limited summaries: one WARNING per interval, one DEBUG line per record.

In a failure storm every record fails; a WARNING per record is then itself the bottleneck (and
buries the one line an operator needs). The summary says how many attempts failed, of which
error types, and where they went, per interval; the per-record detail is at DEBUG.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

from kworkers.clock import Clock

#: seconds between two summaries (a summary is written only when something happened)
SUMMARY_INTERVAL_S = 10.0


class FailureLog:
    def __init__(self, logger: logging.Logger, group: str, clock: Clock,
                 interval_s: float = SUMMARY_INTERVAL_S) -> None:
        self.log = logger
        self.group = group
        self.clock = clock
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._handed: Counter[tuple[str, str]] = Counter()  # (error type, destination topic)
        self._refused: Counter[tuple[str, str]] = Counter()  # (destination topic, error)
        self._since = clock.monotonic()

    def handed(self, error_type: str, topic: str, n: int = 1) -> None:
        with self._lock:
            self._handed[(error_type, topic)] += n

    def refused(self, topic: str, error: str) -> None:
        """A hand-off the broker did not acknowledge (it is retried; the offset waits)."""
        with self._lock:
            self._refused[(topic, error[:120])] += 1

    def flush(self, force: bool = False) -> None:
        now = self.clock.monotonic()
        if not force and now - self._since < self.interval_s:
            return
        with self._lock:
            handed, self._handed = self._handed, Counter()
            refused, self._refused = self._refused, Counter()
            span, self._since = now - self._since, now
        if handed:
            self.log.warning("%s: %d failed attempts in %.0fs handed off: %s", self.group,
                             sum(handed.values()), span, _top(handed, "{0} -> {1}"))
        if refused:
            self.log.error("%s: %d hand-offs not acknowledged in %.0fs (retried in place; their "
                           "offsets stay uncommitted): %s", self.group, sum(refused.values()),
                           span, _top(refused, "{0}: {1}"))


def _top(counts: Counter[tuple[str, str]], fmt: str, n: int = 5) -> str:
    parts = [f"{fmt.format(*k)} x{c}" for k, c in counts.most_common(n)]
    if len(counts) > n:
        parts.append(f"and {len(counts) - n} more")
    return "; ".join(parts)

"""The ladder of delay topics a scheduled record climbs down towards its due time.

A record due far ahead (days) must neither sit in a timer heap for days nor be re-read from the
start of a topic over and over. So each destination has a few *rungs*, coarse delay topics
``<destination>.scheduled.<label>``: rung ``k`` holds records whose time left lies in
``(thresholds[k], thresholds[k+1]]``, and releases each when its time left reaches
``thresholds[k]`` (its ``kw-due-at`` header says when), into the rung below. The last rung,
``<destination>.scheduled.due``, holds records due within ``thresholds[0]`` and releases each
at its due time, to the destination. A record in the top rung waits at most ``horizon`` in a
heap and is then written to the top rung again (a record a year ahead with a day's horizon is
read about 365 times, once a day, never in a loop).

Cost, per record: one write and one read per rung it passes (at most ``len(thresholds) + 1``,
plus one per ``horizon`` above the top threshold), and a heap slot only while its release is
at most one rung's window away (``window``). Pure: the scheduler's handler joins it to a
producer.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass

from kworkers.errors import ConfigError
from kworkers.topic_names import check_source_topic, tier_label

#: the infix of a rung topic: ``<destination>.scheduled.<label>``
RUNG_INFIX = ".scheduled."
#: the label of the last rung, the one that releases records to their destination
DUE_LABEL = "due"
#: the furthest ahead a record may be scheduled by default (a year and a day)
MAX_AHEAD_S = 366 * 86_400.0


@dataclass(frozen=True)
class Hop:
    """Where a record waits next: rung ``rung`` (0: the last) until ``release_at``."""

    rung: int
    release_at: float

    @property
    def final(self) -> bool:
        return self.rung == 0


@dataclass(frozen=True)
class ScheduleLadder:
    """Rung thresholds in seconds (shortest first), the top rung's horizon, and how far ahead
    a record may be due at all."""

    thresholds: tuple[float, ...] = (60.0, 3600.0, 86_400.0)
    horizon: float = 86_400.0
    max_ahead: float = MAX_AHEAD_S

    def __post_init__(self) -> None:
        try:
            ts = tuple(float(t) for t in self.thresholds)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"schedule thresholds must be numbers: {self.thresholds!r}") from e
        if not ts:
            raise ConfigError("a schedule ladder needs at least one threshold")
        for t in (*ts, self.horizon, self.max_ahead):
            if not (math.isfinite(t) and t > 0):
                raise ConfigError(f"schedule ladder times must be positive and finite, got {t!r}")
        if any(b <= a for a, b in itertools.pairwise(ts)):
            raise ConfigError(f"schedule thresholds must strictly increase, got {ts!r}")
        for t in ts:
            tier_label(t)  # a whole number of milliseconds, so the rung has an exact label
        object.__setattr__(self, "thresholds", ts)

    def labels(self) -> tuple[str, ...]:
        """Rung labels, the last rung first: ``due``, then one per threshold."""
        return (DUE_LABEL, *(tier_label(t) for t in self.thresholds))

    def topics(self, destination: str) -> tuple[str, ...]:
        """The rung topics of ``destination``, the last rung (``.scheduled.due``) first."""
        longest = max(len(RUNG_INFIX + lb) for lb in self.labels()) + len(".retry.24h.dlq")
        check_source_topic(destination, longest_suffix=longest)
        return tuple(f"{destination}{RUNG_INFIX}{lb}" for lb in self.labels())

    def rung_of(self, topic: str, destination: str) -> int | None:
        """Which rung of ``destination`` ``topic`` is; None when it is none of them."""
        try:
            return self.topics(destination).index(topic)
        except ValueError:
            return None

    def window(self, rung: int) -> float:
        """The longest a record written to ``rung`` waits there (its heap slot's lifetime)."""
        if rung == 0:
            return self.thresholds[0]
        if rung == len(self.thresholds):
            return self.horizon
        return self.thresholds[rung] - self.thresholds[rung - 1]

    def plan(self, due: float, now: float) -> Hop:
        """The rung for a record due at ``due`` seen at ``now``: the one whose range holds its
        time left; released when the time left reaches that rung's threshold (the last rung:
        at ``due`` itself, never before)."""
        left = due - now
        k = bisect.bisect_left(self.thresholds, left)  # thresholds[k-1] < left <= thresholds[k]
        if k == 0:
            return Hop(0, due)
        release = due - self.thresholds[k - 1]
        if k == len(self.thresholds):
            release = min(release, now + self.horizon)
        return Hop(k, release)

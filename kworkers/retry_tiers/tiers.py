"""The ladder of retry topics: ``<topic>.retry.<label>`` for each delay, then ``<topic>.dlq``.

A record waits in the tier whose delay is the largest not above its own; the exact due time
travels in the ``kw-due-at`` header, so the tier only bounds how early a tier consumer sees it
and the ladder can stay short. Topic names derive from the source topic alone, so any worker
(and the redrive tool) can find them without shared state.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from dataclasses import dataclass

from kworkers.errors import ConfigError

_MAX_TOPIC = 249  # Kafka's limit on a topic name
_LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
# (unit, milliseconds) from the longest: the label uses the longest unit that is exact.
_UNITS = (("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1))
_TIER_NAME = re.compile(r"^(?P<source>.+)\.retry\.[0-9]+(?:ms|s|m|h)$")
_DLQ_NAME = re.compile(r"^(?P<source>.+)\.dlq$")


@dataclass(frozen=True)
class Tier:
    label: str
    delay: float
    topic: str


def _whole_ms(delay: float) -> int | None:
    ms = round(delay * 1000)
    return ms if abs(delay * 1000 - ms) < 1e-6 else None


def _label(delay: float) -> str:
    ms = _whole_ms(delay)
    if ms is None or ms <= 0:  # the ladder validates delays; this guards direct callers
        raise ConfigError(f"no exact label for a delay of {delay!r} s")
    for unit, size in _UNITS:
        if ms % size == 0:
            return f"{ms // size}{unit}"
    raise AssertionError("unreachable: every whole ms has a label")  # pragma: no cover


@dataclass(frozen=True)
class TierLadder:
    """The delays of the retry tiers, shortest first.

    Delays must be whole milliseconds so each tier has an exact, unique label (``1500ms``,
    not ``1.5s``) that ``source_topic_of`` can parse back.
    """

    delays: tuple[float, ...] = (1.0, 5.0, 30.0, 120.0, 600.0)

    def __post_init__(self) -> None:
        try:
            delays = tuple(float(d) for d in self.delays)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"retry tier delays must be numbers: {self.delays!r}") from e
        if not delays:
            raise ConfigError("a retry ladder needs at least one tier")
        for d in delays:
            if not (math.isfinite(d) and d > 0):
                raise ConfigError(f"retry tier delays must be positive and finite, got {d!r}")
            ms = _whole_ms(d)
            if ms is None or ms <= 0:
                raise ConfigError(f"retry tier delays must be whole milliseconds, got {d!r}")
        if any(b <= a for a, b in itertools.pairwise(delays)):
            raise ConfigError(f"retry tier delays must strictly increase, got {delays!r}")
        # A list would make the frozen value unhashable; normalise rather than refuse.
        object.__setattr__(self, "delays", delays)

    def tiers(self, topic: str) -> tuple[Tier, ...]:
        """The tiers of source topic ``topic`` (the original topic, not a tier topic)."""
        _check_topic(topic, longest_suffix=self._longest_suffix())
        return tuple(
            Tier(label=(lb := _label(d)), delay=d, topic=f"{topic}.retry.{lb}") for d in self.delays
        )

    def tier_for(self, topic: str, delay: float) -> Tier:
        """The tier with the largest delay not above ``delay``; the smallest below them all.

        Rounding down means a record never sits in a tier slower than its own delay; with
        full jitter most delays fall between tiers, and the due-at header covers the rest.
        """
        i = bisect.bisect_right(self.delays, delay) - 1
        return self.tiers(topic)[max(i, 0)]

    def dlq_topic(self, topic: str) -> str:
        _check_topic(topic, longest_suffix=len(".dlq"))
        return f"{topic}.dlq"

    def all_topics(self, topic: str) -> tuple[str, ...]:
        """Every topic the ladder needs for ``topic``: the tiers, shortest first, then the DLQ."""
        return (*(t.topic for t in self.tiers(topic)), self.dlq_topic(topic))

    def _longest_suffix(self) -> int:
        return max(len(f".retry.{_label(d)}") for d in self.delays)


def _check_topic(topic: str, longest_suffix: int) -> None:
    # Fail at configuration, not at the first failure in production when the produce is refused.
    if not _LEGAL_TOPIC.fullmatch(topic):
        raise ConfigError(f"not a legal Kafka topic name: {topic!r}")
    if len(topic) + longest_suffix > _MAX_TOPIC:
        raise ConfigError(
            f"topic {topic[:64]!r}... is too long: its retry topics would exceed {_MAX_TOPIC} chars"
        )


def source_topic_of(name: str) -> str:
    """The source topic a tier or DLQ topic belongs to; any other name is its own source."""
    m = _DLQ_NAME.match(name)
    if m:
        name = m["source"]
    m = _TIER_NAME.match(name)
    return m["source"] if m else name

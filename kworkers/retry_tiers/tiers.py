"""The ladder of retry topics: ``<topic>.retry.<label>`` for each delay, then ``<topic>.dlq``.

A record waits in the tier whose delay is the largest not above its own; the exact due time
travels in the ``kw-due-at`` header, so the tier only bounds how early a tier consumer sees it
and the ladder can stay short. The names themselves are ``kworkers.topic_names``'s.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kworkers.errors import ConfigError
from kworkers.topic_names import (
    DLQ_SUFFIX,
    MAX_TOPIC,
    TIER_INFIX,
    check_source_topic,
    dlq_topic,
    is_derived,
    source_topic_of,
    tier_label,
    tier_topic,
    whole_ms,
)

#: answers a ladder remembers (per topic) before it starts over
MEMO_LIMIT = 1024


@dataclass(frozen=True)
class Tier:
    label: str
    delay: float
    topic: str


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
            ms = whole_ms(d)
            if ms is None or ms <= 0:
                raise ConfigError(f"retry tier delays must be whole milliseconds, got {d!r}")
        if any(b <= a for a, b in itertools.pairwise(delays)):
            raise ConfigError(f"retry tier delays must strictly increase, got {delays!r}")
        # A list would make the frozen value unhashable; normalise rather than refuse.
        object.__setattr__(self, "delays", delays)
        # What the failure path asks once per failed record (a topic's tiers, the source of a
        # consumed topic, its DLQ), worked out once per topic: names are checked and built
        # with regular expressions and string formatting. Not a field: equality, hashing and
        # the repr stay the delays'.
        object.__setattr__(self, "_memo", {})

    def tiers(self, topic: str) -> tuple[Tier, ...]:
        """The tiers of source topic ``topic`` (the original topic, not a tier topic)."""
        tiers: tuple[Tier, ...] = self._remember("tiers", topic, self._tiers)
        return tiers

    def _tiers(self, topic: str) -> tuple[Tier, ...]:
        check_source_topic(topic, longest_suffix=self._longest_suffix())
        return tuple(Tier(label=(lb := tier_label(d)), delay=d, topic=tier_topic(topic, lb))
                     for d in self.delays)

    def _remember(self, what: str, topic: str, work: Callable[[str], Any]) -> Any:
        memo: dict[tuple[str, str], Any] = self._memo  # type: ignore[attr-defined]
        got = memo.get((what, topic))
        if got is None:
            got = work(topic)  # raises for a topic that has no answer: nothing remembered
            if len(memo) >= MEMO_LIMIT:
                memo.clear()
            memo[(what, topic)] = got
        return got

    def tier_for(self, topic: str, delay: float) -> Tier:
        """The tier with the largest delay not above ``delay``; the smallest below them all.

        Rounding down means a record never sits in a tier slower than its own delay; with
        full jitter most delays fall between tiers, and the due-at header covers the rest.
        """
        i = bisect.bisect_right(self.delays, delay) - 1
        return self.tiers(topic)[max(i, 0)]

    def source_of(self, consumed: str) -> str:
        """The source topic whose pipeline ``consumed`` belongs to on this ladder: the topic
        itself for a source, the source of one of its tiers; ``ConfigError`` for anything else
        (a DLQ, a tier of another ladder, an illegal name).

        What decides where a failed record goes: the topic it was read from, read through the
        worker's own configuration, never a header a producer wrote.
        """
        source: str = self._remember("source", consumed, self._source_of)
        return source

    def _source_of(self, consumed: str) -> str:
        if not is_derived(consumed):
            check_source_topic(consumed, longest_suffix=self._longest_suffix())
            return consumed
        source = source_topic_of(consumed)
        if (source != consumed and not is_derived(source)
                and any(t.topic == consumed for t in self.tiers(source))):
            return source
        raise ConfigError(f"{consumed[:MAX_TOPIC]!r} is neither a source topic nor one of its "
                          f"retry tiers on the ladder {self.labels()}")

    def labels(self) -> tuple[str, ...]:
        return tuple(tier_label(d) for d in self.delays)

    def dlq_topic(self, topic: str) -> str:
        dlq: str = self._remember("dlq", topic, self._dlq_topic)
        return dlq

    @staticmethod
    def _dlq_topic(topic: str) -> str:
        check_source_topic(topic, longest_suffix=len(DLQ_SUFFIX))
        return dlq_topic(topic)

    def all_topics(self, topic: str) -> tuple[str, ...]:
        """Every topic the ladder needs for ``topic``: the tiers, shortest first, then the DLQ."""
        return (*(t.topic for t in self.tiers(topic)), self.dlq_topic(topic))

    def _longest_suffix(self) -> int:
        return max(len(TIER_INFIX + tier_label(d)) for d in self.delays)

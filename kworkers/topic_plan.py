"""Which topics a worker needs next to its source topics, and how to size them (pure).

The plan is a function of what exists, so ``kworkers topics plan``, ``topics create`` and a
worker's own pre-flight can never disagree, and the rules are unit-tested: a source topic must
exist or be created with an explicit partition count (guessing one would fix the key ->
partition mapping forever); tiers and the DLQ get the source topic's partition count, so a key
keeps one partition per hop; an existing topic is never changed (adding partitions would move
keys).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kworkers.errors import ConfigError
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.topic_names import is_derived


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 6
    replication_factor: int = 1
    config: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 249:
            raise ConfigError(f"invalid topic name {self.name!r}")
        if self.partitions < 1:
            raise ConfigError(f"topic {self.name}: partitions must be >= 1, got {self.partitions}")


Action = Literal["create", "exists"]


@dataclass(frozen=True)
class PlannedTopic:
    name: str
    role: str  # "source", "tier <label>", "dlq"
    partitions: int
    action: Action
    note: str = ""


def plan_topics(
    existing: Mapping[str, int],
    sources: Sequence[str],
    ladder: TierLadder,
    partitions: int | None,
    bootstrap: str = "the broker",
) -> list[PlannedTopic]:
    """What ``topics create`` would do, topic by topic, sources first."""
    if not sources:
        raise ConfigError("name at least one source topic with --topic")
    if partitions is not None and partitions < 1:
        raise ConfigError(f"--partitions must be >= 1, got {partitions}")
    out: list[PlannedTopic] = []
    for src in dict.fromkeys(sources):
        tiers = ladder.tiers(src)  # validates the name (legal, short enough for its tiers)
        if is_derived(src):
            raise ConfigError(f"{src!r} is a retry tier or DLQ; name its source topic")
        if src in existing:
            n = existing[src]
            note = (f"--partitions {partitions} ignored: it has {n}"
                    if partitions is not None and partitions != n else "")
            out.append(PlannedTopic(src, "source", n, "exists", note))
        elif partitions is None:
            raise ConfigError(f"topic {src!r} does not exist on {bootstrap}; "
                              "pass --partitions N to create it")
        else:
            n = partitions
            out.append(PlannedTopic(src, "source", n, "create"))
        derived = [(t.topic, f"tier {t.label}") for t in tiers]
        derived.append((ladder.dlq_topic(src), "dlq"))
        for name, role in derived:
            if name in existing:
                have = existing[name]
                note = f"has {have} partitions, source has {n}" if have != n else ""
                out.append(PlannedTopic(name, role, have, "exists", note))
            else:
                out.append(PlannedTopic(name, role, n, "create"))
    return out


def specs(plan: Sequence[PlannedTopic], replication_factor: int = -1) -> list[TopicSpec]:
    """The topics to create (``-1``: the broker's ``default.replication.factor``)."""
    return [TopicSpec(p.name, p.partitions, replication_factor)
            for p in plan if p.action == "create"]

"""Which topics a worker needs next to its source topics, and how to size them (pure).

The plan is a function of what exists, so ``kworkers topics plan``, ``topics create`` and a
worker's own pre-flight can never disagree, and the rules are unit-tested: a source topic must
exist or be created with an explicit partition count (guessing one would fix the key ->
partition mapping forever); tiers and the DLQ get the source topic's partition count, so a key
keeps one partition per hop; an existing topic is never changed (adding partitions would move
keys).

Durability is copied the same way: a tier or DLQ of an existing source gets the source's
replication factor and, when the source overrides it, its ``min.insync.replicas`` (a dead
letter deserves the durability of the record it stands for), never a silent 1; a topic with
no source to copy from gets the broker's defaults (``-1``), unless the operator says
(``--replication-factor``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kworkers.errors import ConfigError
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.topic_names import is_derived

#: the broker's ``default.replication.factor`` (what a CreateTopics request with -1 gets)
BROKER_DEFAULT = -1


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 6
    replication_factor: int = BROKER_DEFAULT
    config: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 249:
            raise ConfigError(f"invalid topic name {self.name!r}")
        if self.partitions < 1:
            raise ConfigError(f"topic {self.name}: partitions must be >= 1, got {self.partitions}")


@dataclass(frozen=True)
class SourceShape:
    """What a derived topic copies from an existing source topic: its replicas (of its first
    partition) and its ``min.insync.replicas`` when the source overrides the broker's."""

    replication_factor: int = BROKER_DEFAULT
    min_insync_replicas: str | None = None

    def config(self) -> dict[str, str]:
        mir = self.min_insync_replicas
        return {} if mir is None else {"min.insync.replicas": mir}


Action = Literal["create", "exists"]


@dataclass(frozen=True)
class PlannedTopic:
    name: str
    role: str  # "source", "tier <label>", "dlq"
    partitions: int
    action: Action
    note: str = ""
    replication_factor: int = BROKER_DEFAULT
    config: Mapping[str, str] = field(default_factory=dict)

    def durability(self, replication_factor: int = BROKER_DEFAULT) -> str:
        """Replicas and min.insync.replicas it would be created with, as ``topics plan`` shows
        them (``replication_factor``: the operator's --replication-factor)."""
        rf = replication_factor if replication_factor != BROKER_DEFAULT else (
            self.replication_factor)
        text = "broker default" if rf == BROKER_DEFAULT else str(rf)
        mir = self.config.get("min.insync.replicas")
        return text if mir is None else f"{text}, min.insync.replicas={mir}"


def plan_topics(
    existing: Mapping[str, int],
    sources: Sequence[str],
    ladder: TierLadder,
    partitions: int | None,
    bootstrap: str = "the broker",
    shapes: Mapping[str, SourceShape] | None = None,
) -> list[PlannedTopic]:
    """What ``topics create`` would do, topic by topic, sources first; ``shapes``: what the
    existing sources' derived topics copy (``kafka.admin.source_shapes``)."""
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
                shape = (shapes or {}).get(src, SourceShape())
                out.append(PlannedTopic(name, role, n, "create", "",
                                        shape.replication_factor, shape.config()))
    return out


def specs(plan: Sequence[PlannedTopic], replication_factor: int = BROKER_DEFAULT
          ) -> list[TopicSpec]:
    """The topics to create: each with what it copies from its source, unless the operator
    gives a ``replication_factor`` (``-1``: the broker's ``default.replication.factor``)."""
    return [TopicSpec(p.name, p.partitions, replication_factor
                      if replication_factor != BROKER_DEFAULT else p.replication_factor,
                      dict(p.config))
            for p in plan if p.action == "create"]

"""What a worker needs of the cluster before it polls: its retry tier and DLQ topics.

A worker creates its missing tier and DLQ topics itself (``auto_create_topics``), sized like
their source and as durable (its replication factor and min.insync.replicas), where the
cluster lets it; a missing source topic is never created (its
partition count is a decision, not a default). Every refusal is one line naming what is
missing and why.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from kworkers.config import WorkerConfig
from kworkers.errors import ConfigError
from kworkers.kafka import clients
from kworkers.kafka.admin import create_topics as create
from kworkers.kafka.admin import source_shapes, try_create_topics
from kworkers.kafka.errors import TopicsRefused
from kworkers.topic_plan import SourceShape, TopicSpec, plan_topics, specs

log = logging.getLogger("kworkers.worker")


def topic_specs(cfg: WorkerConfig, partitions: int | None = None) -> list[TopicSpec]:
    """The tier and DLQ topics this worker needs, sized like their source topics and as
    durable (replication factor, min.insync.replicas: ``kafka.admin.source_shapes``)."""
    have = clients.list_topics(cfg.client)
    shapes = source_shapes(cfg.client, [t for t in cfg.topics if t in have])
    out = []
    for src in cfg.topics:
        n = partitions or have.get(src, 6)
        shape = shapes.get(src, SourceShape())
        out += [TopicSpec(t, n, shape.replication_factor, shape.config())
                for t in (*(t.topic for t in cfg.tiers.tiers(src)), cfg.tiers.dlq_topic(src))]
    return out


def create_topics(cfg: WorkerConfig, partitions: int | None = None) -> list[str]:
    return create(clients.admin(cfg.client), topic_specs(cfg, partitions))


def check_topics(cfg: WorkerConfig) -> None:
    """``ConfigError`` unless every topic the worker reads or writes exists."""
    require_topics(cfg, clients.list_topics(cfg.client))


def prepare_topics(cfg: WorkerConfig) -> list[str]:
    """``run``'s pre-flight: with ``auto_create_topics``, creates the missing retry tier
    and DLQ topics of the source topics that exist, sized like them (as ``kworkers topics
    create`` would), then checks every topic is there; returns the topics it created.

    A cluster that refuses (ACLs, a create policy) leaves the topics missing, and the
    error says so; a missing source topic is never created (its partition count is a
    decision, not a default).
    """
    have = clients.list_topics(cfg.client)  # KafkaUnreachable: one line, no secret
    sources = [t for t in cfg.topics if t in have]
    todo = specs(plan_topics(have, sources, cfg.tiers, None)) if sources else []
    if not (cfg.auto_create_topics and todo):
        require_topics(cfg, have)
        return []
    # as durable as their sources (replicas, min.insync.replicas), never a silent 1
    todo = specs(plan_topics(have, sources, cfg.tiers, None,
                             shapes=source_shapes(cfg.client, sources)))
    try:
        created = try_create_topics(cfg.client, todo)
    except TopicsRefused as exc:
        require_topics(cfg, clients.list_topics(cfg.client),
                       f" (creating them was refused: {exc.reason})")
        return []
    if created:
        log.info("created topics %s", ", ".join(created))
    require_topics(cfg, clients.list_topics(cfg.client))
    return created


#: the partition count the printed command proposes for a missing source (a decision the
#: operator makes: the line says to choose it)
PROPOSED_PARTITIONS = 6


def create_command(cfg: WorkerConfig, sources: Collection[str]) -> str:
    """``kworkers topics create`` as it works when pasted: the worker's cluster, its sources,
    its own retry ladder (the command's default ladder may not be the worker's)."""
    tops = " ".join(f"--topic {t}" for t in sources)
    secured = any(k.startswith(("security.", "sasl.", "ssl.")) for k in cfg.client_config)
    return (f"kworkers topics create -b {cfg.bootstrap_servers} {tops} "
            f"--partitions {PROPOSED_PARTITIONS} --tiers {','.join(cfg.tiers.labels())}"
            + (" --config <the worker's client settings>" if secured else ""))


def require_topics(cfg: WorkerConfig, have: Collection[str], note: str = "") -> None:
    need = [*cfg.topics, *cfg.tier_topics(), *cfg.dlq_topics()]
    missing = [t for t in need if t not in have]
    absent = [t for t in cfg.topics if t not in have]
    if absent and cfg.auto_create_topics and not note:
        # its tiers and DLQ are not missing: this worker creates them once it exists
        raise ConfigError(
            f"source topic missing on {cfg.bootstrap_servers}: {', '.join(absent)}; "
            f"create it (choose its partition count): `{create_command(cfg, absent)}` (the "
            "worker would create its retry tiers and DLQ itself)")
    if missing:
        sources = [t for t in cfg.topics
                   if any(m == t or m in cfg.tiers.all_topics(t) for m in missing)]
        raise ConfigError(
            f"topics missing on {cfg.bootstrap_servers}: {', '.join(missing)}; create them: "
            f"`{create_command(cfg, sources)}` (or Worker.create_topics()){note}")

"""Topic administration through confluent-kafka's AdminClient (an adapter module).

``admin_client`` is ``kworkers.kafka.clients.admin``: the admin client of a ``ClientSettings``
(or of a bare bootstrap address).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource, ConfigSource
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from kworkers.kafka.clients import admin as admin_client
from kworkers.kafka.clients import reason
from kworkers.kafka.errors import TopicsRefused
from kworkers.kafka.settings import ClientSettings
from kworkers.topic_plan import SourceShape, TopicSpec

__all__ = ["TopicSpec", "admin_client", "broker_config", "create_topics", "delete_topics",
           "existing_topics", "source_shapes", "try_create_topics"]
log = logging.getLogger("kworkers.topics")


def existing_topics(admin: AdminClient, timeout: float = 10.0) -> dict[str, int]:
    """Topic name -> partition count, internal topics left out."""
    md = admin.list_topics(timeout=timeout)
    return {n: len(t.partitions) for n, t in md.topics.items() if not n.startswith("__")}


def source_shapes(client: ClientSettings | str, names: Iterable[str],
                  timeout: float = 10.0) -> dict[str, SourceShape]:
    """What the derived topics of the existing topics ``names`` copy: each one's replication
    factor and, where it overrides the broker's, its ``min.insync.replicas``.

    Reading the configs needs DESCRIBE_CONFIGS; where that is refused the new topics keep
    the broker's ``min.insync.replicas``, and a warning says so (never silently)."""
    admin = admin_client(client)
    md = admin.list_topics(timeout=timeout)
    rf: dict[str, int] = {}
    for name in dict.fromkeys(names):
        t = md.topics.get(name)
        if t is not None and t.error is None and t.partitions:
            first = t.partitions.get(0) or next(iter(t.partitions.values()))
            rf[name] = len(first.replicas)
    out = {name: SourceShape(n) for name, n in rf.items()}
    if not rf:
        return out
    try:
        futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in rf],
                                         request_timeout=timeout)
        for resource, future in futures.items():
            entry = future.result(timeout).get("min.insync.replicas")
            source = getattr(entry, "source", None)
            if entry is not None and getattr(source, "value", source) == (
                    ConfigSource.DYNAMIC_TOPIC_CONFIG.value):
                out[resource.name] = SourceShape(rf[resource.name], str(entry.value))
    except KafkaException as exc:
        log.warning("cannot read min.insync.replicas of %s (%s): their retry tiers and DLQ "
                    "get the broker's default", ", ".join(rf), reason(exc))
    return out


def create_topics(
    admin: AdminClient, specs: Iterable[TopicSpec], timeout: float = 30.0
) -> list[str]:
    """Create the topics that do not exist yet; returns the names created.

    An existing topic is left as it is (its partition count is not changed: that would move
    keys to other partitions).
    """
    wanted = list(specs)
    have = existing_topics(admin, timeout)
    new = [
        NewTopic(s.name, num_partitions=s.partitions, replication_factor=s.replication_factor,
                 config=dict(s.config))
        for s in wanted
        if s.name not in have
    ]
    if not new:
        return []
    created: list[str] = []
    for name, fut in admin.create_topics(new, operation_timeout=timeout).items():
        try:
            fut.result(timeout)
            created.append(name)
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise
    _wait_visible(admin, created, timeout)
    return created


def try_create_topics(client: ClientSettings | str, specs: Iterable[TopicSpec],
                      timeout: float = 30.0) -> list[str]:
    """``create_topics`` with the admin client of ``client``; a create the cluster refuses
    (ACLs, a create policy) is ``TopicsRefused``, with the client's reason."""
    admin = admin_client(client)
    try:
        return create_topics(admin, specs, timeout)
    except KafkaException as exc:
        raise TopicsRefused(reason(exc)) from None


def delete_topics(admin: AdminClient, names: Iterable[str], timeout: float = 30.0) -> None:
    names = list(names)
    if not names:
        return
    for fut in admin.delete_topics(names, operation_timeout=timeout).values():
        try:
            fut.result(timeout)
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue
            raise


def _wait_visible(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Metadata is eventually consistent: wait until every new topic has its leaders."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=timeout)
        ok = all(
            n in md.topics
            and md.topics[n].error is None
            and all(p.leader >= 0 for p in md.topics[n].partitions.values())
            for n in names
        )
        if ok:
            return
        time.sleep(0.1)
    raise TimeoutError(f"topics {names} not visible after {timeout}s")


def broker_config(admin: AdminClient, name: str, timeout: float = 10.0) -> str | None:
    """One broker configuration value (of the first broker the cluster metadata names), as
    the broker reports it; None when it cannot be read (not authorised, unreachable)."""
    from confluent_kafka.admin._config import ConfigResource

    try:
        brokers = admin.list_topics(timeout=timeout).brokers
        if not brokers:
            return None
        res = ConfigResource("BROKER", str(min(brokers)))
        got = admin.describe_configs([res], request_timeout=timeout)[res].result(timeout)
    except KafkaException:
        return None
    entry = got.get(name)
    return None if entry is None or entry.value is None else str(entry.value)

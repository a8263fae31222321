"""Offsets read fresh from the broker (an adapter): a group's committed offsets and the log
ends its lag is measured against, for the stall watch, ``kworkers lag`` and the console.

Why an admin client of its own, not the worker's consumer: confluent-kafka lets one thread at a
time into a consumer, and a poll loop that calls ``consume`` back to back keeps it, so a
watermark query or a committed-offset fetch from another thread waits behind the loop for as
long as the loop runs (measured with confluent-kafka 2.16.1: such a call never returned while a
thread polled in 0.1 s steps). The stall watch asks rarely (only for partitions already idle
past their bound), so one lazily made admin client per worker costs nothing until then.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from kworkers.kafka import clients
from kworkers.kafka.clients import CONNECT_TIMEOUT
from kworkers.kafka.settings import ClientSettings

#: one partition's offsets as ``kworkers lag`` reads them: (topic, partition, latest, committed)
Row = tuple[str, int, int, int | None]

TP = tuple[str, int]


class BrokerOffsets:
    """Log ends and committed offsets, read fresh (``stall_watch.LagSource``)."""

    def __init__(self, client: ClientSettings) -> None:
        self._client = client
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()

    def _get(self) -> AdminClient:
        with self._lock:
            if self._admin is None:
                self._admin = clients.admin(self._client)
            return self._admin

    def latest(self, tps: list[TP], timeout: float) -> dict[TP, int]:
        """High watermarks; a partition the broker did not answer for is left out."""
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        futures = self._get().list_offsets(
            {TopicPartition(t, p): latest for t, p in tps}, request_timeout=timeout)
        out: dict[TP, int] = {}
        for tp, fut in futures.items():
            try:
                out[(tp.topic, tp.partition)] = int(fut.result(timeout).offset)
            except Exception:
                continue
        return out

    def committed(self, group: str, tps: list[TP], timeout: float,
                  require_stable: bool = False) -> dict[TP, int | None]:
        """The group's committed offsets (None: the group has none for that partition); with
        ``require_stable``, only once no transaction is pending on them."""
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in tps])
        futures = self._get().list_consumer_group_offsets(
            [request], request_timeout=timeout, require_stable=require_stable)
        got = futures[group].result(timeout)
        return {(x.topic, x.partition): (int(x.offset) if x.offset >= 0 else None)
                for x in got.topic_partitions}


def group_topics(client: ClientSettings | str, group: str) -> list[str]:
    """The topics ``group`` has committed offsets for (KEDA's choice when no topic is set)."""
    admin = clients.admin(client)
    try:
        fut = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
        res = fut.result(timeout=CONNECT_TIMEOUT)
    except KafkaException as exc:
        raise clients.unreachable(client, exc) from None
    return sorted({tp.topic for tp in res.topic_partitions or [] if tp.offset >= 0})


def group_offsets(client: ClientSettings | str, group: str, names: Sequence[str],
            have: dict[str, int]) -> list[Row]:
    """``(topic, partition, latest, committed)`` for every partition of ``names``."""
    if not names:
        return []
    c = clients.reader(client, group)
    try:
        tps = [TopicPartition(t, p) for t in names for p in range(have[t])]
        committed = {(tp.topic, tp.partition): tp.offset
                     for tp in c.committed(tps, timeout=CONNECT_TIMEOUT)}
        rows: list[Row] = []
        for tp in tps:
            _lo, hi = c.get_watermark_offsets(tp, timeout=CONNECT_TIMEOUT)
            off = committed.get((tp.topic, tp.partition), -1)
            rows.append((tp.topic, tp.partition, hi, off if off >= 0 else None))
        return rows
    except KafkaException as exc:
        raise clients.unreachable(client, exc) from None
    finally:
        c.close()


def topic_watermarks(client: ClientSettings, topics: Mapping[str, int]
               ) -> dict[str, list[tuple[int, int]]]:
    """topic -> ``[(low, high)]`` per partition, for ``topics`` (name -> partition count)."""
    reader = clients.reader(client)
    out: dict[str, list[tuple[int, int]]] = {}
    try:
        for topic, n in topics.items():
            out[topic] = [reader.get_watermark_offsets(TopicPartition(topic, p),
                                                       timeout=CONNECT_TIMEOUT)
                          for p in range(n)]
    except KafkaException as exc:
        raise clients.unreachable(client, exc) from None
    finally:
        reader.close()
    return out

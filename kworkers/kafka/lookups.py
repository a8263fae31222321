"""The two broker look-ups behind the keys of records without ids (``kworkers.record_key``).

- ``KafkaTopicIds``: a topic's id (``AdminClient.describe_topics``; neither a consumed record
  nor the metadata a consumer caches carries it in confluent-kafka 2.16).
- ``KafkaDlqWindow``: the DLQ records from one offset on, to check a redriven record against
  the dead letter it names (``kworkers.kafka.reader.scan``, ``read_committed``).

Adapters: they import confluent-kafka and are built on first use, so a worker that never meets
a record without ids opens no admin connection. A failure is a ``RetryableError``: the record
is tried again later, never given a key it may not have.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaException, TopicCollection, Uuid
from confluent_kafka.admin import AdminClient

from kworkers.errors import ConfigError, RetryableError
from kworkers.kafka import clients
from kworkers.kafka.clients import CONNECT_TIMEOUT, KafkaUnreachable
from kworkers.kafka.reader import ReadTimeout, scan
from kworkers.kafka.settings import ClientSettings
from kworkers.message import Message


def kafka_form(uuid: Uuid | Any) -> str:
    """A topic id as Kafka prints it (``kafka-topics.sh --describe``): URL-safe base64 of its
    16 bytes, unpadded. librdkafka's own text uses the standard alphabet (``+`` and ``/``)."""
    mask = (1 << 64) - 1
    u: Any = uuid  # the stubs do not list the bit accessors
    raw = ((u.get_most_significant_bits() & mask).to_bytes(8, "big")
           + (u.get_least_significant_bits() & mask).to_bytes(8, "big"))
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


class KafkaTopicIds:
    """``describe(topic) -> topic id``, one admin client per worker, made when first asked."""

    def __init__(self, client: ClientSettings) -> None:
        self._client = client
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()

    def __call__(self, topic: str) -> str:
        with self._lock:
            if self._admin is None:
                self._admin = clients.admin(self._client)
            admin = self._admin
        try:
            fut = admin.describe_topics(TopicCollection([topic]),
                                        request_timeout=CONNECT_TIMEOUT)[topic]
            return kafka_form(fut.result(timeout=CONNECT_TIMEOUT + 5).topic_id)
        except (KafkaException, TimeoutError) as exc:
            raise RetryableError("TopicIdUnavailable", f"the id of topic {topic!r} could not "
                                 f"be read: {clients.reason(exc)}") from None


class KafkaDlqWindow:
    """``read(dlq, partition, offset, n) -> records``: at most ``n`` from that offset on."""

    def __init__(self, client: ClientSettings) -> None:
        self._client = client

    def __call__(self, dlq: str, partition: int, offset: int, n: int) -> Sequence[Message]:
        try:
            return scan(self._client, dlq, start={partition: offset}, partitions=[partition],
                        limit=n, timeout=30).messages
        except (KafkaUnreachable, ReadTimeout, KafkaException) as exc:
            raise RetryableError("DeadLetterUnavailable", f"{dlq} could not be read: "
                                 f"{clients.reason(exc)}") from None
        except ConfigError:
            # no such DLQ, or no such partition: nothing there vouches for the redriven record
            return []

"""Low and high watermarks of whole topics, from one reader (the DLQ index, the ledger tail).

``high - low`` is the span of offsets a partition holds: its records plus one marker per
committed transaction, so it bounds the record count from above and is shown as "offsets",
never as a count of records.
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaException, TopicPartition

from kworkers.kafka import clients
from kworkers.kafka.clients import CONNECT_TIMEOUT
from kworkers.kafka.settings import ClientSettings


def watermarks(client: ClientSettings, topics: Mapping[str, int]
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

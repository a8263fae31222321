"""The one place the test apps import the Kafka consumer adapter from (issue #26 moves it
under ``kworkers/kafka/``: a one-line change here), and its client underneath, which only
deliberately broken test consumers touch."""

from __future__ import annotations

from typing import Any

from kworkers.kafka.consumer import KafkaConsumerAdapter
from kworkers.kafka.settings import consumer_settings

__all__ = ["KafkaConsumerAdapter", "consumer_settings", "raw_client"]


def raw_client(adapter: KafkaConsumerAdapter) -> Any:
    """The confluent-kafka ``Consumer`` the adapter wraps (for seeks and commits the adapter
    would never make: the broken consumers of the checker's canaries)."""
    return adapter._c

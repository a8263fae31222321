"""The client's error types, for modules above the adapters that must tell a Kafka error from
their own (an operator command turning it into one line, a pre-flight reading why a create was
refused) without importing the client library themselves."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

__all__ = ["KafkaError", "KafkaException"]

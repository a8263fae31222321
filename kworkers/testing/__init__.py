"""Test support for kworkers and its users: a real Kafka broker you can start, kill and restart."""

from kworkers.testing.broker import (
    DEFAULT_KAFKA_IMAGE,
    KAFKA_VERSION,
    Broker,
    ContainerBroker,
    ExternalBroker,
    ProcessBroker,
    broker_from_env,
)

__all__ = [
    "DEFAULT_KAFKA_IMAGE",
    "KAFKA_VERSION",
    "Broker",
    "ContainerBroker",
    "ExternalBroker",
    "ProcessBroker",
    "broker_from_env",
]

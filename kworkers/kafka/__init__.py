"""Kafka clients from one settings value.

- ``settings``: ``ClientSettings`` (bootstrap, security, overrides) and the configuration of
  every client role; pure, so importing it loads no client library.
- ``clients``: the admin client, topic reader and transactional producer built from it, and
  the one-line errors (``KafkaUnreachable``, ``TopicNotFound``).
- ``reader``: reading a topic back without a consumer group (``scan``, ``read_record``).
"""

from kworkers.kafka.settings import ClientSettings

__all__ = ["ClientSettings"]

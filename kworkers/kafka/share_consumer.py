"""The adapter between the share loop and confluent-kafka's ``ShareConsumer`` (Preview).

Wraps, never subclasses, the client. What this client version does, measured against Kafka
4.3.1 (docs/SHARE_GROUPS.md has the whole list):

- ``poll(timeout)`` returns a ``Messages`` container; each ``Message.delivery_count()`` is 1 on
  the first acquisition and grows with every later one (release, expired lock, dead holder);
- explicit mode (``share.acknowledgement.mode=explicit``, owned by kworkers: implicit mode
  would accept records on the next poll whether their work is done or not);
- ``acknowledge_offset(topic, partition, offset, type)`` is documented as equivalent to
  ``acknowledge(message, type)``; it lets the loop acknowledge by coordinates, so no client
  message (and the fetch buffer behind it) is kept alive while a handler runs;
- RENEW (type 4, KIP-1222) is refused: ``ValueError: Failed to acknowledge offset: Local:
  Invalid argument or configuration``;
- refusals of sent acknowledgements arrive in the callback of
  ``set_acknowledgement_commit_callback``, on this thread, during ``poll``/``commit_*``;
- ``auto.offset.reset`` is refused as a client property: where a new group starts is the
  *group* config ``share.auto.offset.reset``, set here with the admin client;
- the admin client has no share-group API, so the backlog metric reads only log ends.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import AcknowledgeType, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

# the admin value types are not re-exported by name for type checkers: their own modules
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.admin._resource import ResourceType

from kworkers.consumer.ports import TP
from kworkers.errors import ConfigError
from kworkers.kafka import clients
from kworkers.kafka.clients import reason
from kworkers.kafka.consumer import headers_of
from kworkers.kafka.settings import OFFSET_RESET, ClientSettings
from kworkers.message import Message
from kworkers.share.ports import (
    AckFailure,
    AckType,
    Acquired,
    GroupSettings,
    OffsetReset,
    RecordKey,
)

log = logging.getLogger("kworkers.share")

ADMIN_TIMEOUT_S = 15.0

_TYPES = {"accept": AcknowledgeType.ACCEPT, "release": AcknowledgeType.RELEASE,
          "reject": AcknowledgeType.REJECT}
_GROUP_KEYS = ("share.record.lock.duration.ms", "share.delivery.count.limit",
               "share.auto.offset.reset", "share.renew.acknowledge.enable")


def offset_reset_of(consumer_config: Mapping[str, Any]) -> OffsetReset:
    """Where a new share group starts: the worker's ``auto.offset.reset`` (default earliest,
    like partitioned mode, so records produced before the first worker joined are not
    skipped)."""
    value = str(consumer_config.get(OFFSET_RESET, "earliest")).lower()
    if value not in ("earliest", "latest"):
        raise ConfigError(f"consumer_config: {OFFSET_RESET} must be earliest or latest in share "
                          f"mode (it becomes the group's share.auto.offset.reset), got {value!r}")
    return "earliest" if value == "earliest" else "latest"


class ShareConsumerAdapter:
    """A ``SharePort`` over confluent-kafka: the share consumer (poll thread only) and an admin
    client for the group's configs and the log ends (thread-safe)."""

    def __init__(self, client: ClientSettings, group: str,
                 overrides: Mapping[str, Any] | None = None) -> None:
        self.group = group
        self.client = client
        self._c = clients.share_consumer(client, group, overrides)
        self._failures: list[AckFailure] = []
        self._c.set_acknowledgement_commit_callback(self._acked)
        self._admin_client: AdminClient | None = None

    # ------------------------------------------------------------------ consumer (poll thread)

    def subscribe(self, topics: Iterable[str]) -> None:
        self._c.subscribe(list(topics))

    def poll(self, timeout: float) -> list[Acquired]:
        out: list[Acquired] = []
        new = tuple.__new__
        for m in self._c.poll(timeout):
            err = m.error()
            if err is not None:
                if err.fatal():
                    raise KafkaException(err)
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("share consumer error (the client retries it): %s", err)
                continue
            h = m.headers()
            ts = m.timestamp()
            msg = new(Message, (m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                                headers_of(h) if h else (), ts[1] if ts[0] else None, 1,
                                None, None, False))
            out.append(Acquired(msg, m.delivery_count() or 1))
        return out

    def acknowledge(self, key: RecordKey, kind: AckType) -> None:
        try:
            self._c.acknowledge_offset(key[0], key[1], key[2], _TYPES[kind])
        except (KafkaException, ValueError, RuntimeError) as exc:
            # e.g. the consumer no longer holds the record: the broker will deliver it again
            self._failures.append(AckFailure(key[0], key[1], frozenset({key[2]}),
                                             reason(exc)))

    def flush(self, wait: float | None = None) -> None:
        try:
            if wait is None:
                self._c.commit_async()
            else:
                self._c.commit_sync(wait)
        except (KafkaException, RuntimeError) as exc:
            log.warning("%s: sending acknowledgements failed (%s); the client sends them with "
                        "the next poll", self.group, reason(exc))

    def _acked(self, offsets: Mapping[KafkaTP, set[int]], exc: BaseException | None) -> None:
        for tp, offs in offsets.items():
            err = tp.error if getattr(tp, "error", None) is not None else exc
            if err is not None:
                text = err.str() if isinstance(err, KafkaError) else reason(err)
                self._failures.append(AckFailure(tp.topic, tp.partition, frozenset(offs), text))

    def ack_failures(self) -> list[AckFailure]:
        out, self._failures = self._failures, []
        return out

    def close(self) -> None:
        self._c.close()

    # ------------------------------------------------------------------ group (admin)

    def _admin(self) -> AdminClient:
        if self._admin_client is None:
            self._admin_client = clients.admin(self.client)
        return self._admin_client

    def group_settings(self) -> GroupSettings:
        res = ConfigResource(ResourceType.GROUP, self.group)
        try:
            entries = self._admin().describe_configs(
                [res], request_timeout=ADMIN_TIMEOUT_S)[res].result(ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            raise ConfigError(f"cannot read share group {self.group}'s configs: "
                              f"{reason(exc)}") from None
        values = {k: entries[k].value for k in _GROUP_KEYS if k in entries}
        missing = [k for k in _GROUP_KEYS[:3] if values.get(k) is None]
        if missing:
            raise ConfigError(f"the broker reports no {missing} for group {self.group}: share "
                              "groups need Kafka 4.2+ (share.version=1)")
        reset = str(values["share.auto.offset.reset"]).lower()
        return GroupSettings(
            lock_s=int(values["share.record.lock.duration.ms"]) / 1000,
            delivery_limit=int(values["share.delivery.count.limit"]),
            offset_reset="earliest" if reset == "earliest" else "latest",
            renew_enabled=str(values.get("share.renew.acknowledge.enable")).lower() == "true")

    def ensure_offset_reset(self, reset: OffsetReset) -> None:
        if self.group_settings().offset_reset == reset:
            return
        res = ConfigResource(ResourceType.GROUP, self.group, incremental_configs=[ConfigEntry(
            "share.auto.offset.reset", reset, incremental_operation=AlterConfigOpType.SET)])
        try:
            self._admin().incremental_alter_configs(
                [res], request_timeout=ADMIN_TIMEOUT_S)[res].result(ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            raise ConfigError(f"cannot set share.auto.offset.reset={reset} on share group "
                              f"{self.group} ({reason(exc)}); set it with kafka-configs "
                              "--entity-type groups, or allow the worker ALTER_CONFIGS on "
                              "the group") from None
        log.info("share group %s: share.auto.offset.reset set to %s", self.group, reset)

    def high_watermarks(self, tps: Iterable[TP]) -> dict[TP, int]:
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        request = {KafkaTP(t, p): latest for t, p in tps}
        if not request:
            return {}
        futures = self._admin().list_offsets(request, request_timeout=ADMIN_TIMEOUT_S)
        return {(tp.topic, tp.partition): int(f.result(ADMIN_TIMEOUT_S).offset)
                for tp, f in futures.items()}

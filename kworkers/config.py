"""A worker's settings: one frozen, validated value (not thirty constructor arguments).

Everything that can be wrong is reported here, before any record is fetched, with the setting's
name in the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from kworkers.clock import Seconds
from kworkers.consumer.batching import BatchPolicy
from kworkers.consumer.breaker import BreakerPolicy
from kworkers.consumer.commit import CommitPolicy
from kworkers.errors import ConfigError
from kworkers.kafka.settings import ClientSettings, Prop, is_security_key
from kworkers.retry_tiers.policy import RetryPolicy
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.topic_names import is_derived, retry_group

Ordering = Literal["partition", "key"]
#: where sync handlers run: a thread pool (the default: a handler never blocks the poll loop), or
#: the poll thread itself (opt-in, for fast handlers: no hand-over between threads)
Execution = Literal["threads", "inline"]
GroupProtocol = Literal["classic", "consumer"]
#: "partition": a consumer group (order per partition or key; members up to the partitions);
#: "share": a share group (KIP-932; no order, members beyond the partitions; docs/SHARE_GROUPS.md)
Mode = Literal["partition", "share"]

# Settings kworkers owns: a user's consumer_config may not override them, because the
# guarantees rest on them (commit only after durable work, incremental rebalancing).
_OWNED_CONSUMER_KEYS = frozenset({
    "group.id", "bootstrap.servers", "enable.auto.commit", "enable.auto.offset.store",
    "group.protocol",
})
# Not client settings under KIP-848: the broker's group.consumer.* configs rule.
_CLASSIC_ONLY_KEYS = frozenset({
    "partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms",
})


#: a hung handler call is never judged sooner than this
MIN_STALL_BOUND_S = 60.0


@dataclass(frozen=True)
class WorkerConfig:
    topics: tuple[str, ...]
    group_id: str
    bootstrap_servers: str = "127.0.0.1:9092"
    mode: Mode = "partition"
    ordering: Ordering = "partition"
    #: handler executions at once: threads for sync handlers, tasks for async ones
    concurrency: int = 8
    execution: Execution = "threads"
    max_in_flight: int = 20_000
    max_in_flight_per_partition: int = 5_000
    #: per-message deadline in seconds (None: no deadline); a heartbeat extends it
    message_timeout: Seconds | None = None
    commit: CommitPolicy = field(default_factory=CommitPolicy)
    group_protocol: GroupProtocol = "classic"
    #: retry tiers and DLQ: failed attempts never block the partition
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    tiers: TierLadder = field(default_factory=TierLadder)
    jitter_seed: int | None = None
    #: how long in-flight work of a revoked partition may take before its state is dropped
    revoke_timeout: Seconds = 10.0
    #: how long SIGTERM waits for in-flight work before committing and leaving
    drain_timeout: Seconds = 30.0
    #: records a retry-tier consumer holds in its timer heap before pausing (the heap may
    #: overshoot this by one fetched batch, ``consume_batch``)
    delay_buffer: int = 10_000
    consume_batch: int = 500
    #: failed attempts handed off and not yet acknowledged by the broker, per loop; more and
    #: the lanes wait (every one of them holds its offset's commit until acknowledged)
    handoff_limit: int = 10_000
    #: a circuit breaker that stops starting records while a dependency is down (None: off)
    breaker: BreakerPolicy | None = None
    #: how a batch handler's batches are cut (unused by single-record handlers)
    batch: BatchPolicy = field(default_factory=BatchPolicy)
    #: create missing retry tier and DLQ topics at start (sized like their source topic) when
    #: the cluster lets the worker; off: they must exist (``kworkers topics create``)
    auto_create_topics: bool = True
    #: librdkafka properties of every client the worker makes (its consumers, hand-off
    #: producer and admin client): security.*, sasl.*, ssl.* and any shared override
    client_config: Mapping[str, Prop] = field(default_factory=dict, repr=False)
    #: librdkafka properties of the consumers only, and of the hand-off producer only
    consumer_config: Mapping[str, Prop] = field(default_factory=dict)
    producer_config: Mapping[str, Prop] = field(default_factory=dict)

    def __post_init__(self) -> None:
        raw: object = self.topics
        topics = (raw,) if isinstance(raw, str) else tuple(self.topics)
        object.__setattr__(self, "topics", topics)
        if not topics or any(not t or not isinstance(t, str) for t in topics):
            raise ConfigError(f"topics: need at least one non-empty topic name, got {topics!r}")
        for t in topics:
            if is_derived(t):
                raise ConfigError(f"topics: {t!r} is a retry tier or DLQ; name the source topic")
        if not self.group_id:
            raise ConfigError("group_id: must not be empty")
        if not self.bootstrap_servers:
            raise ConfigError("bootstrap_servers: must not be empty")
        if self.ordering not in ("partition", "key"):
            raise ConfigError(f"ordering: 'partition' or 'key', got {self.ordering!r}")
        if self.execution not in ("threads", "inline"):
            raise ConfigError(f"execution: 'threads' or 'inline', got {self.execution!r}")
        if self.mode not in ("partition", "share"):
            raise ConfigError(f"mode: 'partition' or 'share', got {self.mode!r}")
        if self.mode == "share" and self.ordering != "partition":
            raise ConfigError("ordering: a share group gives records of one key to any member, "
                              "so share mode has no order to keep; leave ordering unset")
        if self.mode == "share" and self.execution != "threads":
            raise ConfigError("execution: share mode runs handlers on its lanes, whose deadline "
                              "keeps each record inside its acquisition lock; 'inline' is not "
                              "supported with mode='share' yet")
        if self.group_protocol not in ("classic", "consumer"):
            raise ConfigError(
                f"group_protocol: 'classic' or 'consumer', got {self.group_protocol!r}")
        for name in ("concurrency", "max_in_flight", "max_in_flight_per_partition",
                     "delay_buffer", "consume_batch", "handoff_limit"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}: must be a whole number >= 1, got {value!r}")
        if self.message_timeout is not None and self.message_timeout <= 0:
            raise ConfigError(f"message_timeout: must be > 0 s or None, got {self.message_timeout}")
        for name in ("revoke_timeout", "drain_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be > 0 s")
        if self.breaker is not None and not isinstance(self.breaker, BreakerPolicy):
            raise ConfigError(f"breaker: a BreakerPolicy or None, got {self.breaker!r}")
        if not isinstance(self.batch, BatchPolicy):
            raise ConfigError(f"batch: a BatchPolicy, got {self.batch!r}")
        owned = _OWNED_CONSUMER_KEYS & set(self.consumer_config)
        if owned:
            raise ConfigError(f"consumer_config: {sorted(owned)} are set by kworkers itself")
        for name in ("consumer_config", "producer_config"):
            security = sorted(k for k in getattr(self, name) if is_security_key(k))
            if security:
                raise ConfigError(
                    f"{name}: {security} are connection settings every client of the worker "
                    "needs (its admin client and hand-off producer too): put them in "
                    "client_config")
        _ = self.client  # validates client_config
        if self.group_protocol == "consumer":
            bad = _CLASSIC_ONLY_KEYS & set(self.consumer_config)
            if bad:
                raise ConfigError(
                    f"consumer_config: {sorted(bad)} are not client settings under "
                    "group_protocol='consumer' (KIP-848); the broker's group.consumer.* rule"
                )

    @property
    def client(self) -> ClientSettings:
        """Where the cluster is and how every client of the worker connects to it."""
        return ClientSettings.of(self.bootstrap_servers, self.client_config)

    def started_work_bound(self) -> float:
        """How long a graceful stop waits for handler calls already started: their deadline
        when there is one, never more than ``drain_timeout`` (queued records are not waited
        for: the next owner reads them again)."""
        if self.message_timeout is None:
            return self.drain_timeout
        return min(self.drain_timeout, self.message_timeout)

    def stall_bound(self) -> float | None:
        """A handler call running this long is hung (its lane moved on at the deadline, but it
        holds a thread for good): the worker turns unhealthy and exits so a restart frees it.
        Three deadlines, at least a minute; no deadline, no bound."""
        if self.message_timeout is None:
            return None
        return max(3 * self.message_timeout, MIN_STALL_BOUND_S)

    def leave_bound(self) -> float:
        """The longest a graceful stop takes: started work, then the last commit (which polls
        through a rebalance in progress for up to ``revoke_timeout``)."""
        return self.started_work_bound() + self.revoke_timeout

    @property
    def retry_group_id(self) -> str:
        """Tier topics have a group of their own, so waiting retries never count as main lag."""
        return retry_group(self.group_id)

    def tier_topics(self) -> tuple[str, ...]:
        return tuple(t.topic for src in self.topics for t in self.tiers.tiers(src))

    def dlq_topics(self) -> tuple[str, ...]:
        return tuple(self.tiers.dlq_topic(src) for src in self.topics)

"""A worker's settings: one frozen, validated value (not thirty constructor arguments).

Everything that can be wrong is reported here, before any record is fetched, with the setting's
name in the message.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, Literal

from kworkers.clock import Seconds
from kworkers.consumer.batching import BatchPolicy
from kworkers.consumer.breaker import BreakerPolicy
from kworkers.consumer.commit import CommitPolicy
from kworkers.consumer.settings import LoopSettings, Ordering
from kworkers.errors import ConfigError
from kworkers.kafka.settings import (
    DEFAULT_BOOTSTRAP,
    ClientSettings,
    Prop,
    consumer_settings,
    is_security_key,
    owned_in,
)
from kworkers.memory import DEFAULT_BROKERS, Bytes, FetchSizes, MemoryBound
from kworkers.pace.limit import RateLimit
from kworkers.retry_tiers.policy import RetryPolicy
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.topic_names import is_derived, retry_group

#: where sync handlers run: a thread pool (the default: a handler never blocks the poll loop), or
#: the poll thread itself (opt-in, for fast handlers: no hand-over between threads)
Execution = Literal["threads", "inline"]
GroupProtocol = Literal["classic", "consumer"]
#: "partition": a consumer group (order per partition or key; members up to the partitions);
#: "share": a share group (KIP-932; no order, members beyond the partitions; docs/SHARE_GROUPS.md)
Mode = Literal["partition", "share"]
#: what a record's Kafka outputs and hand-offs get: "at_least_once" (acknowledged before the
#: record completes; a crash in between sends them again) or "exactly_once" (committed in one
#: Kafka transaction with the record's offset; docs/RELIABILITY.md)
Guarantee = Literal["at_least_once", "exactly_once"]

# Not client settings under KIP-848: the broker's group.consumer.* configs rule.
_CLASSIC_ONLY_KEYS = frozenset({
    "partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms",
})



def _type_ok(value: object, tp: Any) -> str | None:
    """None when ``value`` is of the annotated type ``tp``, else what was expected (the
    settings' own kinds: a whole number, seconds, text, a choice, a policy)."""
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        whys = [_type_ok(value, a) for a in inner]
        return None if None in whys else " or ".join(w for w in whys if w) + (
            " or None" if type(None) in args else "")
    if origin is Literal:
        return None if value in args else " or ".join(repr(a) for a in args)
    if origin is collections.abc.Mapping:
        return None if isinstance(value, Mapping) else "a mapping of librdkafka properties"
    if origin is tuple:
        return None if isinstance(value, tuple) else "a tuple"
    if tp is str:
        return None if isinstance(value, str) else "text"
    if tp is bool:
        return None if isinstance(value, bool) else "true or false"
    if tp is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else (
            "a whole number")
    if tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(
            value)
        return None if ok else "a number of seconds"
    if isinstance(tp, type):
        return None if isinstance(value, tp) else f"a {tp.__name__}"
    return None


def _check_types(cfg: WorkerConfig) -> None:
    """Every field of the type it is annotated with, before any rule compares it: a value of
    the wrong type from code (``concurrency="8"``) is one line naming the setting, not a
    ``TypeError`` from deep inside a check."""
    hints = typing.get_type_hints(WorkerConfig, include_extras=True)
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        want = _type_ok(value, hints[f.name])
        if want is not None:
            raise ConfigError(f"{f.name}: {want}, got {value!r}")


#: the engine's own defaults: every loop setting below defaults to what the loop does alone
_LOOP = LoopSettings()


@dataclass(frozen=True)
class WorkerConfig:
    topics: tuple[str, ...]
    group_id: str
    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    mode: Mode = "partition"
    ordering: Ordering = "partition"
    #: handler executions at once: threads for sync handlers, tasks for async ones
    concurrency: int = _LOOP.concurrency
    execution: Execution = "threads"
    max_in_flight: int = _LOOP.max_in_flight
    max_in_flight_per_partition: int = _LOOP.max_in_flight_per_partition
    #: bytes of records fetched and not yet completed, per loop (keys, values, headers and
    #: what each record costs beyond them: ``kworkers.memory``); librdkafka's read-ahead is
    #: sized from it, and the worker's worst-case memory follows (``memory_bound``)
    max_in_flight_bytes: Bytes = _LOOP.max_in_flight_bytes
    #: per-message deadline in seconds (None: no deadline); a heartbeat extends it
    message_timeout: Seconds | None = None
    commit: CommitPolicy = field(default_factory=CommitPolicy)
    group_protocol: GroupProtocol = "classic"
    #: retry tiers and DLQ: failed attempts never block the partition
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    tiers: TierLadder = field(default_factory=TierLadder)
    jitter_seed: int | None = None
    #: how long in-flight work of a revoked partition may take before its state is dropped
    revoke_timeout: Seconds = _LOOP.revoke_timeout
    #: how long SIGTERM waits for in-flight work before committing and leaving
    drain_timeout: Seconds = _LOOP.drain_timeout
    #: records a retry-tier consumer holds in its timer heap, split into its partitions'
    #: shares (see ``consumer/backpressure.py`` for the bound)
    delay_buffer: int = _LOOP.delay_buffer
    consume_batch: int = _LOOP.consume_batch
    #: failed attempts handed off and not yet acknowledged by the broker, per loop; more and
    #: the lanes wait (every one of them holds its offset's commit until acknowledged)
    handoff_limit: int = _LOOP.handoff_limit
    #: a circuit breaker that stops starting records while a dependency is down (None: off)
    breaker: BreakerPolicy | None = None
    #: how fast records may start, for the pool or per process (None: as fast as they go;
    #: ``kworkers.pace``)
    rate_limit: RateLimit | None = None
    #: how a batch handler's batches are cut (unused by single-record handlers)
    batch: BatchPolicy = field(default_factory=BatchPolicy)
    #: create missing retry tier and DLQ topics at start (sized like their source topic) when
    #: the cluster lets the worker; off: they must exist (``kworkers topics create``)
    auto_create_topics: bool = True
    #: an assigned partition with lag and nothing running or holding it that makes no progress
    #: this long is stalled: /readyz 503, and /healthz 503 (the worker stops) after three
    #: times as long (None: two deadlines, ten commit intervals, at least 60 s)
    stall_timeout: Seconds | None = None
    #: stop starting records and committing once the group coordinator was silent for the
    #: session timeout less ``fence_margin`` (``kworkers.consumer.fencing``); off: a member cut
    #: off from its group goes on running records its partitions' next owner runs too
    self_fencing: bool = _LOOP.self_fencing
    #: how long before the session would expire the member fences itself (None: a fifth of
    #: the session, at least 1 s; it must stay below the session timeout)
    fence_margin: Seconds | None = _LOOP.fence_margin
    guarantee: Guarantee = "at_least_once"
    #: exactly once: how long the broker keeps a transaction open without word from its
    #: producer (a worker killed mid-transaction holds its records' read_committed readers
    #: and its partitions' next owner this long at most)
    transaction_timeout: Seconds = 10.0
    #: exactly once: a stable name for this worker instance (a StatefulSet pod's name), from
    #: which its transactional ids derive, so a restarted instance fences its earlier
    #: incarnation and ends the transaction it left open at once (None: unique per process)
    transactional_id: str | None = None
    #: librdkafka properties of every client the worker makes (its consumers, hand-off
    #: producer and admin client): security.*, sasl.*, ssl.* and any shared override
    client_config: Mapping[str, Prop] = field(default_factory=dict, repr=False)
    #: librdkafka properties of the consumers only, and of the hand-off producer only
    consumer_config: Mapping[str, Prop] = field(default_factory=dict)
    producer_config: Mapping[str, Prop] = field(default_factory=dict)

    def __post_init__(self) -> None:
        raw: object = self.topics
        if not isinstance(raw, str | list | tuple):
            raise ConfigError(f"topics: need at least one non-empty topic name, got {raw!r}")
        topics = (raw,) if isinstance(raw, str) else tuple(raw)
        object.__setattr__(self, "topics", topics)
        if not topics or any(not t or not isinstance(t, str) for t in topics):
            raise ConfigError(f"topics: need at least one non-empty topic name, got {topics!r}")
        _check_types(self)
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
        if self.guarantee not in ("at_least_once", "exactly_once"):
            raise ConfigError(f"guarantee: 'at_least_once' or 'exactly_once', got "
                              f"{self.guarantee!r}")
        if self.guarantee == "exactly_once" and self.mode == "share":
            raise ConfigError("guarantee: a share group has no offsets to commit in a "
                              "transaction, so share mode is at least once; use "
                              "mode='partition' for exactly_once")
        if not self.transaction_timeout > 0:
            raise ConfigError(f"transaction_timeout: must be > 0 s, got "
                              f"{self.transaction_timeout!r}")
        if self.transactional_id is not None and not (
                isinstance(self.transactional_id, str) and self.transactional_id.strip()):
            raise ConfigError(f"transactional_id: a non-empty name or None, got "
                              f"{self.transactional_id!r}")
        if self.group_protocol not in ("classic", "consumer"):
            raise ConfigError(
                f"group_protocol: 'classic' or 'consumer', got {self.group_protocol!r}")
        for name in ("concurrency", "max_in_flight", "max_in_flight_per_partition",
                     "max_in_flight_bytes", "delay_buffer", "consume_batch", "handoff_limit"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}: must be a whole number >= 1, got {value!r}")
        if self.message_timeout is not None and self.message_timeout <= 0:
            raise ConfigError(f"message_timeout: must be > 0 s or None, got {self.message_timeout}")
        for name in ("revoke_timeout", "drain_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be > 0 s")
        if self.fence_margin is not None and not self.fence_margin > 0:
            raise ConfigError(f"fence_margin: must be > 0 s (and below the session timeout) "
                              f"or None, got {self.fence_margin!r}")
        if self.stall_timeout is not None and not self.stall_timeout > 0:
            raise ConfigError(f"stall_timeout: must be > 0 s or None, got {self.stall_timeout!r}")
        if self.breaker is not None and not isinstance(self.breaker, BreakerPolicy):
            raise ConfigError(f"breaker: a BreakerPolicy or None, got {self.breaker!r}")
        if self.rate_limit is not None:
            if not isinstance(self.rate_limit, RateLimit):
                raise ConfigError(f"rate_limit: a RateLimit or None, got {self.rate_limit!r}")
            if self.execution == "inline":
                raise ConfigError("execution='inline' runs handlers on the poll thread, where "
                                  "nothing may wait for a token: rate_limit needs 'threads'")
        if not isinstance(self.batch, BatchPolicy):
            raise ConfigError(f"batch: a BatchPolicy, got {self.batch!r}")
        for name in ("consumer_config", "producer_config"):
            owned = owned_in(getattr(self, name))
            if owned:
                raise ConfigError(f"{name}: {owned} are set by kworkers itself")
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

    @cached_property
    def loop(self) -> LoopSettings:
        """What the poll loops need of these settings (the engine reads nothing else)."""
        return LoopSettings(
            ordering=self.ordering, concurrency=self.concurrency,
            consume_batch=self.consume_batch, max_in_flight=self.max_in_flight,
            max_in_flight_per_partition=self.max_in_flight_per_partition,
            max_in_flight_bytes=self.max_in_flight_bytes,
            delay_buffer=self.delay_buffer, handoff_limit=self.handoff_limit,
            commit=self.commit, message_timeout=self.message_timeout,
            revoke_timeout=self.revoke_timeout, drain_timeout=self.drain_timeout,
            stall_timeout=self.stall_timeout, self_fencing=self.self_fencing,
            fence_margin=self.fence_margin)

    def consumer_properties(self, group: str) -> dict[str, Prop]:
        """The librdkafka configuration of this worker's consumer of ``group`` (the fetch
        sizes chosen with ``max_in_flight_bytes`` unless ``consumer_config`` sets them)."""
        return consumer_settings(self.client, group, self.group_protocol, self.consumer_config,
                                 in_flight_bytes=self.max_in_flight_bytes)

    def memory_bound(self, brokers: int = DEFAULT_BROKERS) -> MemoryBound:
        """The worst-case memory of one worker process (``kworkers.memory``), with the fetch
        sizes its consumers really get and ``brokers`` brokers to fetch from."""
        props = self.consumer_properties(self.group_id)
        fetch = FetchSizes(int(props["queued.max.messages.kbytes"]),
                           int(props["fetch.max.bytes"]), int(props["max.partition.fetch.bytes"]))
        loop = self.loop
        return MemoryBound(loop.max_in_flight_bytes, loop.hand_off_bytes(), fetch, brokers)

    def leave_bound(self) -> float:
        """The longest a graceful stop takes (``LoopSettings.leave_bound``): what the rendered
        Deployment's grace period follows."""
        return self.loop.leave_bound()

    @property
    def retry_group_id(self) -> str:
        """Tier topics have a group of their own, so waiting retries never count as main lag."""
        return retry_group(self.group_id)

    def tier_topics(self) -> tuple[str, ...]:
        return tuple(t.topic for src in self.topics for t in self.tiers.tiers(src))

    def dlq_topics(self) -> tuple[str, ...]:
        return tuple(self.tiers.dlq_topic(src) for src in self.topics)

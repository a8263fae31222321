"""``Worker``: the public face of kworkers, what a user registers handlers on and runs.

A worker consumes its source topics and runs the registered handler for each record; failed
attempts go through retry tiers to a DLQ. This module is the API a user reads: the settings
(``WorkerConfig``, every one of them also a keyword argument here), the handler decorators,
``run`` and ``stop``, readiness and health. How the parts are put together is
``kworkers.wiring``'s; the topic pre-flight is ``kworkers.preflight``'s.

Code-only arguments (no environment variable or ``kworkers.toml`` key sets them, because
they are objects, not values): ``metrics``, ``clock``, ``jitter``, ``sender``, ``consumer``,
``transactions`` (an exactly-once loop's transactional producer, by group: a test's double),
``invoke``, ``idempotency``, ``codec``; and ``lease_s`` (the idempotency store's lease), which
goes with the store the code builds; ``require_ids`` (refuse records without activity ids,
``MissingActivityIds``, instead of keying them by where they were first read:
``kworkers.record_key``), which goes with the producers the code is written for; the
deserializers and serializers (``value_serializer`` / ``key_serializer`` turn what a handler
gives ``activity.produce`` into bytes); ``rate_store`` (where a pool-wide ``rate_limit``
keeps its bucket, when not in the ``idempotency`` store) and ``rate_key`` (a function naming
each record's rate-limit bucket: ``kworkers.pace``); ``routes`` (destinations the code adds
for some failures, a parking topic for one, asked before the retry policy:
``kworkers.retry_tiers.destinations``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar, overload

from kworkers import preflight
from kworkers.activity import ActivityInvoker
from kworkers.clock import Clock, SystemClock
from kworkers.config import WorkerConfig
from kworkers.consumer.batching import BatchPolicy
from kworkers.consumer.ports import Handler, Invoker, Sender, TransactionPort
from kworkers.consumer.tier_gate import RecordCheck
from kworkers.envelope.envelope import EnvelopeCodec
from kworkers.errors import ConfigError, WorkerFailed
from kworkers.idempotency.capabilities import is_sql
from kworkers.idempotency.outbox import Outbox
from kworkers.idempotency.relay import OutboxRelay
from kworkers.idempotency.store import IdempotencyStore
from kworkers.kafka import serialization
from kworkers.memory import cgroup_limit, over_limit
from kworkers.message import Message
from kworkers.metrics import Metrics
from kworkers.pace import BucketStore, buckets_for
from kworkers.payloads.decode import DecodeBackoff, RecordDecoder
from kworkers.payloads.serde import Deserializer, Serializer, check_callable
from kworkers.retry_tiers.destinations import Route
from kworkers.retry_tiers.policy import JitterSource, SeededJitter
from kworkers.supervision import Fault, Supervisor
from kworkers.topic_plan import TopicSpec
from kworkers.wiring import Assembly, ConsumerFactory, Loop, Parts

#: ``Worker.around_run``: a context manager made for the worker that runs
RunHook = Callable[["Worker"], AbstractContextManager[object]]

H = TypeVar("H", bound=Callable[..., Any])

__all__ = ["ConsumerFactory", "Loop", "Worker"]

log = logging.getLogger("kworkers")


class Worker:
    """Consumes ``topics`` as ``group_id`` and runs the registered handler for each record.

    Returning normally from the handler means the work is durable; raising hands the record to
    a retry tier or the DLQ (see ``kworkers.retry_tiers``). Settings are those of
    ``WorkerConfig``.
    """

    def __init__(
        self,
        topics: list[str] | tuple[str, ...] | str | None = None,
        group_id: str | None = None,
        bootstrap_servers: str | None = None,
        *,
        config: WorkerConfig | None = None,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
        jitter: JitterSource | None = None,
        sender: Sender | None = None,
        consumer: ConsumerFactory | None = None,
        transactions: Callable[[str], TransactionPort] | None = None,
        invoke: Invoker | None = None,
        idempotency: IdempotencyStore | None = None,
        codec: EnvelopeCodec | None = None,
        lease_s: float = 30.0,
        require_ids: bool = False,
        value_deserializer: Deserializer | None = None,
        key_deserializer: Deserializer | None = None,
        decode_backoff: DecodeBackoff | None = None,
        value_serializer: Serializer | None = None,
        key_serializer: Serializer | None = None,
        rate_store: BucketStore | None = None,
        rate_key: Callable[[Message], str | None] | None = None,
        hold: RecordCheck | None = None,
        outbox: Outbox | None = None,
        routes: Sequence[Route] = (),
        **settings: Any,
    ) -> None:
        if config is None:
            if topics is None or group_id is None:
                raise ConfigError("Worker needs topics and group_id (or a WorkerConfig)")
            kw: dict[str, Any] = dict(settings)
            if bootstrap_servers is not None:
                kw["bootstrap_servers"] = bootstrap_servers
            if isinstance(topics, str):
                topics = (topics,)
            config = WorkerConfig(topics=tuple(topics), group_id=group_id, **kw)
        elif topics is not None or group_id is not None or settings:
            raise ConfigError("pass either a WorkerConfig or settings, not both")
        self.config = config
        self.metrics = metrics or Metrics()
        self.clock = clock or SystemClock()
        self.jitter = jitter or SeededJitter(config.jitter_seed)
        self._sender = sender
        self._consumer = consumer
        self._transactions = transactions
        self._invoke: Invoker = invoke or ActivityInvoker(idempotency, codec, lease_s,
                                                          self.clock, require_ids=require_ids)
        if value_serializer is not None or key_serializer is not None:
            check_callable(value_serializer, "value_serializer")
            check_callable(key_serializer, "key_serializer")
            if not isinstance(self._invoke, ActivityInvoker):
                raise ConfigError("value_serializer / key_serializer serve activity.produce, "
                                  "which reads them from kworkers' own invoker: leave invoke "
                                  "unset")
            self._invoke.serializers = (value_serializer, key_serializer)
        self._handler: Handler | None = None
        self._batch = False
        self._decoder: RecordDecoder | None = None
        #: the code's deserializers and backoff (a ``with_config`` worker decodes with them)
        self._decoding: tuple[Deserializer | None, Deserializer | None,
                              DecodeBackoff | None] = (None, None, None)
        if value_deserializer is not None or key_deserializer is not None:
            if codec is not None and value_deserializer is not None:
                raise ConfigError("codec and value_deserializer both decode the value: give one")
            if config.execution == "inline":
                raise ConfigError("execution='inline' runs on the poll thread, where nothing may "
                                  "wait for a schema registry: deserializers need 'threads'")
            self._decoding = (value_deserializer, key_deserializer, decode_backoff)
            self._decoder = self._decoder_for(config.group_id)
        self._idempotency = idempotency
        self._rate_store = rate_store
        self._rate_key = rate_key
        #: the source records wait in a timer heap until due (``kworkers.schedule``'s rungs)
        self._hold = hold
        #: the code's own destinations (``retry_tiers.destinations.Route``)
        self._routes = tuple(routes)
        if rate_key is not None and (config.rate_limit is None or config.rate_limit.per != "all"):
            raise ConfigError("rate_key names each record's bucket: it needs a rate_limit with "
                              "per='all' (the default)")
        #: the rate limit's buckets (checked now: a pool-wide limit needs a shared store)
        self._buckets = (buckets_for(config.rate_limit, self.clock, rate_store, idempotency)
                         if config.rate_limit is not None else None)
        self._loops: list[Loop] = []
        self._run_hooks: list[RunHook] = []
        #: the handler's transactional outbox, relayed while the worker runs (``OutboxRelay``)
        self.outbox = outbox
        if outbox is not None:
            if is_sql(idempotency) and outbox.store is not idempotency:
                raise ConfigError("outbox: its rows must commit in the effect's transaction, "
                                  "so give Outbox(store) the worker's idempotency store")
            self.around_run(OutboxRelay(outbox))
        self._stopping = threading.Event()
        self._hard_stop = threading.Event()
        self._started = threading.Event()
        #: why the worker is unhealthy, if it is (``/healthz``; ``run`` then raises)
        self.supervisor = Supervisor()
        self.supervisor.on_fault = self._on_fault

    # ------------------------------------------------------------------ API

    def handler(self, fn: H) -> H:
        """Registers the handler (a plain or an ``async def`` function of one ``Message``)."""
        if self._handler is not None:
            raise ConfigError("a worker has one handler; route inside it by msg.topic")
        self._handler = fn
        return fn

    @overload
    def batch_handler(self, fn: H, /) -> H: ...

    @overload
    def batch_handler(self, fn: None = None, /, *, max_size: int | None = None,
                      max_wait_s: float | None = None) -> Callable[[H], H]: ...

    def batch_handler(self, fn: H | None = None, /, *, max_size: int | None = None,
                      max_wait_s: float | None = None) -> H | Callable[[H], H]:
        """Registers a batch handler: a plain or ``async def`` function of a ``list[Message]``
        (at most ``max_size`` records of one partition, in order; see
        ``kworkers.consumer.batching``).

        Returning means every record of the batch is durable. Raise ``BatchError({msg: exc})``
        to fail only some records (they go to the tiers or the DLQ, the rest are done); any
        other exception fails the whole batch. Each record keeps its own key
        (``activity.key_of(msg)``); the deadline (``message_timeout``) applies per batch.
        """
        def register(f: H) -> H:
            if self._handler is not None:
                raise ConfigError("a worker has one handler; route inside it by msg.topic")
            old = self.config.batch
            policy = BatchPolicy(old.max_size if max_size is None else max_size,
                                 old.max_wait_s if max_wait_s is None else max_wait_s)
            self.config = dataclasses.replace(self.config, batch=policy)
            self._handler = f
            self._batch = True
            return f

        return register(fn) if fn is not None else register

    def with_config(self, config: WorkerConfig) -> Worker:
        """A worker like this one under another config: same handler, metrics, clock, invoker
        and sender (how ``kworkers run`` applies flags, env and TOML to a user's worker)."""
        if self._handler is None:
            raise ConfigError("the worker has no handler: decorate a function with @worker.handler")
        if config == self.config:
            return self
        same_seed = config.jitter_seed == self.config.jitter_seed
        new = Worker(config=config, metrics=self.metrics, clock=self.clock,
                     jitter=self.jitter if same_seed else None, sender=self._sender,
                     consumer=self._consumer, transactions=self._transactions,
                     invoke=self._invoke, idempotency=self._idempotency,
                     rate_store=self._rate_store,
                     rate_key=self._rate_key if config.rate_limit is not None else None,
                     hold=self._hold, routes=self._routes)
        if self._decoder is not None:  # the code's deserializers (no setting changes them),
            # their series under the group that runs (``kworkers run --group``), not the code's
            new._decoding = self._decoding
            if config.group_id != self.config.group_id:
                self._forget_decoder_series(self.config.group_id)
                new._decoder = new._decoder_for(config.group_id)
            else:
                new._decoder = self._decoder
        new.outbox = self.outbox
        new._run_hooks = list(self._run_hooks)
        if self._batch:
            new.batch_handler(self._handler)
        else:
            new.handler(self._handler)
        return new

    def _decoder_for(self, group: str) -> RecordDecoder:
        """The record decoder, its failures and waits counted under ``group``."""
        value_deserializer, key_deserializer, backoff = self._decoding
        failures, waiting = self.metrics.decode_failures, self.metrics.decode_waiting
        decoder = RecordDecoder(
            value_deserializer, key_deserializer, context=serialization.context, backoff=backoff,
            on_failure=lambda field, kind: failures.labels(group, field, kind).inc(),
            on_waiting=lambda n: waiting.labels(group).set(n),
            clock=self.clock.monotonic)  # the stall watch's clock: one time for both
        waiting.labels(group).set(0)  # shown from the first scrape
        # ... and the failure counters at 0, so the first failure is an increase a rate() sees
        # (a series born at 1 has no increase)
        for field, kind in self._decode_series():
            failures.labels(group, field, kind)
        return decoder

    def _decode_series(self) -> list[tuple[str, str]]:
        value_deserializer, key_deserializer, _ = self._decoding
        return [(field, kind)
                for field, given in (("value", value_deserializer), ("key", key_deserializer))
                if given is not None for kind in ("permanent", "transient")]

    def _forget_decoder_series(self, group: str) -> None:
        """The code's group's decode series, made at construction: the group that runs is
        another, and a series of a group nobody runs would stay on every scrape."""
        with contextlib.suppress(KeyError):
            self.metrics.decode_waiting.remove(group)
        for field, kind in self._decode_series():
            with contextlib.suppress(KeyError):
                self.metrics.decode_failures.remove(group, field, kind)

    def around_run(self, hook: RunHook) -> None:
        """Run ``hook(worker)``, a context manager, around ``run``: entered once the topics are
        checked and before the loops start, exited after they stopped (also on failure).
        ``worker`` is the worker that runs, so the hook sees its *effective* config (what
        ``kworkers run`` flags and environment made of it: ``with_config`` keeps the hooks).
        How a component that lives beside the loops starts and stops with them under any
        launcher (the workflow engine's outbox relay). Registering the same hook twice is one."""
        if hook not in self._run_hooks:
            self._run_hooks.append(hook)

    @property
    def loops(self) -> list[Loop]:
        """The main loop's processor, then the retry loop's (empty before ``run``)."""
        return list(self._loops)

    @property
    def fault(self) -> Fault | None:
        """None while healthy; else which part failed and why (the worker is stopping)."""
        return self.supervisor.fault

    @property
    def ready(self) -> bool:
        """Consuming: every loop has polled and nothing is degraded (a stalled partition)."""
        return self.unready_reason is None

    @property
    def unready_reason(self) -> str | None:
        """Why ``/readyz`` answers 503, or None when it answers 200."""
        if not self._loops or not all(loop.ready.is_set() for loop in self._loops):
            return "not consuming yet"
        degraded = self.supervisor.degraded
        if degraded:
            return "; ".join(f"{part}: {why}" for part, why in sorted(degraded.items()))
        return None

    def stop(self) -> None:
        """Graceful stop: stop fetching, drain in-flight work, commit, leave the group."""
        self._stopping.set()
        for loop in self._loops:
            loop.stop()

    def topic_specs(self, partitions: int | None = None) -> list[TopicSpec]:
        """The tier and DLQ topics this worker needs, sized like their source topics."""
        return preflight.topic_specs(self.config, partitions)

    def create_topics(self, partitions: int | None = None) -> list[str]:
        return preflight.create_topics(self.config, partitions)

    def check_topics(self) -> None:
        """``ConfigError`` unless every topic the worker reads or writes exists."""
        preflight.check_topics(self.config)

    def prepare_topics(self) -> list[str]:
        """``run``'s pre-flight (``kworkers.preflight.prepare_topics``): creates the missing
        tier and DLQ topics where the cluster allows it, then checks every topic is there."""
        return preflight.prepare_topics(self.config)

    def run(self, install_signals: bool = True) -> None:
        """Blocks until SIGTERM/SIGINT or ``stop()``; returns after a clean leave.

        Raises ``WorkerFailed`` when a part of the worker failed (a thread died, a runner
        crashed or hung, dead letters cannot be written): it stopped, committing finished work
        only, so that a restart moves its partitions to a member that works.
        """
        if self._handler is None:
            raise ConfigError("no handler registered: decorate a function with @worker.handler")
        if self._consumer is None:  # an injected consumer brings its own topics
            self.prepare_topics()
        if self.config.mode == "partition":  # the formula is a consumer group's
            why = over_limit(self.config.memory_bound(), cgroup_limit())
            if why is not None:
                log.warning(why)
        assembly = Assembly(Parts(
            self.config, self._handler, self._batch, self._invoke, self.metrics, self.clock,
            self.jitter, self.supervisor, self._hard_stop, self._sender, self._consumer,
            self._decoder, self._transactions, self._buckets, self._rate_key,
            self._hold, self._routes))
        self._loops = assembly.loops
        if self._decoder is not None:  # this run's readiness names a registry outage
            self._decoder.on_outage = self._registry_outage
            # its dead letters' topic id (a consumer of a test's own has no cluster behind it)
            self._decoder.on_condemned = assembly.keys.origin if self._consumer is None else None
        with contextlib.ExitStack() as hooks:
            for hook in self._run_hooks:
                hooks.enter_context(hook(self))
            assembly.run(self._stopping, self.stop, install_signals)
        if self.supervisor.fault is not None:
            raise WorkerFailed(f"worker {self.config.group_id} stopped: {self.supervisor.fault}")

    def _registry_outage(self, why: str | None) -> None:
        if why is None:
            self.supervisor.recover("schema registry")
        else:
            self.supervisor.degrade("schema registry", why)

    def _on_fault(self, fault: Fault) -> None:
        self.metrics.worker_healthy.set(0)
        self.stop()

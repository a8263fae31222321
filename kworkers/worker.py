"""``Worker``: the public face of the consumer core.

A worker runs two poll loops that share one handler runtime and one hand-off producer: the main
loop on the source topics (group ``group_id``) and the retry loop on the tier topics (group
``<group_id>.retry``), so records waiting for their due time never count as the main group's
lag, which is what KEDA scales on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Callable, Collection
from queue import SimpleQueue
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast, overload

from confluent_kafka import KafkaException

from kworkers.activity import ActivityInvoker
from kworkers.admin import TopicSpec, create_topics
from kworkers.clock import Clock, SystemClock
from kworkers.config import WorkerConfig
from kworkers.consumer.batching import BatchPolicy
from kworkers.consumer.breaker import Breaker, State
from kworkers.consumer.kafka import KafkaConsumerAdapter
from kworkers.consumer.ports import Completion, ConsumerPort, Handler, Invoker
from kworkers.consumer.processor import Processor
from kworkers.consumer.runner import Runner
from kworkers.consumer.runtime import AsyncRuntime, InlineRuntime, ThreadRuntime
from kworkers.consumer.steps import Runtime
from kworkers.consumer.tier_gate import TierGate
from kworkers.envelope.envelope import EnvelopeCodec
from kworkers.errors import ConfigError, WorkerFailed, failure_type, is_non_retryable
from kworkers.idempotency.store import IdempotencyStore
from kworkers.kafka import clients
from kworkers.kafka.settings import consumer_settings, producer_settings
from kworkers.metrics import Metrics
from kworkers.retry_tiers.handoff import HandOffStep, SendErrorKind, all_transient
from kworkers.retry_tiers.policy import JitterSource, SeededJitter
from kworkers.retry_tiers.producer import KafkaSender, classify_send_error
from kworkers.retry_tiers.router import FailureRouter, Sender
from kworkers.retry_tiers.tier_record import TierRules
from kworkers.supervision import Fault, Supervisor
from kworkers.topic_plan import plan_topics, specs

if TYPE_CHECKING:
    from kworkers.share.ports import SharePort
    from kworkers.share.processor import ShareProcessor

log = logging.getLogger("kworkers.worker")
H = TypeVar("H", bound=Callable[..., Any])
#: builds the consumer of one group (the main group, then the retry group); in share mode the
#: main group's is a ``kworkers.share.ports.SharePort``
ConsumerFactory = Callable[[str], "ConsumerPort | SharePort"]
#: a poll loop: the partitioned ``Processor``, or the share group's ``ShareProcessor``
Loop: TypeAlias = "Processor | ShareProcessor"


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
        invoke: Invoker | None = None,
        idempotency: IdempotencyStore | None = None,
        codec: EnvelopeCodec | None = None,
        lease_s: float = 30.0,
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
        self._invoke: Invoker = invoke or ActivityInvoker(idempotency, codec, lease_s,
                                                          self.clock)
        self._handler: Handler | None = None
        self._batch = False
        self._loops: list[Loop] = []
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
                     consumer=self._consumer, invoke=self._invoke)
        if self._batch:
            new.batch_handler(self._handler)
        else:
            new.handler(self._handler)
        return new

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
        return bool(self._loops) and all(loop.ready.is_set() for loop in self._loops)

    def stop(self) -> None:
        """Graceful stop: stop fetching, drain in-flight work, commit, leave the group."""
        self._stopping.set()
        for loop in self._loops:
            loop.stop()

    def topic_specs(self, partitions: int | None = None) -> list[TopicSpec]:
        """The tier and DLQ topics this worker needs, sized like their source topics."""
        cfg = self.config
        have = clients.list_topics(cfg.client)
        specs = []
        for src in cfg.topics:
            n = partitions or have.get(src, 6)
            specs += [TopicSpec(t.topic, n) for t in cfg.tiers.tiers(src)]
            specs.append(TopicSpec(cfg.tiers.dlq_topic(src), n))
        return specs

    def create_topics(self, partitions: int | None = None) -> list[str]:
        return create_topics(clients.admin(self.config.client), self.topic_specs(partitions))

    def check_topics(self) -> None:
        """``ConfigError`` unless every topic the worker reads or writes exists."""
        self._require_topics(clients.list_topics(self.config.client))

    def prepare_topics(self) -> list[str]:
        """``run``'s pre-flight: with ``auto_create_topics``, creates the missing retry tier
        and DLQ topics of the source topics that exist, sized like them (as ``kworkers topics
        create`` would), then checks every topic is there; returns the topics it created.

        A cluster that refuses (ACLs, a create policy) leaves the topics missing, and the
        error says so; a missing source topic is never created (its partition count is a
        decision, not a default).
        """
        cfg = self.config
        have = clients.list_topics(cfg.client)  # KafkaUnreachable: one line, no secret
        sources = [t for t in cfg.topics if t in have]
        todo = specs(plan_topics(have, sources, cfg.tiers, None)) if sources else []
        if not (cfg.auto_create_topics and todo):
            self._require_topics(have)
            return []
        try:
            created = create_topics(clients.admin(cfg.client), todo)
        except KafkaException as exc:
            self._require_topics(clients.list_topics(cfg.client),
                                 f" (creating them was refused: {clients.reason(exc)})")
            return []
        if created:
            log.info("created topics %s", ", ".join(created))
        self._require_topics(clients.list_topics(cfg.client))
        return created

    def _require_topics(self, have: Collection[str], note: str = "") -> None:
        cfg = self.config
        need = [*cfg.topics, *cfg.tier_topics(), *cfg.dlq_topics()]
        missing = [t for t in need if t not in have]
        if missing:
            raise ConfigError(
                f"topics missing on {cfg.bootstrap_servers}: {', '.join(missing)}; create them "
                f"with `kworkers topics create` or Worker.create_topics(){note}")

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
        cfg = self.config
        handler = self._handler
        sup = self.supervisor
        runtime = self._runtime(handler)
        classify: Callable[[BaseException], SendErrorKind] = all_transient
        sender = self._sender
        if sender is None:
            sender = KafkaSender(producer_settings(cfg.client, cfg.producer_config))
            classify = classify_send_error
        breaker = self._breaker()
        main = self._processor(cfg.group_id, cfg.topics, handler, sender, classify, runtime,
                               breaker, tiers=False)
        tier = self._processor(cfg.retry_group_id, cfg.tier_topics(), handler, sender, classify,
                               runtime, breaker, tiers=True)
        self._loops = [main, tier]
        if self._stopping.is_set():
            for loop in self._loops:
                loop.stop()
        restore = self._install_signals() if install_signals else None
        tier_thread = threading.Thread(target=self._run_tier, args=(tier,),
                                       name="kworkers-retry-loop", daemon=True)
        tier_thread.start()
        sup.watch("kworkers-retry-loop", lambda: tier_thread.is_alive() or tier.closed.is_set())
        sup.watch("handler runtime", runtime.alive)
        if isinstance(sender, KafkaSender):
            sup.watch("kworkers-producer", sender.alive)
        self.metrics.worker_healthy.set(1)
        try:
            main.run()
        finally:
            tier.stop()
            tier_thread.join(timeout=cfg.leave_bound() + 10)
            self._hard_stop.set()  # hand-offs still retrying give up: their records redeliver
            if self._sender is None and isinstance(sender, KafkaSender):
                sender.close()
            runtime.shutdown()
            if restore is not None:
                restore()
            log.info("worker %s stopped", cfg.group_id)
        if sup.fault is not None:
            raise WorkerFailed(f"worker {cfg.group_id} stopped: {sup.fault}")

    def _runtime(self, handler: Handler) -> Runtime:
        cfg, sup = self.config, self.supervisor
        if _is_async(handler):
            if cfg.execution == "inline":
                raise ConfigError("execution='inline' runs sync handlers on the poll thread; "
                                  "an async handler runs on its event loop (use 'threads')")
            return AsyncRuntime(cfg.concurrency, sup, self.clock)
        if cfg.execution == "inline":
            return InlineRuntime(sup, self.clock, cfg.message_timeout, cfg.stall_bound())
        return ThreadRuntime(cfg.concurrency, sup, self.clock)

    def _run_tier(self, tier: Processor) -> None:
        try:
            tier.run()
        except BaseException as exc:
            log.error("the retry loop crashed", exc_info=exc)
            self.supervisor.fail("kworkers-retry-loop", f"{type(exc).__name__}: {exc}")

    def _on_fault(self, fault: Fault) -> None:
        self.metrics.worker_healthy.set(0)
        self.stop()

    # ------------------------------------------------------------------ internals

    def _breaker(self) -> Breaker | None:
        policy = self.config.breaker
        if policy is None:
            return None
        group = self.config.group_id
        state = self.metrics.breaker_state.labels(group)
        level = {State.CLOSED: 0, State.HALF_OPEN: 1, State.OPEN: 2}

        def moved(old: State, new: State, why: str) -> None:
            state.set(level[new])
            self.metrics.breaker_transitions.labels(group, new.value).inc()
            log.warning("%s: circuit breaker %s -> %s (%s)", group, old.value, new.value, why)

        state.set(0)
        return Breaker(policy, self.clock, moved)

    def _retryable(self, exc: BaseException) -> bool:
        """Whether a failure says something about the dependency (the breaker counts it)."""
        return not (is_non_retryable(exc)
                    or failure_type(exc) in self.config.retry.normalized().non_retryable)

    def _processor(self, group: str, topics: tuple[str, ...], handler: Handler, sender: Sender,
                   classify: Callable[[BaseException], SendErrorKind], runtime: Runtime,
                   breaker: Breaker | None, tiers: bool) -> Loop:
        cfg = self.config

        def runner(consumer_group: str, timeout: float | None, invoke: Invoker) -> Runner:
            router = FailureRouter(cfg.retry, cfg.tiers, cfg.group_id, self.jitter, self.clock)
            done: SimpleQueue[Completion] = SimpleQueue()
            hand_offs = HandOffStep(router, sender, self.metrics, consumer_group, done,
                                    self.clock, self._hard_stop, self.supervisor, classify,
                                    cfg.handoff_limit)
            return Runner(handler, invoke, hand_offs, runtime, self.clock, timeout, done,
                          breaker, self._retryable, cfg.batch if self._batch else None)

        made = self._consumer(group) if self._consumer is not None else None
        if cfg.mode == "share" and not tiers:
            from kworkers.share.wiring import kafka_share_port, share_loop

            port = cast("SharePort", made) if made is not None else kafka_share_port(cfg)
            return share_loop(cfg, port, lambda t, inv: runner(port.group, t, inv),
                              self._invoke, runtime.is_async, self.metrics, self.clock,
                              self.supervisor)
        consumer = (cast(ConsumerPort, made) if made is not None else
                    KafkaConsumerAdapter(consumer_settings(
                        cfg.client, group, cfg.group_protocol, cfg.consumer_config)))
        gate = None
        if tiers:
            # the rules every router of this worker checks tier records by, too
            rules = TierRules.of(cfg.retry, cfg.tiers, cfg.group_id)
            gate = TierGate(cfg.delay_buffer, cfg.consume_batch, rules,
                            self.metrics.retry_lateness.labels(consumer.group), self.clock)
        return Processor(cfg, consumer, topics,
                         runner(consumer.group, cfg.message_timeout, self._invoke),
                         self.metrics, self.clock, self.supervisor, gate)

    def _install_signals(self) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            if self._stopping.is_set():
                log.warning("second signal: exiting at once")
                os._exit(128 + signum)
            log.info("signal %d: draining (a second signal exits at once)", signum)
            self.stop()

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for s, h in old.items():
                signal.signal(s, h)

        return restore


def _is_async(fn: Callable[..., Any]) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)

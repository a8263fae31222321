"""How a worker's parts are put together: the one module that knows every part.

A worker runs two poll loops that share one handler runtime and one hand-off producer: the main
loop on the source topics (group ``group_id``; in share mode a share group) and the retry loop
on the tier topics (group ``<group_id>.retry``), so records waiting for their due time never
count as the main group's lag, which is what KEDA scales on.

``Worker`` (``kworkers.worker``) is the public face: what a user registers and sets. Here its
settings become a runtime, a breaker, a hand-off producer, routers and hand-off steps, tier
gates and processors, in both modes alike; the engine (``kworkers.consumer``) is handed ports
and a ``LoopSettings`` value, never the worker's configuration. ``Assembly.run`` owns the order
of start and shutdown.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from queue import SimpleQueue
from types import FrameType
from typing import TYPE_CHECKING, TypeAlias, cast

from kworkers.activity import keyed
from kworkers.clock import Clock
from kworkers.config import WorkerConfig
from kworkers.consumer.breaker import Breaker, State
from kworkers.consumer.buffered import BufferedHandOffs
from kworkers.consumer.fencing import Membership, default_margin
from kworkers.consumer.handoff import HandOffStep, all_transient
from kworkers.consumer.outputs import OutputBuffer
from kworkers.consumer.ports import (
    Completion,
    ConsumerPort,
    Delivered,
    Handler,
    Invoker,
    Sender,
    SendErrorKind,
    TransactionPort,
)
from kworkers.consumer.processor import Processor
from kworkers.consumer.runner import Runner
from kworkers.consumer.runtime import AsyncRuntime, InlineRuntime, ThreadRuntime
from kworkers.consumer.steps import Decoder, HandOffs, Runtime
from kworkers.consumer.tier_gate import RecordCheck, TierGate
from kworkers.errors import ConfigError
from kworkers.kafka import clients
from kworkers.kafka.admin import broker_config
from kworkers.kafka.consumer import KafkaConsumerAdapter
from kworkers.kafka.offsets import BrokerOffsets
from kworkers.kafka.producer import KafkaSender, classify_send_error
from kworkers.kafka.settings import producer_settings
from kworkers.kafka.transactions import LoopTransactions
from kworkers.message import Headers, Message
from kworkers.metrics import Metrics
from kworkers.pace.bucket import BucketStore
from kworkers.pace.pacer import Pacer
from kworkers.record_key import RecordKeys
from kworkers.retry_tiers.destinations import Route
from kworkers.retry_tiers.policy import JitterSource
from kworkers.retry_tiers.router import FailureRouter
from kworkers.retry_tiers.routing import is_retryable
from kworkers.retry_tiers.tier_record import TierRules
from kworkers.supervision import Supervisor
from kworkers.tracing import TracedInvoke

if TYPE_CHECKING:
    from kworkers.share.ports import SharePort
    from kworkers.share.processor import ShareProcessor

log = logging.getLogger("kworkers.worker")

#: builds the consumer of one group (the main group, then the retry group); in share mode the
#: main group's is a ``kworkers.share.ports.SharePort``
ConsumerFactory = Callable[[str], "ConsumerPort | SharePort"]
#: a poll loop: the partitioned ``Processor``, or the share group's ``ShareProcessor``
Loop: TypeAlias = "Processor | ShareProcessor"
#: the broker setting that decides a KIP-848 member's session, and Kafka's default for it
KIP848_SESSION = "group.consumer.session.timeout.ms"
KIP848_DEFAULT_SESSION_S = 45.0


@dataclass(frozen=True)
class Parts:
    """What a ``Worker`` brings: its settings, its handler and the seams a test may set."""

    config: WorkerConfig
    handler: Handler
    batch: bool
    invoke: Invoker
    metrics: Metrics
    clock: Clock
    jitter: JitterSource
    supervisor: Supervisor
    #: set when the worker stops for good: hand-offs still retrying give up
    hard_stop: threading.Event
    sender: Sender | None = None
    consumer: ConsumerFactory | None = None
    #: the worker's deserializers (``kworkers.payloads.decode``), when it has any
    decoder: Decoder | None = None
    #: exactly once: makes the transactional producer of one loop's group (a test's double;
    #: None: a Kafka one, ``LoopTransactions``)
    transactions: Callable[[str], TransactionPort] | None = None
    #: where the rate limit's buckets live (set whenever ``config.rate_limit`` is)
    buckets: BucketStore | None = None
    #: the rate limit's bucket name of a record (code-only), else per ``rate_limit.per``
    rate_key: Callable[[Message], str | None] | None = None
    #: the main loop's records wait in a timer heap until the due time this check admits
    #: them with (a scheduler's delay topics, ``kworkers.schedule``); None: run at once
    hold: RecordCheck | None = None
    #: the destinations the code adds (a parking topic, ...), asked before the retry policy
    routes: Sequence[Route] = ()


class Assembly:
    """One running worker's parts, built from ``Parts``, and the order they start and stop."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        cfg = parts.config
        self.runtime = runtime(cfg, parts.handler, parts.supervisor, parts.clock)
        self.classify: Callable[[BaseException], SendErrorKind] = all_transient
        self.owned_sender: KafkaSender | None = None
        self.exactly_once = cfg.guarantee == "exactly_once"
        sender = parts.sender
        if sender is None and self.exactly_once:
            sender = _no_sender  # every record goes through the loops' transactions
        elif sender is None:
            sender = self.owned_sender = KafkaSender(
                producer_settings(cfg.client, cfg.producer_config))
            self.classify = classify_send_error
        self.sender = sender
        self.breaker = breaker(cfg, parts.metrics, parts.clock)
        self.pacer = pacer(parts)
        #: the keys of records without ids, given to every handler call (``activity.keyed``)
        self.keys = RecordKeys.for_cluster(cfg.client)
        self.invoke = keyed(parts.invoke, self.keys)
        self._session_s: float | None = None
        self.main = self._main_loop()
        self.tier = self._tier_loop()

    @property
    def loops(self) -> list[Loop]:
        return [self.main, self.tier]

    # ------------------------------------------------------------------ building

    def _runner(self, group: str, timeout: float | None, invoke: Invoker) -> Runner:
        p, cfg = self.parts, self.parts.config
        router = FailureRouter(cfg.retry, cfg.tiers, cfg.group_id, p.jitter, p.clock,
                               self.keys, p.routes)
        done: SimpleQueue[Completion] = SimpleQueue()
        hand_offs: HandOffs
        if self.exactly_once and cfg.mode == "partition":
            hand_offs = BufferedHandOffs(router, OutputBuffer(), p.metrics, group, done,
                                         p.hard_stop, p.supervisor, cfg.max_in_flight, p.clock)
        else:
            hand_offs = HandOffStep(router, self.sender, p.metrics, group, done, p.clock,
                                    p.hard_stop, p.supervisor, self.classify,
                                    cfg.handoff_limit, cfg.loop.hand_off_bytes())
        return Runner(p.handler, invoke, hand_offs, self.runtime, p.clock, timeout, done,
                      self.breaker, lambda exc: is_retryable(cfg.retry, exc),
                      cfg.batch if p.batch else None, p.decoder, self.pacer)

    def _consumer(self, group: str) -> ConsumerPort | SharePort | None:
        make = self.parts.consumer
        return make(group) if make is not None else None

    def _main_loop(self) -> Loop:
        cfg = self.parts.config
        made = self._consumer(cfg.group_id)
        if cfg.mode == "share":
            port = cast("SharePort", made) if made is not None else _kafka_share_port(cfg)
            return self._share_loop(port)
        return self._processor(cfg.topics, cast(ConsumerPort | None, made), tiers=False)

    def _tier_loop(self) -> Processor:
        cfg = self.parts.config
        made = self._consumer(cfg.retry_group_id)
        return self._processor(cfg.tier_topics(), cast(ConsumerPort | None, made), tiers=True)

    def _processor(self, topics: tuple[str, ...], made: ConsumerPort | None,
                   tiers: bool) -> Processor:
        p, cfg = self.parts, self.parts.config
        group = cfg.retry_group_id if tiers else cfg.group_id
        consumer = made if made is not None else KafkaConsumerAdapter(
            cfg.consumer_properties(group))
        gate = None
        rules: RecordCheck | None = p.hold
        if tiers:
            rules = TierRules.of(cfg.retry, cfg.tiers, cfg.group_id)  # checked once, here
        if rules is not None:
            gate = TierGate(cfg.delay_buffer, rules,
                            p.metrics.retry_lateness.labels(consumer.group), p.clock)
        offsets = BrokerOffsets(cfg.client)
        return Processor(cfg.loop, consumer, topics,
                         self._runner(consumer.group, cfg.message_timeout,
                                      self._invoke_for(consumer.group)),
                         p.metrics, p.clock, p.supervisor, gate, offsets,
                         self._membership(consumer, real=made is None),
                         self._transactions(consumer.group),
                         # the lag gauge's reads at assignment: a consumer of a test's own has
                         # no broker behind it
                         lag_source=offsets if made is None else None)

    def _invoke_for(self, group: str) -> Invoker:
        """The worker's invoker; a ``TracedInvoke`` told the consumer group it runs records
        of, so each span names it (``messaging.consumer.group.name``)."""
        given = self.parts.invoke
        if isinstance(given, TracedInvoke):
            return keyed(given.in_group(group), self.keys)
        return self.invoke

    def _transactions(self, group: str) -> TransactionPort | None:
        """Exactly once: the loop's transactional producer, under an id derived from the
        worker's ``transactional_id`` (stable across restarts of one instance) or unique to
        this process."""
        p, cfg = self.parts, self.parts.config
        if not self.exactly_once:
            return None
        if p.transactions is not None:
            return p.transactions(group)
        return LoopTransactions(cfg.client, transactional_id(cfg.transactional_id, group),
                                cfg.transaction_timeout, cfg.producer_config,
                                BrokerOffsets(cfg.client))

    def _membership(self, consumer: ConsumerPort, real: bool) -> Membership | None:
        """Self-fencing for one consumer: its session timeout from the client (classic) or,
        under KIP-848, from the broker's ``group.consumer.session.timeout.ms`` (read once;
        Kafka's default 45 s when it cannot be read). None when off, or unknown (a test's
        consumer that says nothing)."""
        cfg, clock = self.parts.config, self.parts.clock
        if not cfg.self_fencing:
            return None
        session = consumer.session_timeout()
        if session is None and real and cfg.group_protocol == "consumer":
            if self._session_s is None:
                value = broker_config(clients.admin(cfg.client), KIP848_SESSION)
                self._session_s = float(value) / 1000 if value else KIP848_DEFAULT_SESSION_S
            session = self._session_s
        if session is None:
            return None
        margin = cfg.fence_margin if cfg.fence_margin is not None else default_margin(session)
        return Membership(session, margin, since=clock.monotonic())

    def _share_loop(self, port: SharePort) -> ShareProcessor:
        """The order matters: the group's start position is set before the first member
        joins, and the group's lock and delivery limit are read before any record is taken,
        because the deadline and the last-delivery rule derive from them (``ShareRules``)."""
        from kworkers.kafka.share_consumer import offset_reset_of
        from kworkers.share.gate import LockGate
        from kworkers.share.ports import RecordKey
        from kworkers.share.processor import ShareProcessor
        from kworkers.share.rules import ShareRules

        p, cfg = self.parts, self.parts.config
        port.ensure_offset_reset(offset_reset_of(cfg.consumer_config))
        group = port.group_settings()
        rules = ShareRules.of(group, cfg.message_timeout)
        log.info("share group %s: lock %.0fs, delivery limit %d, handler deadline %.1fs",
                 port.group, rules.lock_s, rules.delivery_limit, rules.deadline_s)
        if group.renew_enabled:
            log.info("share group %s allows RENEW (share.renew.acknowledge.enable) but "
                     "confluent-kafka 2.16 cannot send it: handlers stay within the lock",
                     port.group)
        held: dict[RecordKey, float] = {}
        gate = LockGate(self._invoke_for(port.group), rules, p.clock, held,
                        self.runtime.is_async)
        runner = self._runner(port.group, rules.deadline_s, gate)
        if runner.batch is not None:
            raise ConfigError("batch handlers are not supported in share mode yet: a share "
                              "group acknowledges record by record (use @worker.handler)")
        settings = dataclasses.replace(cfg.loop, message_timeout=rules.deadline_s)
        return ShareProcessor(settings, port, cfg.topics, runner, gate, rules, p.metrics,
                              p.clock, p.supervisor)

    # ------------------------------------------------------------------ running

    def run(self, stopping: threading.Event, stop: Callable[[], None],
            install_signals: bool) -> None:
        """Runs the retry loop on a thread of its own and the main loop here, until a stop;
        then stops the retry loop, lets hand-offs still retrying go, closes what it owns."""
        p, cfg, sup = self.parts, self.parts.config, self.parts.supervisor
        main, tier = self.main, self.tier
        if stopping.is_set():
            for loop in self.loops:
                loop.stop()
        restore = _install_signals(stopping, stop) if install_signals else None
        tier_thread = threading.Thread(target=self._run_tier, name="kworkers-retry-loop",
                                       daemon=True)
        tier_thread.start()
        sup.watch("kworkers-retry-loop", lambda: tier_thread.is_alive() or tier.closed.is_set())
        sup.watch("handler runtime", self.runtime.alive)
        if self.owned_sender is not None:
            sup.watch("kworkers-producer", self.owned_sender.alive)
        p.metrics.worker_healthy.set(1)
        try:
            main.run()
        finally:
            tier.stop()
            tier_thread.join(timeout=cfg.leave_bound() + 10)
            p.hard_stop.set()  # hand-offs still retrying give up: their records redeliver
            if self.owned_sender is not None:
                self.owned_sender.close()
            self.runtime.shutdown()
            if restore is not None:
                restore()
            log.info("worker %s stopped", cfg.group_id)

    def _run_tier(self) -> None:
        try:
            self.tier.run()
        except BaseException as exc:
            log.error("the retry loop crashed", exc_info=exc)
            self.parts.supervisor.fail("kworkers-retry-loop", f"{type(exc).__name__}: {exc}")


_INSTANCES = itertools.count(1)


def transactional_id(prefix: str | None, group: str) -> str:
    """``<prefix>.<group>`` when the instance has a stable name: its next incarnation fences
    this one and ends the transaction it left open at once. Otherwise unique to the process
    (host, pid, a counter): a transaction left open by a killed process is ended by the broker
    after ``transaction_timeout``."""
    if prefix is None:
        prefix = f"kworkers-{socket.gethostname()}-{os.getpid()}-{next(_INSTANCES)}"
    return f"{prefix}.{group}"


class _NoSender:
    """An exactly-once worker sends nothing outside its loops' transactions."""

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: Headers, done: Delivered) -> None:
        raise AssertionError(f"an exactly-once worker produced to {topic} outside a "
                             "transaction")


_no_sender = _NoSender()


def runtime(config: WorkerConfig, handler: Handler, supervisor: Supervisor,
            clock: Clock) -> Runtime:
    """Where handlers run: an event loop for ``async def`` ones, threads for the others, or the
    poll thread itself (``execution="inline"``)."""
    import inspect

    if inspect.iscoroutinefunction(handler):
        if config.execution == "inline":
            raise ConfigError("execution='inline' runs sync handlers on the poll thread; "
                              "an async handler runs on its event loop (use 'threads')")
        return AsyncRuntime(config.concurrency, supervisor, clock)
    if config.execution == "inline":
        return InlineRuntime(supervisor, clock, config.message_timeout,
                             config.loop.hung_call_bound(), config.loop.slow_call_bound())
    return ThreadRuntime(config.concurrency, supervisor, clock)


def breaker(config: WorkerConfig, metrics: Metrics, clock: Clock) -> Breaker | None:
    """The circuit breaker (``breaker``: off by default), its state exported and each
    transition logged."""
    policy = config.breaker
    if policy is None:
        return None
    group = config.group_id
    state = metrics.breaker_state.labels(group)
    level = {State.CLOSED: 0, State.HALF_OPEN: 1, State.OPEN: 2}

    def moved(old: State, new: State, why: str) -> None:
        state.set(level[new])
        metrics.breaker_transitions.labels(group, new.value).inc()
        log.warning("%s: circuit breaker %s -> %s (%s)", group, old.value, new.value, why)

    state.set(0)
    return Breaker(policy, clock, moved)


def pacer(parts: Parts) -> Pacer | None:
    """The rate limit (``rate_limit``: off by default), its waits and tokens exported."""
    cfg, m = parts.config, parts.metrics
    limit = cfg.rate_limit
    if limit is None:
        return None
    if parts.buckets is None:
        raise ConfigError("rate_limit is set but no bucket store was given")
    if parts.batch and (limit.per != "all" or parts.rate_key is not None):
        raise ConfigError("a batch handler takes one token per batch call: rate_limit.per "
                          "'key' and rate_key need a single-record handler")
    group = cfg.group_id
    wait, waiting = m.rate_wait.labels(group), m.rate_waiting.labels(group)
    tokens, errors = m.rate_tokens.labels(group), m.rate_store_errors.labels(group)
    waiting.set(0)
    return Pacer(limit, parts.buckets, group, parts.clock, name_of=parts.rate_key,
                 on_wait=wait.observe, on_waiting=waiting.set, on_tokens=tokens.inc,
                 on_store_error=errors.inc)


def _kafka_share_port(config: WorkerConfig) -> SharePort:
    from kworkers.kafka.share_consumer import ShareConsumerAdapter

    return ShareConsumerAdapter(config.client, config.group_id, config.consumer_config)


def _install_signals(stopping: threading.Event,
                     stop: Callable[[], None]) -> Callable[[], None] | None:
    """SIGTERM and SIGINT start a graceful stop; a second one exits at once. Only the main
    thread may install handlers; elsewhere the caller stops the worker itself."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if stopping.is_set():
            log.warning("second signal: exiting at once")
            os._exit(128 + signum)
        log.info("signal %d: draining (a second signal exits at once)", signum)
        stop()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return restore

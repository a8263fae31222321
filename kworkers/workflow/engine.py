"""``Engine``: durable workflows on the Kafka broker and the idempotency store, nothing else.

    pipeline = Workflow("pipeline")          # steps: see kworkers.workflow.definition
    engine = Engine(PostgresStore(dsn), [pipeline], topic="pipeline.activities")
    worker = engine.worker(group_id="pipeline", bootstrap_servers="kafka:9092")
    engine.create_topics(worker)
    engine.start("pipeline", "doc-42", {"url": "file:///data/doc-42.txt"})   # anywhere
    engine.run(worker)                       # every replica: consume activities, relay outbox

How the pieces fit: each activity is a record on ``topic`` keyed ``<workflow_id>/<activity_id>``
and handled by an ordinary ``Worker`` (same retry tiers, DLQ, metrics, rebalancing as any
handler). The handler (``ActivityRunner``) checkpoints a step and writes the next activity's
record into the outbox in one store transaction; the relay (one per replica, rows claimed with a
lease) produces it. So a crash anywhere between steps neither loses the hand-off nor runs a
completed step again.

Why an outbox and not a Kafka transaction: the checkpoint is rows in the store (the result, the
run's state, the step's own in-store effects), and a Kafka transaction cannot include a database
write; it would also need the consumer core's offsets inside the producer's transaction, which
kworkers' loop commits on its own schedule. The outbox puts everything that must be atomic in
one SQL transaction and leaves Kafka at-least-once, which the done-marks absorb.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kworkers.activity import ActivityInvoker
from kworkers.clock import Clock, SystemClock
from kworkers.errors import ConfigError
from kworkers.idempotency.capabilities import require_sql
from kworkers.idempotency.outbox import Outbox, blocking_send
from kworkers.idempotency.relay import Relay
from kworkers.idempotency.store import TransactionalStore
from kworkers.kafka import clients
from kworkers.kafka.admin import create_topics
from kworkers.kafka.producer import KafkaSender
from kworkers.kafka.settings import producer_settings
from kworkers.metrics import Metrics
from kworkers.topic_plan import TopicSpec
from kworkers.tracing import TracedInvoke
from kworkers.worker import Worker
from kworkers.workflow.codec import (
    DEFAULT_MAX_RESULT_BYTES,
    ActivityRecord,
    decode_json,
    encode_json,
)
from kworkers.workflow.definition import Definition, Workflow, check_name
from kworkers.workflow.errors import ResultError
from kworkers.workflow.registry import Registry
from kworkers.workflow.runner import ActivityRunner
from kworkers.workflow.state import Status, initial
from kworkers.workflow.tables import RunRow, RunTables
from kworkers.workflow.trace import start_traceparent

__all__ = ["Engine", "Started"]

log = logging.getLogger("kworkers.workflow")

MAX_WORKFLOW_ID = 200


@dataclass(frozen=True)
class Started:
    """``created`` is False when the id already named a run (then nothing was started)."""

    workflow_id: str
    workflow: str
    version: str
    created: bool
    status: Status


class Engine:
    """Workflows of one application: their definitions, tables, topic and relay.

    ``store``: a SQL store (``SqliteStore`` or ``PostgresStore``); the engine's tables
    (``<tables>_runs``, ``_steps``, ``_outbox``) live in its database. ``topic``: where every
    activity of these workflows is produced. ``max_result_bytes``: the size limit of a step's
    result (and of a run's input), as JSON.
    """

    def __init__(self, store: TransactionalStore[Any], workflows: Iterable[Workflow | Definition],
                 *, topic: str, tables: str = "kworkers_wf",
                 max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES, clock: Clock | None = None,
                 metrics: Metrics | None = None, relay_idle_s: float = 0.5,
                 outbox_lease_s: float = 60.0) -> None:
        store = require_sql(store, "workflows", "a step's checkpoint and its next activity "
                            "commit in one transaction, which Redis cannot give")
        if not topic or ".retry." in topic or topic.endswith(".dlq"):
            raise ConfigError(f"topic: a source topic name, got {topic!r}")
        if not isinstance(max_result_bytes, int) or max_result_bytes < 64:
            raise ConfigError(f"max_result_bytes must be an int >= 64, got {max_result_bytes!r}")
        self.store = store
        self.topic = topic
        self.registry = Registry(workflows)
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        self.max_result_bytes = max_result_bytes
        self.relay_idle_s = relay_idle_s
        self.tables = RunTables(store, tables)
        self.tables.ensure_schema()
        self.outbox = Outbox(store, table=f"{tables}_outbox", lease_s=outbox_lease_s,
                             clock=self.clock)
        self._relay: Relay | None = None
        self._warned = False
        self.runner = ActivityRunner(self.registry, store, self.tables, self.outbox, topic,
                                     self.clock, self.metrics, max_result_bytes, self._woken)

    def _woken(self) -> None:
        """A step checkpointed: its next activity is in the outbox, wake this process's relay."""
        if self._relay is not None:
            self._relay.wake()
        elif not self._warned:
            self._warned = True
            log.warning("a workflow step was checkpointed in a process without an outbox relay; "
                        "its next activity waits for a relay elsewhere (a worker bound to the "
                        "engine runs one: Engine.worker / Engine.bind)")

    # -- starting runs -------------------------------------------------------------------------

    def start(self, workflow: str | Workflow, workflow_id: str, input: Any = None, *,
              traceparent: str | None = None) -> Started:
        """Start a run of ``workflow`` named ``workflow_id``, once.

        The run and its first activity's record commit together. Starting an id that exists
        starts nothing and returns ``created=False`` with that run's status; starting it with
        another workflow or another input is a ``ConfigError`` (an id names one run)."""
        name = workflow.name if isinstance(workflow, Workflow) else workflow
        d = self.registry.latest(name)
        _check_workflow_id(workflow_id)
        try:
            text = encode_json(input, f"input of run {workflow_id!r}", self.max_result_bytes)
        except ResultError as exc:
            raise ConfigError(str(exc)) from None
        now = self.clock.now()
        state = initial(d)
        row = RunRow(workflow_id, d.name, d.version, state, text,
                     start_traceparent(traceparent), now, now)
        with self.store.atomic() as conn:
            created = self.tables.insert_run(conn, row)
            if created:
                assert state.activity is not None
                self.runner.dispatch(conn, row, d, state.activity, row.traceparent or "")
            else:
                existing = self.tables.lock_run(conn, workflow_id, lock=False)
        if created:
            if self._relay is not None:
                self._relay.wake()
            self.metrics.workflow_runs.labels(d.name, "running").inc()
            log.info("run %s (%s %s) started", workflow_id, d.name, d.version)
            return Started(workflow_id, d.name, d.version, True, "running")
        assert existing is not None
        if existing.workflow != d.name:
            raise ConfigError(f"workflow id {workflow_id!r} is already a run of "
                              f"{existing.workflow!r}, not {d.name!r}")
        if decode_json(existing.input, "input") != decode_json(text, "input"):
            raise ConfigError(f"workflow id {workflow_id!r} already started with another input; "
                              "an id names one run (use a new id for new input)")
        return Started(workflow_id, existing.workflow, existing.version, False, existing.status)

    def signal(self, workflow_id: str, name: str, payload: Any = None) -> bool:
        """Send the signal ``name`` (a JSON ``payload``) to a run; True when a step was waiting
        for it and is now woken.

        The signal is kept in the store whenever it comes: sent before the step that waits for
        it, it is there when that step starts waiting (and wakes it at once). When the run's
        pending step waits for ``name``, its record goes into the outbox in the *same*
        transaction as the signal (the outbox pattern, as every hand-off): no signal without
        its wake-up, no wake-up without its signal (the step's deadline row is made due now,
        or, when it has left the outbox already, a new record is written). A run that ended,
        or an unknown id, is a ``ConfigError`` (nothing would ever read the signal)."""
        check_name(name, "signal name")
        _check_workflow_id(workflow_id)
        try:
            text = encode_json(payload, f"payload of signal {name!r}", self.max_result_bytes)
        except ResultError as exc:
            raise ConfigError(str(exc)) from None
        with self.store.atomic() as conn:
            row = self.tables.lock_run(conn, workflow_id)
            if row is None:
                raise ConfigError(f"no workflow run {workflow_id!r} to signal")
            if row.state.activity is None:
                raise ConfigError(f"run {workflow_id!r} is {row.status}: nothing would read "
                                  f"signal {name!r}")
            self.tables.add_signal(conn, workflow_id, name, text, self.clock.now())
            woke = row.state.signal == name and row.status != "failed"
            if woke:
                d = self.registry.resolve(row.workflow_id, row.workflow, row.version)
                assert row.state.activity is not None
                key = ActivityRecord(workflow_id, row.state.activity, d.name,
                                     d.version).key.encode("utf-8")
                if not self.outbox.due_now(conn, self.topic, key):  # its deadline row: due now
                    self.runner.dispatch(conn, row, d, row.state.activity,
                                         row.traceparent or "")
        if woke and self._relay is not None:
            self._relay.wake()
        log.info("run %s: signal %r sent%s", workflow_id, name, " (woke its step)" if woke else
                 "")
        return woke

    # -- workers -------------------------------------------------------------------------------

    def bind(self, worker: Worker) -> Worker:
        """Make ``worker`` run this engine's activities: its handler, and a run hook that, each
        time the worker (or the copy ``kworkers run`` makes of it with its flags) runs, takes
        its *effective* retry policy, tiers and ``message_timeout`` and runs the outbox relay
        beside its loops. So ``worker.run()``, ``engine.run(worker)`` and ``kworkers run
        app:worker`` are the same."""
        if tuple(worker.config.topics) != (self.topic,):
            raise ConfigError(f"a workflow worker consumes exactly the engine's topic "
                              f"{self.topic!r}, not {list(worker.config.topics)}")
        worker.handler(self.runner)
        self._adopt(worker)
        worker.around_run(self.serving)
        return worker

    def _adopt(self, worker: Worker) -> None:
        cfg = worker.config
        self.runner.policy = cfg.retry
        self.runner.ladder = cfg.tiers
        self.runner.deadline = cfg.message_timeout

    @contextmanager
    def serving(self, worker: Worker) -> Iterator[None]:
        """The worker's run hook (``bind``): the engine adopts the running worker's effective
        settings, and this process's relay runs while its loops do."""
        self._adopt(worker)
        cfg = worker.config
        sender = KafkaSender(producer_settings(cfg.client, cfg.producer_config))
        self._relay = Relay(self.outbox, blocking_send(sender), idle_s=self.relay_idle_s,
                            name="kworkers-workflow-relay", metrics=worker.metrics).start()
        try:
            yield
        finally:
            relay, self._relay = self._relay, None
            relay.stop()
            sender.close()

    def worker(self, group_id: str, bootstrap_servers: str | None = None,
               **settings: Any) -> Worker:
        """A ``Worker`` on the engine's topic, bound to it, with a span per attempt when
        OpenTelemetry is installed. ``settings``: any ``WorkerConfig`` field (retry, tiers,
        concurrency, consumer_config, ...)."""
        w = Worker(topics=[self.topic], group_id=group_id, bootstrap_servers=bootstrap_servers,
                   metrics=self.metrics, clock=self.clock,
                   invoke=TracedInvoke(inner=ActivityInvoker(clock=self.clock)), **settings)
        return self.bind(w)

    def create_topics(self, worker: Worker, partitions: int = 6) -> list[str]:
        """The activities topic (the broker's default replication), its retry tiers and its
        DLQ (as durable as it: ``Worker.topic_specs``), those missing."""
        made = create_topics(clients.admin(worker.config.client),
                             [TopicSpec(self.topic, partitions)])
        return made + worker.create_topics(partitions)

    def run(self, worker: Worker, install_signals: bool = True) -> None:
        """Run ``worker`` (bound to this engine) until SIGTERM or ``stop()``; its run hook
        starts this process's relay beside it.

        Every replica runs one: the relays share the outbox (rows claimed with a lease), so
        any number of them is safe and a dead one's rows are sent by another."""
        if worker._handler is not self.runner:
            self.bind(worker)
        worker.run(install_signals=install_signals)


def _check_workflow_id(workflow_id: str) -> None:
    if not isinstance(workflow_id, str) or not workflow_id:
        raise ConfigError("a workflow id must be a non-empty string")
    if "/" in workflow_id or len(workflow_id) > MAX_WORKFLOW_ID or not workflow_id.isprintable():
        raise ConfigError(f"workflow id {workflow_id[:60]!r}: at most {MAX_WORKFLOW_ID} printable "
                          "characters, no '/' (it is half of the idempotency key)")

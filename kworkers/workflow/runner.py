"""The handler of the activities topic: run a run's pending activity, then checkpoint it.

One record, one attempt::

    decode the record ─ bad: DecodeError (DLQ with the reason)
    read the run and its results ─ no run: UnknownRun (DLQ); unknown version: VersionMismatch
    not the run's pending activity ─▶ skip (a duplicate, or a record the run has moved past)
    run the function (sync, or async on a private event loop)
    ok:     store.apply_once("<run>/<activity>", checkpoint)   ── one transaction:
                the step's apply_once effects, its result, the run's next state, the outbox
                row of the next activity, the done-mark. Crash before it: nothing happened and
                the record is redelivered; after it: the record is a duplicate and skipped.
    raises: the retry policy's verdict (``route``, the same call the loop makes):
                retry  ─▶ note the attempt in the history, re-raise (a retry tier takes it)
                final  ─▶ one transaction: the history, the run's next state (compensating,
                          or failed), the outbox row of the first compensation; a failed run
                          re-raises so the record goes to the DLQ with the run's ids

Every write re-reads the run under its lock and does nothing when the activity is no longer the
run's pending one: two deliveries of one record (a relay resend, a rebalance overlap) can both
run the function, but only one of them checkpoints.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any, Literal

from kworkers.clock import Clock
from kworkers.errors import NonRetryableError, failure_message, failure_type
from kworkers.idempotency.outbox import Outbox
from kworkers.idempotency.store import SqlConnection, TransactionalStore
from kworkers.message import Headers, Message
from kworkers.metrics import Metrics
from kworkers.retry_tiers.policy import RetryPolicy, no_jitter
from kworkers.retry_tiers.routing import MAX_ERROR_MESSAGE, DeadLetterDecision, route
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.tracing import trace_context_of
from kworkers.workflow.codec import ActivityRecord, decode_json, encode_json
from kworkers.workflow.context import Results, StepContext
from kworkers.workflow.definition import Activity, Definition
from kworkers.workflow.errors import SignalTimeout, StepOverran, UnknownRun
from kworkers.workflow.registry import Registry
from kworkers.workflow.state import RunState, Transition, on_failure, on_success
from kworkers.workflow.tables import RunRow, RunTables
from kworkers.workflow.trace import next_traceparent

__all__ = ["ActivityRunner"]

log = logging.getLogger("kworkers.workflow")


class _Stale(Exception):
    """The run moved past this activity while it ran: write nothing."""


def call_step(fn: Callable[[StepContext], Any], ctx: StepContext) -> Any:
    """A step's result; an ``async def`` step runs on an event loop of its own (the handler
    runs on a worker thread, where no loop is running)."""
    out = fn(ctx)
    if inspect.isawaitable(out):
        async def wait() -> Any:
            return await out

        return asyncio.run(wait())
    return out


class ActivityRunner:
    """``Worker`` handler for one engine's activities topic (see the module docstring)."""

    def __init__(self, registry: Registry, store: TransactionalStore[Any], tables: RunTables,
                 outbox: Outbox, topic: str, clock: Clock, metrics: Metrics,
                 max_result_bytes: int, on_commit: Callable[[], None]) -> None:
        self.registry = registry
        self.store = store
        self.tables = tables
        self.outbox = outbox
        self.topic = topic
        self.clock = clock
        self.metrics = metrics
        self.max_result_bytes = max_result_bytes
        self.on_commit = on_commit
        #: the retry policy and tiers of the worker this runs in (``Engine.bind`` sets them)
        self.policy: RetryPolicy | None = None
        self.ladder: TierLadder | None = None
        #: the worker's ``message_timeout``: a step that returns past it is a failed attempt
        #: the engine records (``StepOverran``), as the loop routes it, not a checkpoint
        self.deadline: float | None = None

    # -- the hand-off: the one place a next activity is written --------------------------------

    def dispatch(self, conn: SqlConnection, row: RunRow, d: Definition, activity_id: str,
                 traceparent: str, not_before: float | None = None) -> None:
        """Put the record of ``activity_id`` in the outbox, on the checkpoint's connection
        (``not_before``: a durable timer, no relay sends it earlier)."""
        rec = ActivityRecord(row.workflow_id, activity_id, d.name, d.version)
        key, value, headers = rec.encode(traceparent)
        self.handoff(conn, key, value, headers, not_before or 0.0)

    def handoff(self, conn: SqlConnection, key: bytes, value: bytes, headers: Headers,
                not_before: float = 0.0) -> None:
        self.outbox.enqueue(conn, self.topic, key, value, headers, not_before=not_before)

    # -- one record ----------------------------------------------------------------------------

    def __call__(self, msg: Message) -> None:
        rec = ActivityRecord.decode(msg)
        sig: tuple[int, str | None] | None = None
        with self.store.atomic() as conn:
            row = self.tables.lock_run(conn, rec.workflow_id, lock=False)
            raw = ({} if row is None or not row.state.pending(rec.activity_id)
                   else self.tables.completed_results(conn, rec.workflow_id))
            if row is not None and row.state.signal and row.state.pending(rec.activity_id):
                sig = self.tables.first_signal(conn, rec.workflow_id, row.state.signal)
        if row is None:
            raise UnknownRun(rec.workflow_id)
        d = self.registry.resolve(row.workflow_id, row.workflow, row.version)
        if (rec.workflow, rec.version) != (row.workflow, row.version):
            raise NonRetryableError(
                "RunMismatch", f"record for {rec.workflow!r} version {rec.version!r}, but run "
                f"{row.workflow_id!r} is {row.workflow!r} version {row.version!r}")
        if not row.state.pending(rec.activity_id):
            self._count(d, rec.activity_id, "skipped")
            log.debug("%s: not pending (run is %s at %s), skipped", rec.key, row.status,
                      row.state.activity)
            return
        wait = self._wait_state(row, sig is not None)
        if wait == "early":
            self._too_early(msg, rec, d, row)
            return
        act = d.activity(rec.activity_id)
        if act is None:
            raise NonRetryableError(
                "UnknownActivity", f"{rec.key}: definition {d.name!r} version {d.version!r} has "
                "no such activity (its steps changed without a new version)")
        parent, _state = trace_context_of(msg)
        ctx = StepContext(
            workflow_id=row.workflow_id, workflow=d.name, activity_id=act.id, kind=act.kind,
            attempt=msg.attempt, input=decode_json(row.input, f"input of run {rec.workflow_id!r}"),
            results=Results(raw, row.workflow_id), cause=row.state.cause,
            traceparent=None if parent is None else parent.header(), now=self.clock.now,
            signal=None if sig is None else decode_json(
                sig[1], f"signal {row.state.signal!r} of run {rec.workflow_id!r}"))
        outgoing = next_traceparent(parent)
        with self.store.atomic() as conn:  # counted before it runs: a crash mid-step counts
            self.tables.started(conn, row.workflow_id, act.id, act.kind, act.position,
                                act.name, self.clock.now())
        t0 = time.perf_counter()
        try:
            try:
                if wait == "timeout":
                    waited = (row.state.wake_at or 0.0) - row.updated_at
                    raise SignalTimeout(row.workflow_id, act.id, row.state.signal or "", waited)
                value = call_step(act.fn, ctx)
            finally:
                took = time.perf_counter() - t0
                self.metrics.workflow_step_duration.labels(d.name, act.id).observe(took)
            if self.deadline is not None and took > self.deadline:
                raise StepOverran(row.workflow_id, act.id, took, self.deadline)
            result = encode_json(value, f"result of {act.kind} {act.id!r} of run "
                                 f"{row.workflow_id!r}", self.max_result_bytes)
            self._checkpoint(rec, d, act, ctx, result, outgoing,
                             None if sig is None else sig[0])
        except Exception as exc:
            if self._failed(msg, rec, d, act, exc, outgoing):
                raise

    # -- success ------------------------------------------------------------------------------

    def _checkpoint(self, rec: ActivityRecord, d: Definition, act: Activity, ctx: StepContext,
                    result: str, outgoing: str, signal_id: int | None = None) -> None:
        done: list[tuple[RunState, Transition]] = []

        def write(conn: SqlConnection) -> None:
            now = self.clock.now()
            row = self.tables.lock_run(conn, rec.workflow_id)
            if row is None or not row.state.pending(act.id):
                raise _Stale
            for effect in ctx.effects():
                effect(conn)
            if signal_id is not None:
                self.tables.take_signal(conn, signal_id, act.id)
            self.tables.record(conn, row.workflow_id, act.id, act.kind, act.position, act.name,
                               "completed", now, result=result)
            t = on_success(d, row.state, goto=ctx.goto_step, wake_at=ctx.wake_at,
                           signal=ctx.wait_signal, done=self._done(conn, row.workflow_id))
            self.tables.set_state(conn, row.workflow_id, t.state, now)
            if t.dispatch is not None:
                waits = t.state.signal is not None and self.tables.first_signal(
                    conn, row.workflow_id, t.state.signal) is None
                # a signal already kept wakes the next step at once; else its deadline does
                self.dispatch(conn, row, d, t.dispatch, outgoing,
                              t.state.wake_at if waits or t.state.signal is None else None)
            done.append((row.state, t))

        try:
            applied = self.store.apply_once(rec.key, write, self.clock.now())
        except _Stale:
            applied = False
        if not applied:
            self._count(d, act.id, "skipped")
            return
        before, t = done[0]
        self.on_commit()
        self._count(d, act.id, "completed")
        self._moved(d, rec.workflow_id, before, t.state)

    def _done(self, conn: SqlConnection, workflow_id: str) -> set[str]:
        """The run's completed activity ids (a branch not taken is not among them)."""
        return set(self.tables.completed_results(conn, workflow_id))

    def _wait_state(self, row: RunRow, has_signal: bool) -> Literal["run", "early", "timeout"]:
        """Whether the run's pending activity may run now: no timer, or its timer is due; when
        it waits for a signal, one was sent ("run") or its deadline passed ("timeout")."""
        s = row.state
        due = s.wake_at is None or self.clock.now() >= s.wake_at
        if s.signal is not None:
            return "run" if has_signal else "timeout" if due else "early"
        return "run" if due else "early"

    def _too_early(self, msg: Message, rec: ActivityRecord, d: Definition, row: RunRow) -> None:
        """A record of a sleeping run arrived before its ``wake_at`` (another relay's clock
        ahead of ours, an operator's replay; or the record a signal's wake-up sent, before the
        signal committed): never run it early. Put a copy back in the outbox
        due at ``wake_at``, in a transaction under the run's lock, and skip this one; the
        pending-activity guard absorbs the extra copies this may make."""
        with self.store.atomic() as conn:
            now_row = self.tables.lock_run(conn, rec.workflow_id)
            if now_row is None or not now_row.state.pending(rec.activity_id):
                return
            wake = now_row.state.wake_at
            if wake is None or self.clock.now() >= wake:
                wake = 0.0
            parent, _ = trace_context_of(msg)
            self.dispatch(conn, now_row, d, rec.activity_id, next_traceparent(parent), wake)
        self.on_commit()
        self._count(d, rec.activity_id, "early")
        log.warning("%s arrived before its wake-up time %.3f (now %.3f): put back, not run",
                    rec.key, row.state.wake_at or 0.0, self.clock.now())

    # -- failure ------------------------------------------------------------------------------

    def _final(self, msg: Message, exc: BaseException) -> bool:
        """The retry policy's verdict on this attempt, as the consumer loop will reach it."""
        if self.policy is None or self.ladder is None:
            raise RuntimeError("the engine is not bound to a worker: call Engine.bind(worker)")
        decision = route(self.policy, self.ladder, self.topic, msg.attempt, exc,
                         self.clock.now(), no_jitter)
        return isinstance(decision, DeadLetterDecision)

    def _failed(self, msg: Message, rec: ActivityRecord, d: Definition, act: Activity,
                exc: BaseException, outgoing: str) -> bool:
        """Records the failed attempt; True when the record must be re-raised (to a retry tier,
        or to the DLQ when the run failed), False when the run took it over (compensating)."""
        error = f"{failure_type(exc)}: {failure_message(exc)}"[:MAX_ERROR_MESSAGE]
        final = self._final(msg, exc)
        moved: list[tuple[RunState, Transition]] = []
        with self.store.atomic() as conn:
            now = self.clock.now()
            row = self.tables.lock_run(conn, rec.workflow_id)
            if row is None or not row.state.pending(act.id):
                self._count(d, act.id, "skipped")
                return False
            self.tables.record(conn, row.workflow_id, act.id, act.kind, act.position, act.name,
                               "failed" if final else "retrying", now, error=error)
            if final:
                t = on_failure(d, row.state, error, self._done(conn, row.workflow_id))
                self.tables.set_state(conn, row.workflow_id, t.state, now)
                if t.dispatch is not None:
                    self.dispatch(conn, row, d, t.dispatch, outgoing)
                moved.append((row.state, t))
        if not final:
            self._count(d, act.id, "retrying")
            return True
        before, t = moved[0]
        self.on_commit()
        self._count(d, act.id, "failed")
        self._moved(d, rec.workflow_id, before, t.state)
        return t.dead_letter

    # -- metrics and logs ---------------------------------------------------------------------

    def _count(self, d: Definition, activity_id: str, outcome: str) -> None:
        self.metrics.workflow_steps.labels(d.name, activity_id, outcome).inc()

    def _moved(self, d: Definition, workflow_id: str, before: RunState, after: RunState) -> None:
        if after.status != before.status:
            self.metrics.workflow_runs.labels(d.name, after.status).inc()
            log.info("run %s (%s): %s -> %s%s", workflow_id, d.name, before.status, after.status,
                     f" ({after.error or after.cause})" if after.error or after.cause else "")

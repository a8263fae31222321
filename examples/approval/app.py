"""A document approval: a workflow that sleeps, waits for a signal, then branches.

    submit ─ sleep cooling_s ─▶ review ─ wait for signal "decision" (timeout_s) ─▶ decide
        decide: {"approve": true}  ─▶ publish (then the run completes)
                {"approve": false} ─▶ reject
        no decision in time: review's successor fails with SignalTimeout; once its retries
        are used up the run unwinds: ``withdraw`` undoes ``submit``

Every step appends one row to ``<prefix>_log`` (no unique key: an append-only log, so a step
that ran twice would show twice) with ``ctx.apply_once``, in its checkpoint's transaction.

Its topic first (the activities' topic, with the retry ladder the worker below sets):

    kworkers topics create -b HOST:9092 --topic approvals.activities --partitions 6 \\
        --tiers 500ms,1s

    kworkers workflow start examples.approval.app:engine approval --id doc-1 \\
        --input '{"cooling_s": 5, "timeout_s": 600}'
    kworkers workflow signal examples.approval.app:engine doc-1 decision \
        --payload '{"approve": true}'
"""

from __future__ import annotations

import os
import time
from typing import Any

from kworkers import Worker
from kworkers.idempotency import dialect_of, open_store
from kworkers.idempotency.store import SqlConnection, TransactionalStore, check_identifier
from kworkers.retry_tiers import RetryPolicy, TierLadder
from kworkers.workflow import Engine, StepContext, Workflow

TOPIC = "approvals.activities"

approval = Workflow("approval")
_LOGS: dict[str, str] = {}  # workflow name -> its log table (make_engine registers it)


def _log(ctx: StepContext, what: str) -> None:
    table = _LOGS[ctx.workflow]
    at = time.time()  # when the step ran (before it asks to sleep)

    def append(conn: SqlConnection) -> None:
        mark = "?" if type(conn).__module__.startswith("sqlite3") else "%s"
        conn.execute(f"INSERT INTO {table} (workflow_id, step, at) VALUES ({mark}, {mark}, "
                     f"{mark})", (ctx.workflow_id, what, at))

    ctx.apply_once(append)


def withdraw(ctx: StepContext) -> None:
    _log(ctx, "withdraw")


@approval.step(compensate=withdraw)
def submit(ctx: StepContext) -> None:
    _log(ctx, "submit")
    ctx.sleep(float((ctx.input or {}).get("cooling_s", 1.0)))


@approval.step
def review(ctx: StepContext) -> None:
    _log(ctx, "review")
    ctx.wait_for_signal("decision", timeout=float((ctx.input or {}).get("timeout_s", 60.0)))


@approval.step
def decide(ctx: StepContext) -> dict[str, Any]:
    _log(ctx, "decide")
    approve = bool((ctx.signal or {}).get("approve"))
    ctx.goto("publish" if approve else "reject")
    return {"approve": approve}


@approval.step
def reject(ctx: StepContext) -> None:
    _log(ctx, "reject")
    ctx.finish()


@approval.step
def publish(ctx: StepContext) -> None:
    _log(ctx, "publish")


def log_of(store: TransactionalStore[Any],
           prefix: str = "approval") -> list[tuple[str, str, float]]:
    """Every (workflow_id, step, when it ran) appended, in order."""
    with store.atomic() as conn:
        return [(str(w), str(s), float(t)) for w, s, t in conn.execute(
            f"SELECT workflow_id, step, at FROM {check_identifier(prefix)}_log ORDER BY n",
            ()).fetchall()]


def make_engine(store: TransactionalStore[Any], *, topic: str = TOPIC,
                tables: str = "kworkers_wf", prefix: str = "approval", **kw: Any) -> Engine:
    table = check_identifier(f"{prefix}_log")
    serial = dialect_of(store).serial  # the store's SQL: an auto-numbered key
    with store.atomic() as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (n {serial}, workflow_id TEXT NOT "
                     "NULL, step TEXT NOT NULL, at DOUBLE PRECISION NOT NULL)", ())
    _LOGS[approval.name] = table
    return Engine(store, [approval], topic=topic, tables=tables, **kw)


def engine() -> Engine:
    """From the environment: ``KWORKERS_STORE_URL``; ``APPROVAL_NAME`` (optional) names the
    topic, the tables and the log, so several deployments (or tests) share a store."""
    store: Any = open_store(os.environ.get("KWORKERS_STORE_URL", "sqlite:///approvals.db"))
    name = os.environ.get("APPROVAL_NAME")
    if not name:
        return make_engine(store)
    return make_engine(store, topic=f"{name}.activities", tables=f"{name}_wf", prefix=name)


def worker() -> Worker:
    """``kworkers run examples.approval.app:worker -b HOST:9092``: the engine's worker; its run
    hook starts the outbox relay, so nothing but ``kworkers run`` is needed."""
    name = os.environ.get("APPROVAL_NAME") or "approvals"
    return engine().worker(
        group_id=name, tiers=TierLadder((0.5, 1.0)),
        retry=RetryPolicy(initial=0.2, max_interval=0.5, max_attempts=2),
        consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})

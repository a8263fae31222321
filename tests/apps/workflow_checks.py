"""What the workflow tests count with, and the in-memory broker the unit tests drive them on.

The counts come from data read back from the store: the run rows (``RunTables``) and an
append-only effects ledger written by the steps themselves (in the checkpoint's transaction,
through ``ctx.apply_once``), never from the engine's own counters or metrics.

The ledger is ``kworkers.testing.ledger.Ledger`` (append-only: no unique key, every
application a row), in the store's own database so a step's row shares its checkpoint's
transaction.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kworkers.message import Headers, Message
from kworkers.retry_tiers import RetryDecision, RetryPolicy, TierLadder, no_jitter, route
from kworkers.testing.ledger import Ledger
from kworkers.workflow import Engine, StepContext
from kworkers.workflow.tables import RunTables

RERUN = "rerun/"


def record_step(ledger: Ledger, ctx: StepContext, *, in_txn: bool = True) -> None:
    """What a test step does for the checker: note a run of a step whose effect had already
    committed (a re-run after completion, key ``rerun/<key>``; read back from the store), then
    append the step's effect.

    ``in_txn=False`` is the canary: the effect in a transaction of its own, not the
    checkpoint's."""
    key = ctx.idempotency_key
    if ledger.applications().get(key):
        ledger.apply(RERUN + key)
    if in_txn:
        ctx.apply_once(lambda conn: ledger.apply_in(conn, key))
    else:
        ledger.apply(key)


@dataclass
class Report:
    runs: int
    unfinished: dict[str, str] = field(default_factory=dict)
    wrong_count: dict[str, tuple[int, int]] = field(default_factory=dict)  # key: (want, got)
    reruns: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.unfinished or self.wrong_count or self.reruns)

    def summary(self) -> str:
        return (f"runs={self.runs} unfinished={len(self.unfinished)} "
                f"wrong_effect_counts={len(self.wrong_count)} reruns={len(self.reruns)} "
                f"e.g. {dict(list(self.unfinished.items())[:3])} "
                f"{dict(list(self.wrong_count.items())[:3])} {self.reruns[:3]}")


def check(tables: RunTables, ledger: Ledger, want_status: Mapping[str, str],
          want_effects: Mapping[str, int]) -> Report:
    """Every run in its wanted end state, every effect key applied exactly the wanted number
    of times (0 or 1), and no step started after its effect had committed."""
    apps = ledger.applications()
    report = Report(len(want_status))
    for wid, status in want_status.items():
        run = tables.run(wid)
        got = "missing" if run is None else run.status
        if got != status:
            report.unfinished[wid] = got
    for key, n in want_effects.items():
        if apps.get(key, 0) != n:
            report.wrong_count[key] = (n, apps.get(key, 0))
    report.reruns = sorted(k for k in apps if k.startswith(RERUN))
    return report


class Crash(BaseException):
    """A simulated SIGKILL: nothing after it runs, the record is delivered again."""


class Harness:
    """An in-memory broker and consumer loop for one engine: the relay's records go to a
    queue, a consumer takes them in random order, failures are routed by ``route`` exactly as
    the loop does (same attempt counting), and a ``Crash`` redelivers the record unchanged."""

    def __init__(self, engine: Engine, policy: RetryPolicy | None = None, seed: int = 0,
                 crash_after_commit: float = 0.0, relay_loses_acks: float = 0.0) -> None:
        self.engine = engine
        self.policy = policy or RetryPolicy(max_attempts=3)
        self.ladder = TierLadder((1.0,))
        engine.runner.policy, engine.runner.ladder = self.policy, self.ladder
        self.rnd = random.Random(seed)
        self.queue: deque[Message] = deque()
        self.dlq: list[tuple[Message, BaseException]] = []
        self.delivered = 0
        self.crashes = 0
        self._offset = 0
        inner = engine.runner.on_commit

        def on_commit() -> None:
            inner()
            if self.rnd.random() < crash_after_commit:
                raise Crash("after the checkpoint committed, before the offset")

        engine.runner.on_commit = on_commit
        self.relay_loses_acks = relay_loses_acks

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        self._offset += 1
        self.queue.append(Message(topic, 0, self._offset, key, value, headers))

    def relay(self) -> None:
        box = self.engine.outbox
        records = box.claim(1000)
        for r in records:
            self.send(r.topic, r.key, r.value, r.headers)
        if records and self.rnd.random() < self.relay_loses_acks:
            box.release([r.id for r in records])  # died before mark_sent: all sent again
        elif records:
            box.mark_sent([r.id for r in records])

    def pump(self, limit: int = 100_000, handler: Callable[[Message], Any] | None = None) -> None:
        run = handler or self.engine.runner
        for _ in range(limit):
            self.relay()
            if not self.queue:
                return
            i = self.rnd.randrange(len(self.queue))
            self.queue.rotate(-i)
            msg = self.queue.popleft()
            self.delivered += 1
            try:
                run(msg)
            except Crash:
                self.crashes += 1
                self.queue.append(msg)
            except Exception as exc:
                d = route(self.policy, self.ladder, msg.topic, msg.attempt, exc, 0.0, no_jitter)
                if isinstance(d, RetryDecision):
                    self.queue.append(msg._replace(attempt=d.next_attempt))
                else:
                    self.dlq.append((msg, exc))
        raise AssertionError(f"still busy after {limit} deliveries")

"""A workflow worker process for the fault tests: an example workflow with a ledger and kills.

Every activity (step or compensation) of the example runs as written, then appends one row
keyed by its idempotency key to the append-only ledger in the checkpoint's transaction
(``record_step``), then maybe SIGKILLs its own process: mid-step, after the step's work and
before the checkpoint.

    python -m tests.apps.workflow_worker pipeline|order BOOTSTRAP STORE_URL NAME [options]

NAME names the topic, the consumer group, the engine's tables, the ledger and the example's
own tables, so tests on a shared PostgreSQL never meet.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kworkers import Worker
from kworkers.idempotency import open_store
from kworkers.retry_tiers import RetryPolicy, TierLadder
from kworkers.testing.ledger import Ledger
from kworkers.workflow import Engine, StepContext, Workflow
from kworkers.workflow.definition import StepFn
from tests.apps.workflow_checks import record_step

SETTINGS: dict[str, Any] = {
    "consumer_config": {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
    "tiers": TierLadder((0.25, 0.5, 1.0)),
    "concurrency": 4,
    "drain_timeout": 20.0,
}
#: the pipeline never gives up on a flaky step; the saga's ship step gives up on attempt 4
POLICIES = {"pipeline": RetryPolicy(initial=0.2, max_interval=1.0, max_attempts=100),
            "order": RetryPolicy(initial=0.2, max_interval=0.5, max_attempts=4)}


class Chaos:
    def __init__(self, die_rate: float = 0.0, die_once_dir: str | None = None,
                 die_once_at: tuple[str, ...] = ("step", "compensation"),
                 effect_in_txn: bool = True, step_sleep: float = 0.0) -> None:
        self.rnd = random.Random()
        self.step_sleep = step_sleep
        self.die_rate = die_rate
        self.die_once_dir = die_once_dir
        #: kinds ("step", "compensation") or activity ids where each activity dies once
        self.die_once_at = die_once_at
        self.effect_in_txn = effect_in_txn

    def _first_time(self, key: str) -> bool:
        """True the first time ``key`` gets here, across all processes."""
        assert self.die_once_dir is not None
        try:
            fd = os.open(Path(self.die_once_dir) / key.replace("/", "_"),
                         os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    def after_work(self, ctx: StepContext) -> None:
        """The kill point: the step did its work and queued its effects; no checkpoint yet."""
        if self.step_sleep:
            time.sleep(self.rnd.uniform(0, self.step_sleep))  # a wider window for outside kills
        if (self.die_once_dir is not None
                and (ctx.kind in self.die_once_at or ctx.activity_id in self.die_once_at)
                and self._first_time(ctx.idempotency_key)):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.rnd.random() < self.die_rate:
            os.kill(os.getpid(), signal.SIGKILL)


def _wrap(fn: StepFn, ledger: Ledger, chaos: Chaos) -> StepFn:
    def run(ctx: StepContext) -> Any:
        out = fn(ctx)
        record_step(ledger, ctx, in_txn=chaos.effect_in_txn)
        chaos.after_work(ctx)
        return out

    run.__name__ = run.__qualname__ = getattr(fn, "__name__", "step")
    return run


def build(app: str, store_url: str, name: str, chaos: Chaos | None = None
          ) -> tuple[Engine, Ledger]:
    """The example's engine with every activity wrapped (the tests start runs through the same
    definition, so the versions agree)."""
    chaos = chaos or Chaos()
    store: Any = open_store(store_url)
    ledger = Ledger.on_store(store, table=f"{name}_ledger")
    from examples.order_saga import app as order_app
    from examples.pipeline import app as pipeline_app

    base = pipeline_app.pipeline if app == "pipeline" else order_app.order
    wf = Workflow(base.name)
    for s in base.freeze().steps:
        wf.add(_wrap(s.fn, ledger, chaos), name=s.name,
               compensate=None if s.compensate is None else _wrap(s.compensate, ledger, chaos))
    kw: dict[str, Any] = {"topic": name, "tables": name, "workflow": wf, "relay_idle_s": 0.2,
                          "outbox_lease_s": 10.0}
    if app == "pipeline":
        engine = pipeline_app.make_engine(store, index=f"{name}_index", **kw)
    else:
        engine = order_app.make_engine(store, shop=name, **kw)
    return engine, ledger


def make_worker(engine: Engine, app: str, bootstrap: str, name: str) -> Worker:
    """The worker every process of a test runs (the test creates topics with one, too)."""
    return engine.worker(name, bootstrap, retry=POLICIES[app], **SETTINGS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("app", choices=["pipeline", "order"])
    ap.add_argument("bootstrap")
    ap.add_argument("store")
    ap.add_argument("name")
    ap.add_argument("--die-rate", type=float, default=0.0)
    ap.add_argument("--die-once-dir")
    ap.add_argument("--die-once-at", default="step,compensation",
                    help="kinds or activity ids (comma-separated) to die at once each")
    ap.add_argument("--effect-outside-txn", action="store_true")
    ap.add_argument("--step-sleep", type=float, default=0.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(message)s")
    chaos = Chaos(args.die_rate, args.die_once_dir, tuple(args.die_once_at.split(",")),
                  effect_in_txn=not args.effect_outside_txn, step_sleep=args.step_sleep)
    engine, _ledger = build(args.app, args.store, args.name, chaos)
    engine.run(make_worker(engine, args.app, args.bootstrap, args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())

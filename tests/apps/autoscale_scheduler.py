"""The scheduler pool's replicas for the autoscaling scenario (tests/faults/test_autoscaling.py),
run by ``kworkers run tests.apps.autoscale_scheduler:worker``: a ``Scheduler`` over one
destination, its rungs as source topics, exactly once.

From the environment: ``KW_AS_BOOTSTRAP``, ``KW_AS_STORE`` (a store URL: the ids' state),
``KW_AS_DEST``, ``KW_AS_GROUP``, ``KW_AS_LAG_INTERVAL_S`` (as in autoscale_worker). Each replica
takes a transactional id of its own (the group and its pid).
"""

from __future__ import annotations

import os

from kworkers import RetryPolicy, TierLadder, Worker
from kworkers.idempotency import open_store
from kworkers.schedule import ScheduleLadder, Scheduler

#: the rungs: a record due within 60 s waits in ``.scheduled.due`` (the scenario's 15 s ones)
LADDER = ScheduleLadder((60.0,), horizon=60.0)
SETTINGS = {"retry": RetryPolicy(initial=0.2, backoff=2.0, max_interval=0.5, max_attempts=10),
            "tiers": TierLadder((0.5,))}


def scheduler(bootstrap: str, store: str, dest: str) -> Scheduler:
    return Scheduler(bootstrap, open_store(store), [dest], ladder=LADDER)


def worker() -> Worker:
    if "KW_AS_LAG_INTERVAL_S" in os.environ:
        from kworkers.consumer import processor

        processor.LAG_INTERVAL_S = float(os.environ["KW_AS_LAG_INTERVAL_S"])
    group = os.environ["KW_AS_GROUP"]
    s = scheduler(os.environ["KW_AS_BOOTSTRAP"], os.environ["KW_AS_STORE"],
                  os.environ["KW_AS_DEST"])
    return s.worker(group, transactional_id=f"{group}-{os.getpid()}", concurrency=4,
                    drain_timeout=5.0, transaction_timeout=10.0, **SETTINGS)

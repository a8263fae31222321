"""The replicas of the autoscaling scenarios (tests/faults/test_autoscaling.py), run by
``kworkers run tests.apps.autoscale_worker:worker`` as a Deployment's pods would be.

Bootstrap, topic and group from ``KWORKERS_*`` (as the rendered ConfigMap gives them), the
metrics port from ``--metrics-port``; the scenario's own settings from the environment:

- ``KW_AS_LEDGER``: the append-only ledger (kworkers.testing.ledger) every effect goes to;
- ``KW_AS_SLOW_MS``: each handler's time (a backlog that takes a while to drain);
- ``KW_AS_FAIL_FIRST``: ``1``: every record's first attempt fails (RetryableError), so it
  waits in the retry tier ``KW_AS_RETRY_S`` seconds (one tier of that delay, no jitter: every
  record due exactly that long after its failure) before it runs.
"""

from __future__ import annotations

import os
import time

from kworkers import Message, RetryableError, RetryPolicy, TierLadder, Worker
from kworkers.retry_tiers.policy import no_jitter
from kworkers.testing.ledger import Ledger


def worker() -> Worker:
    ledger = Ledger(os.environ["KW_AS_LEDGER"])
    slow = float(os.environ.get("KW_AS_SLOW_MS", "0")) / 1000
    fail_first = os.environ.get("KW_AS_FAIL_FIRST") == "1"
    retry_s = float(os.environ.get("KW_AS_RETRY_S", "5"))
    w = Worker(topics=["placeholder"], group_id="placeholder", concurrency=4,
               retry=RetryPolicy(initial=retry_s, backoff=1.0, max_interval=retry_s,
                                 max_attempts=3),
               tiers=TierLadder((retry_s,)), jitter=no_jitter)

    @w.handler
    def handle(msg: Message) -> None:
        if fail_first and msg.attempt == 1:
            raise RetryableError("the first attempt fails: the record waits in the tier")
        if slow:
            time.sleep(slow)
        assert msg.value is not None
        ledger.apply(msg.value.decode(), msg)

    return w

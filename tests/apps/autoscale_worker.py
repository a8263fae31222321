"""The replicas of the autoscaling scenarios (tests/faults/test_autoscaling.py), run by
``kworkers run tests.apps.autoscale_worker:worker`` as a Deployment's pods would be.

Bootstrap, topic and group from ``KWORKERS_*`` (as the rendered ConfigMap gives them), the
metrics port from ``--metrics-port``; the scenario's own settings from the environment:

- ``KW_AS_LEDGER``: the append-only ledger (kworkers.testing.ledger) every effect goes to;
- ``KW_AS_SLOW_MS``: each handler's time (a backlog that takes a while to drain);
- ``KW_AS_FAIL_FIRST``: ``1``: every record's first attempt fails (RetryableError), so it
  waits in the retry tier ``KW_AS_RETRY_S`` seconds (one tier of that delay, no jitter: every
  record due exactly that long after its failure) before it runs;
- ``KW_AS_DOWN``: a path; while it exists the downstream is down: every attempt is a delivery
  in the ledger (not an effect) and fails with RetryableError;
- ``KW_AS_LAG_INTERVAL_S``: how often the lag gauges are refreshed (5 s in kworkers; the
  scenarios divide it like every other interval, or a gauge would hold a figure 150 s of
  full-scale time);
- ``KW_AS_RATE``/``KW_AS_RATE_STORE``/``KW_AS_RATE_NAME``: a pool-wide rate limit (records
  a second, burst 5) shared through that store (``kworkers.pace.open_buckets``);
- ``KW_AS_BREAKER``: ``1``: a breaker that opens after 5 attempts at half failures (a probe
  every 2 s, at most 4 s apart).
"""

from __future__ import annotations

import os
import time
from typing import Any

from kworkers import Message, RetryableError, RetryPolicy, TierLadder, Worker
from kworkers.consumer.breaker import BreakerPolicy
from kworkers.retry_tiers.policy import no_jitter
from kworkers.testing.ledger import Ledger


def worker() -> Worker:
    if "KW_AS_LAG_INTERVAL_S" in os.environ:
        from kworkers.consumer import processor

        processor.LAG_INTERVAL_S = float(os.environ["KW_AS_LAG_INTERVAL_S"])
    ledger = Ledger(os.environ["KW_AS_LEDGER"])
    slow = float(os.environ.get("KW_AS_SLOW_MS", "0")) / 1000
    fail_first = os.environ.get("KW_AS_FAIL_FIRST") == "1"
    retry_s = float(os.environ.get("KW_AS_RETRY_S", "5"))
    down = os.environ.get("KW_AS_DOWN")
    breaker = (BreakerPolicy(min_attempts=5, window_s=10, cooldown_s=2.0, max_cooldown_s=4.0)
               if os.environ.get("KW_AS_BREAKER") == "1" else None)
    rate: dict[str, Any] = {}
    if os.environ.get("KW_AS_RATE"):
        from kworkers.pace import RateLimit, open_buckets

        rate = {"rate_limit": RateLimit(per_second=float(os.environ["KW_AS_RATE"]), burst=5,
                                        scope="pool", name=os.environ.get("KW_AS_RATE_NAME", "")),
                "rate_store": open_buckets(os.environ["KW_AS_RATE_STORE"])}
    w = Worker(topics=["placeholder"], group_id="placeholder", concurrency=4, **rate,
               retry=RetryPolicy(initial=retry_s, backoff=1.0, max_interval=retry_s,
                                 max_attempts=3),
               tiers=TierLadder((retry_s,)), jitter=no_jitter, breaker=breaker)

    @w.handler
    def handle(msg: Message) -> None:
        assert msg.value is not None
        if down is not None and os.path.exists(down):
            ledger.delivered(msg.value.decode(), msg)
            raise RetryableError("the downstream is down")
        if fail_first and msg.attempt == 1:
            raise RetryableError("the first attempt fails: the record waits in the tier")
        if slow:
            time.sleep(slow)
        ledger.apply(msg.value.decode(), msg)

    return w

"""The worker of the dashboard and alert scenarios (tests/integration/test_prometheus_scrape.py),
run by ``kworkers run tests.apps.observed_worker:worker --group G --topic T``, so that every
panel and rule has a real series to read.

Every run has a circuit breaker (lenient: it stays closed), a per-replica rate limit (records
wait for tokens), a value deserializer (the registry-wait gauge) and a retry tier of 250 ms.
Records say what happens to them: ``poison...`` is dead-lettered (``Poison``), ``flaky...``
fails its first attempt (the retry tier), ``lost...`` (exactly once) produces to a topic that
does not exist (the output-topic gauge); anything else sleeps ``KW_OB_SLOW_MS``.

- ``KW_OB_EOS``: a topic name: exactly once, each record produces one output there;
- ``KW_OB_STALL``: ``1``: the stall canary: the main group's consumer ignores every resume
  (``tests.apps.backlog_worker.SkipsResume``: a partition paused by backpressure is never
  fetched again; backpressure pauses, never holds) under small caps, with a stall timeout of
  3 s (it stops 3 bounds later; bootstrap from ``KWORKERS_BOOTSTRAP_SERVERS``, which the
  injected consumer reads).
"""

from __future__ import annotations

import os
import time
from typing import Any

from kworkers import (
    Message,
    NonRetryableError,
    RetryableError,
    RetryPolicy,
    TierLadder,
    Worker,
    activity,
)
from kworkers.consumer.breaker import BreakerPolicy
from kworkers.pace import RateLimit
from kworkers.retry_tiers.policy import no_jitter

MISSING_TOPIC = "kworkers-observed-missing-output"


def _stalling(group: str) -> Any:
    from tests.apps.adapters import KafkaConsumerAdapter, consumer_settings
    from tests.apps.backlog_worker import SkipsResume

    real = KafkaConsumerAdapter(consumer_settings(os.environ["KWORKERS_BOOTSTRAP_SERVERS"],
                                                  group))
    return real if group.endswith(".retry") else SkipsResume(real)


def worker() -> Worker:
    slow = float(os.environ.get("KW_OB_SLOW_MS", "5")) / 1000
    output = os.environ.get("KW_OB_EOS")
    stall = os.environ.get("KW_OB_STALL") == "1"
    extra: dict[str, Any] = {}
    if output:
        extra["guarantee"] = "exactly_once"
    if stall:
        from kworkers.consumer import processor

        # a partition at its share is paused, never held: a hold (when no other partition
        # wants records) ends without a pause whenever a record completes within HOLD_S, and
        # with 20 ms records C then drained all 600 and never stalled (once in 8 CI runs,
        # 2026-12-05, on an idle machine: which path a run took depended on whether the empty
        # partition was known to want nothing yet)
        processor.HOLDS = False
        extra.update(consumer=_stalling, max_in_flight=20, max_in_flight_per_partition=10,
                     stall_timeout=3.0)
    w = Worker(topics=["placeholder"], group_id="placeholder", concurrency=4,
               retry=RetryPolicy(initial=0.25, backoff=1.0, max_interval=0.25, max_attempts=3),
               tiers=TierLadder((0.25,)), jitter=no_jitter,
               breaker=BreakerPolicy(min_attempts=10_000),
               rate_limit=RateLimit(per_second=400, burst=10, scope="replica"),
               value_deserializer=lambda data, ctx: data, **extra)

    @w.handler
    def handle(msg: Message) -> None:
        value = bytes(msg.value or b"")
        if value.startswith(b"poison"):
            raise NonRetryableError("Poison", f"{msg.topic}[{msg.partition}]@{msg.offset}")
        if value.startswith(b"flaky") and msg.attempt == 1:
            raise RetryableError("Flaky", "the first attempt fails")
        if output:
            activity.produce(MISSING_TOPIC if value.startswith(b"lost") else output, value,
                             key=msg.key)
        time.sleep(slow)

    return w

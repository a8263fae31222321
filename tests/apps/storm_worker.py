"""A worker for the failure-storm tests, run as ``kworkers run tests.apps.storm_worker:worker``
(bootstrap, topic and group from ``KWORKERS_*``).

While the file ``STORM_DOWN`` names exists, the downstream is "down": every attempt raises at
once (a retryable ``ConnectionError``). Otherwise the effect is applied through the idempotency
store's transactional ``apply_once`` into the append-only ledger (``STORM_STORE``, a store URL;
``STORM_TABLE``, the ledger's tables); every handler call is a delivery row first
(``RecordingInvoker``). ``STORM_BREAKER=1`` turns the circuit breaker on.

``STORM_LIMITS`` (``name=value,...``: ``WorkerConfig`` integers) and ``STORM_CONSUMER``
(client settings, e.g. ``queued.max.messages.kbytes=1024``) set the bounds on what the worker
may hold; unset, the defaults.
"""

from __future__ import annotations

import os
from typing import Any

from kworkers import Message, RetryPolicy, TierLadder, Worker
from kworkers.activity import ActivityInvoker
from kworkers.consumer.breaker import BreakerPolicy
from kworkers.idempotency import open_store
from kworkers.testing.instruments import RecordingInvoker, message_key
from kworkers.testing.ledger import Ledger
from kworkers.topic_names import source_topic_of

DOWN = os.environ.get("STORM_DOWN", "/nonexistent")
store: Any = open_store(os.environ.get("STORM_STORE", "sqlite:///tmp/storm-store.db"))
ledger = Ledger.on_store(store, table=os.environ.get("STORM_TABLE", "kworkers_ledger"))


def _pairs(text: str) -> dict[str, int]:
    return {k: int(v) for k, _, v in (p.partition("=") for p in text.split(",") if p)}


limits: dict[str, Any] = _pairs(os.environ.get("STORM_LIMITS", ""))  # Worker's **settings
client = _pairs(os.environ.get("STORM_CONSUMER", ""))
breaker = (BreakerPolicy(failure_ratio=0.5, window_s=5, min_attempts=50, cooldown_s=2.0,
                         max_cooldown_s=4.0)
           if os.environ.get("STORM_BREAKER") == "1" else None)



def storm_key(msg: Message) -> str:
    """The source topic in the key: a shared PostgreSQL outlives one test's topic."""
    return f"{source_topic_of(msg.topic)}/{message_key(msg)}"


worker = Worker(
    topics=["placeholder"], group_id="placeholder", concurrency=8,
    retry=RetryPolicy(initial=1.0, backoff=2.0, max_interval=4.0, max_attempts=50),
    tiers=TierLadder((1.0, 2.0, 4.0)), breaker=breaker, drain_timeout=20.0,
    invoke=RecordingInvoker(ledger, ActivityInvoker(), key_of=storm_key),
    consumer_config=client, **limits,
)


@worker.handler
def handle(msg: Message) -> None:
    if os.path.exists(DOWN):
        raise ConnectionError("downstream is down")
    key = storm_key(msg)
    store.apply_once(key, lambda conn: ledger.apply_in(conn, key, msg))

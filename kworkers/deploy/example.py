"""The example worker the image and docker-compose run: ``kworkers.deploy.example:worker``.

It counts the records it handles, per topic, and exists to show the deployment working end to
end (records flow, metrics move), not to do anything useful. Its settings come from
``KWORKERS_*`` variables (``config_from_env``), defaulting to topic ``orders`` and group
``orders-workers``; a record whose value starts with ``fail`` fails once per attempt until its
last (to show retry tiers), one starting with ``poison`` goes to the DLQ at once.

``python -m kworkers.deploy.example ROLE`` runs one part of the demo without the CLI:

- ``topics``: wait for the broker, create the source topic (``KWORKERS_DEMO_PARTITIONS``, 6)
  and its retry tiers and DLQ;
- ``run``: the worker, with ``/metrics``, ``/healthz``, ``/readyz`` on
  ``KWORKERS_METRICS_HOST:KWORKERS_METRICS_PORT`` (0.0.0.0:9100);
- ``produce``: ``KWORKERS_DEMO_RECORDS`` records (1000) at ``KWORKERS_DEMO_RATE`` per second
  (100), each starting a trace (a ``traceparent`` header), then exit.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import Counter

from kworkers.deploy.env import config_from_env
from kworkers.errors import NonRetryableError, RetryableError
from kworkers.message import Message
from kworkers.tracing import TRACEPARENT, generate_traceparent, traced_invoke
from kworkers.worker import Worker

log = logging.getLogger("kworkers.example")

DEFAULTS = {"KWORKERS_TOPICS": "orders", "KWORKERS_GROUP_ID": "orders-workers"}

config = config_from_env({**DEFAULTS, **os.environ})
worker = Worker(config=config, invoke=traced_invoke)

_lock = threading.Lock()
#: records handled successfully, per topic (the demo's "effect")
handled: Counter[str] = Counter()


@worker.handler
def count(msg: Message) -> None:
    value = msg.value or b""
    if value.startswith(b"poison"):
        raise NonRetryableError("Poison", f"record {msg.topic}/{msg.partition}@{msg.offset}")
    if value.startswith(b"fail") and msg.attempt < config.retry.normalized().max_attempts:
        raise RetryableError("DemoFailure", f"attempt {msg.attempt} fails on purpose")
    with _lock:
        handled[msg.topic] += 1
        n = sum(handled.values())
    if n % 1000 == 0:
        log.info("%d records handled", n)


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


def create_topics() -> list[str]:
    """The source topic and everything the worker needs next to it; idempotent."""
    from kworkers.kafka.admin import admin_client
    from kworkers.kafka.admin import create_topics as create
    from kworkers.kafka.clients import wait_for_broker
    from kworkers.topic_plan import TopicSpec

    wait_for_broker(config.client, timeout=float(_int_env("KWORKERS_DEMO_WAIT", 120)))
    partitions = _int_env("KWORKERS_DEMO_PARTITIONS", 6)
    made = create(admin_client(config.client),
                  [TopicSpec(t, partitions) for t in config.topics])
    made += worker.create_topics(partitions)
    return made


def produce() -> int:
    """Produces the demo records, each with a new trace; returns how many were delivered."""
    from concurrent.futures import Future

    from kworkers.consumer.ports import settle
    from kworkers.kafka.producer import KafkaSender
    from kworkers.kafka.settings import producer_settings

    n = _int_env("KWORKERS_DEMO_RECORDS", 1000)
    rate = max(1, _int_env("KWORKERS_DEMO_RATE", 100))
    sender = KafkaSender(producer_settings(config.client, config.producer_config))
    start = time.monotonic()
    topic = config.topics[0]
    sent: list[Future[None]] = []
    try:
        for i in range(n):
            headers = ((TRACEPARENT, generate_traceparent().header().encode()),)
            fut: Future[None] = Future()
            sent.append(fut)
            sender.send(topic, f"k{i % 64}".encode(), str(i).encode(), headers, settle(fut))
            ahead = start + (i + 1) / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        for fut in sent:
            fut.result(60)  # raises when a record was not delivered
    finally:
        sender.close()
    return n


def serve() -> None:
    from kworkers.metrics import MetricsServer

    host = os.environ.get("KWORKERS_METRICS_HOST", "0.0.0.0")
    server = MetricsServer(worker.metrics, _int_env("KWORKERS_METRICS_PORT", 9100), host,
                           ready=lambda: worker.ready).start()
    log.info("metrics on %s:%d", host, server.port)
    try:
        worker.run()
    finally:
        server.close()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    role = argv[0] if argv else "run"
    if role == "topics":
        print("created:", ", ".join(create_topics()) or "nothing (all exist)", flush=True)
    elif role == "produce":
        print(f"produced {produce()} records", flush=True)
    elif role == "run":
        serve()
    else:
        print(f"usage: python -m kworkers.deploy.example [topics|run|produce], got {role!r}",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""A worker process for fault tests: applies each record's effect once into a SQLite ledger.

    python -m tests.apps.effects_worker BOOTSTRAP TOPIC GROUP LEDGER [options]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import time

from kworkers import Message, RetryPolicy, TierLadder, Worker
from kworkers.testing.effects import Ledger


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("group")
    ap.add_argument("ledger")
    ap.add_argument("--fail-rate", type=float, default=0.0)
    ap.add_argument("--slow-ms", type=float, default=0.0)
    ap.add_argument("--ordering", default="partition")
    ap.add_argument("--protocol", default="classic")
    ap.add_argument("--async", dest="use_async", action="store_true")
    ap.add_argument("--max-poll-interval-ms", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(message)s")
    ledger = Ledger(args.ledger)
    extra: dict[str, str | int | float | bool] = {}
    if args.protocol == "classic":
        extra.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    if args.max_poll_interval_ms:
        extra["max.poll.interval.ms"] = args.max_poll_interval_ms
    worker = Worker(
        topics=[args.topic], group_id=args.group, bootstrap_servers=args.bootstrap,
        ordering=args.ordering, group_protocol=args.protocol, consumer_config=extra,
        retry=RetryPolicy(initial=0.2, backoff=2.0, max_interval=1.0, max_attempts=50),
        tiers=TierLadder((0.25, 0.5, 1.0)), drain_timeout=20.0,
    )
    rnd = random.Random()

    def effect(msg: Message) -> None:
        value = (msg.value or b"").decode()
        ledger.delivered(value, msg.topic, msg.partition, msg.offset, msg.attempt)
        if args.fail_rate and rnd.random() < args.fail_rate:
            raise ConnectionError("injected flaky failure")
        ledger.apply_once(value, value)

    if args.use_async:
        @worker.handler
        async def handle_async(msg: Message) -> None:
            if args.slow_ms:
                await asyncio.sleep(args.slow_ms / 1000)
            effect(msg)
    else:
        @worker.handler
        def handle(msg: Message) -> None:
            if args.slow_ms:
                time.sleep(args.slow_ms / 1000)
            effect(msg)

    worker.create_topics()  # idempotent; several workers may race to it
    print("worker ready", flush=True)
    worker.run()
    print("worker stopped cleanly", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

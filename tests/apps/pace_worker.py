"""A rate-limited worker process: each handler start goes to the append-only ledger with the
time taken at the handler's first line.

    python -m tests.apps.pace_worker BOOTSTRAP TOPIC GROUP --ledger PATH --rate 50 --burst 50
        [--scope pool|replica] [--store URL] [--name BUCKET] [--slow-ms N]

``--scope pool`` shares one bucket through ``--store`` (PostgreSQL or Redis, as the pool's
idempotency store would be); ``--scope replica`` gives each process its own bucket: the canary
that runs the pool at N times the rate.
"""

from __future__ import annotations

import argparse
import logging
import time

from kworkers import Message, Worker
from kworkers.pace import RateLimit, open_buckets
from kworkers.testing.ledger import Ledger


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("group")
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--burst", type=int, required=True)
    ap.add_argument("--scope", default="pool", choices=["pool", "replica"])
    ap.add_argument("--store")
    ap.add_argument("--name", default="")
    ap.add_argument("--slow-ms", type=float, default=0.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    ledger = Ledger(args.ledger)
    limit = RateLimit(per_second=args.rate, burst=args.burst, scope=args.scope, name=args.name)
    worker = Worker(
        [args.topic], args.group, args.bootstrap, rate_limit=limit, concurrency=4,
        rate_store=open_buckets(args.store) if args.scope == "pool" else None,
        consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})

    @worker.handler
    def handle(msg: Message) -> None:
        at = time.time()  # the start, before anything else
        ledger.delivered(f"{msg.partition}/{msg.offset}", msg, at=at)
        if args.slow_ms:
            time.sleep(args.slow_ms / 1000)

    worker.run()


if __name__ == "__main__":
    main()

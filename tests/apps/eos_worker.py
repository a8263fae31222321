"""A worker process for the exactly-once proof: each record's handler writes one start row to an
append-only ledger, then produces one output (its source place in a header) with
``activity.produce``; every fifth record fails its first attempt after producing (its retry
tier record rides in the transaction, its first output must never be seen), and every value
that is 7 modulo 50 is poison: dead-lettered after producing (its output never seen, its dead
letter once).

    python -m tests.apps.eos_worker BOOTSTRAP SOURCE OUTPUT GROUP --ledger PATH
        [--guarantee exactly_once|at_least_once] [--txn-id ID] [--slow-ms N] [--no-fencing]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from kworkers import Message, NonRetryableError, RetryPolicy, TierLadder, Worker, activity
from kworkers.testing.ledger import Ledger


class FirstAttemptFails(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("source")
    ap.add_argument("output")
    ap.add_argument("group")
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--guarantee", default="exactly_once")
    ap.add_argument("--txn-id", default=None)
    ap.add_argument("--slow-ms", type=float, default=5.0)
    ap.add_argument("--protocol", default="consumer")
    ap.add_argument("--no-fencing", action="store_true",
                    help="self-fencing off: only the broker's transactional fencing is left")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(message)s")
    ledger = Ledger(args.ledger)
    worker = Worker(
        topics=[args.source], group_id=args.group, bootstrap_servers=args.bootstrap,
        guarantee=args.guarantee, transactional_id=args.txn_id, group_protocol=args.protocol,
        concurrency=4, ordering="key", drain_timeout=5.0,
        retry=RetryPolicy(initial=0.2, backoff=2.0, max_interval=0.5, max_attempts=10),
        tiers=TierLadder((0.25, 0.5)), transaction_timeout=10.0,
        self_fencing=not args.no_fencing,
    )

    @worker.handler
    def handle(msg: Message) -> None:
        src = msg.header("kw-original-partition"), msg.header("kw-original-offset")
        place = (f"{src[0].decode()}@{src[1].decode()}" if src[0] and src[1]
                 else f"{msg.partition}@{msg.offset}")
        ledger.apply(place, msg, note=str(activity.attempt()))
        time.sleep(args.slow_ms / 1000)
        activity.produce(args.output, msg.value, key=msg.key, headers={"src": place})
        if int(msg.value or b"0") % 50 == 7:
            raise NonRetryableError("Poison", f"{place}: poison, after producing")
        if int(msg.value or b"0") % 5 == 0 and activity.attempt() == 1:
            raise FirstAttemptFails(f"{place}: the first attempt fails after producing")

    worker.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

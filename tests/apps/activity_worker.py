"""A worker process for the idempotent-receiver fault tests.

Each record is an activity (ids in kw-workflow-id / kw-activity-id headers); the effect is a
row in the ledger's effects table, keyed by the idempotency key. Options make it flaky, make it
die between claim and effect, or make it checkpoint with heartbeats and die.

    python -m tests.apps.activity_worker BOOTSTRAP TOPIC GROUP LEDGER STORE_URL [options]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
from pathlib import Path

from kworkers import Message, RetryableError, RetryPolicy, TierLadder, Worker, activity
from kworkers.idempotency import open_store
from kworkers.testing.effects import Ledger


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("group")
    ap.add_argument("ledger")
    ap.add_argument("store")
    ap.add_argument("--fail-rate", type=float, default=0.0)
    ap.add_argument("--die-between-claim-and-effect", metavar="MARKER_DIR")
    ap.add_argument("--heartbeat-and-die", metavar="MARKER_DIR")
    ap.add_argument("--lease-s", type=float, default=3.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(message)s")
    ledger = Ledger(args.ledger)
    store = open_store(args.store)
    worker = Worker(
        topics=[args.topic], group_id=args.group, bootstrap_servers=args.bootstrap,
        consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
        retry=RetryPolicy(initial=0.2, backoff=2.0, max_interval=1.0, max_attempts=100),
        tiers=TierLadder((0.25, 0.5, 1.0)), idempotency=store, lease_s=args.lease_s,
        drain_timeout=20.0,
    )
    rnd = random.Random()

    def once(marker_dir: str, key: str) -> bool:
        """True the first time this key gets here across all processes."""
        try:
            fd = os.open(Path(marker_dir) / key.replace("/", "_"), os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    @worker.handler
    def handle(msg: Message) -> None:
        key = activity.idempotency_key()
        ledger.delivered(key, msg.topic, msg.partition, msg.offset, activity.attempt())
        if args.heartbeat_and_die:
            details = activity.heartbeat_details()
            ledger.apply_once(f"seen/{key}/{activity.attempt()}",
                              f"{(details or b'').decode()}|{key}")
            if once(args.heartbeat_and_die, key):
                for i in (1, 2, 3):
                    activity.record_heartbeat(f"ckpt-{i}".encode())
                os.kill(os.getpid(), signal.SIGKILL)
        if args.die_between_claim_and_effect and once(args.die_between_claim_and_effect, key):
            os.kill(os.getpid(), signal.SIGKILL)  # claimed, effect not applied yet
        if args.fail_rate and rnd.random() < args.fail_rate:
            raise RetryableError("Flaky", "injected failure")
        ledger.apply_once(key, key)

    worker.create_topics()
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A worker whose first record takes its process down, for the crash-attempt fault tests.

    python -m tests.apps.crash_worker BOOTSTRAP TOPIC GROUP --ledger PATH --markers DIR
        [--store URL] [--lease-s S] [--max-attempts N] [--mode MODE] [--canary RULE]

Every handler run appends a row to the ledger (``ran/<value>``, note ``<attempt>|<heartbeat
details>``) before anything else, so the test counts runs from what it reads back. The record
whose value is ``0`` is the victim:

- ``--mode heartbeat-then-die``: its first run records the heartbeats ``ckpt-1..3`` and
  SIGKILLs its own process (a pod evicted mid-activity); later runs succeed;
- ``--mode die-always``: every run SIGKILLs its own process (a native crash or an OOM kill on
  one input). Each death leaves a marker file (its pid) in ``--markers``.

The retry policy is short, as the issue's: ``initial=0.5, backoff=1.0, max_interval=1.0``,
``--max-attempts``; ``group_protocol="consumer"``. ``--canary leases``: the rule before issue
#43 for a busy lease (a failed attempt); ``--canary crashes``: the rule before for a takeover
(it runs, never counted past the record's own attempt); ``--canary turns``: claims that do not
say where their delivery stands (a redelivery of work already handed on runs again).
``--commit-interval-s``: a long interval makes certain that a hand-off's source commit is not
made before its retry kills the process (the race CI met once at the 1 s default).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from kworkers import CommitPolicy, Message, RetryPolicy, TierLadder, Worker, activity
from kworkers.consumer import runner as runner_module
from kworkers.idempotency import open_store
from kworkers.testing.ledger import Ledger


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("group")
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--markers", required=True)
    ap.add_argument("--store")
    ap.add_argument("--lease-s", type=float, default=30.0)
    ap.add_argument("--max-attempts", type=int, default=4)
    ap.add_argument("--mode", choices=["heartbeat-then-die", "die-always"],
                    default="die-always")
    ap.add_argument("--canary", choices=["leases", "crashes", "turns"])
    ap.add_argument("--commit-interval-s", type=float, default=1.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=os.environ.get("KWORKERS_TEST_LOG_LEVEL", "WARNING"),
                        stream=sys.stderr, format="%(asctime)s %(process)d %(name)s %(message)s")
    if args.canary == "leases":
        runner_module.LEASES_WAIT = False
    elif args.canary == "crashes":
        activity.CRASHES_COUNT = False
    elif args.canary == "turns":
        activity.TURNS_TRACKED = False
    ledger = Ledger(args.ledger)
    markers = Path(args.markers)
    markers.mkdir(parents=True, exist_ok=True)
    store = open_store(args.store) if args.store else None
    worker = Worker(
        topics=[args.topic], group_id=args.group, bootstrap_servers=args.bootstrap,
        group_protocol="consumer", idempotency=store, lease_s=args.lease_s,
        retry=RetryPolicy(initial=0.5, backoff=1.0, max_interval=1.0,
                          max_attempts=args.max_attempts),
        tiers=TierLadder((1.0,)), drain_timeout=2.0,
        commit=CommitPolicy(interval_s=args.commit_interval_s))

    def die() -> None:
        (markers / f"died-{os.getpid()}").write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)

    @worker.handler
    def handle(msg: Message) -> None:
        value = (msg.value or b"").decode()
        details = activity.heartbeat_details()
        ledger.apply(f"ran/{value}", msg,
                     note=f"{activity.attempt()}|{(details or b'').decode()}")
        if value != "0":
            return
        if args.mode == "die-always":
            die()
        if not any(markers.iterdir()):  # heartbeat-then-die: the first run only
            for i in (1, 2, 3):
                activity.record_heartbeat(f"ckpt-{i}".encode())
            ledger.apply("heartbeats/0", msg, note=f"ckpt-3|{args.lease_s}")
            die()

    worker.create_topics()  # idempotent; several workers may race to it
    print("worker ready", flush=True)
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

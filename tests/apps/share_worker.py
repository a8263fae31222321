"""A share-mode worker process for the share suites: every delivery, its delivery count and every
application of the effect go to append-only ledgers, and the tests judge from them.

    python -m tests.apps.share_worker BOOTSTRAP TOPIC GROUP --store URL [options]

The effect is ``store.apply_once(key, ledger.apply_in)`` with a lease claim first
(``Worker(idempotency=store)``): the ledger lives in the store's database and its row commits
with the done-mark, so a redelivered record is absorbed (each effect once). ``--dc-ledger PATH``
records ``(key, delivery count)`` of every delivery the worker was given, before the receiver
can absorb it, in a standalone ledger (table ``share_dc``, the count in the note, the pid
beside it): the broker's count as the record carried it, written by a test instrument
(``CountingInvoker``), not a counter of the worker.

Faults: ``--crash-key KEY`` SIGKILLs the process before the effect on *every* delivery of KEY
(a record that kills its worker); ``--kill KEY@STEP`` as in ``ledger_worker`` (once per key).
Failures: ``--flaky-every N`` fails the first attempt of every N-th record (retryable),
``--poison-every M`` fails every M-th record for good (non-retryable).

``--metrics`` serves the worker's metrics (the share backlog gauge among them) on a free
loopback port and prints it.

Canaries (deliberately broken, each caught by a check in the suite):
``--canary accept-early`` returns from the handler before the effect (the effect runs on a
thread afterwards), so a kill in between loses it; ``--canary no-last-delivery`` disables the
last-delivery rule, so a crash-looping record is archived by the broker instead of reaching
the DLQ; ``--canary no-receiver`` applies the effect as a plain append, not through the
store's transaction, so a redelivery applies it twice; ``--canary dead-letter-all``
dead-letters every record (after its kill points), so nothing is left to effect; ``--canary
no-ack`` never sends an acknowledgement (each record's effect applied, the broker never told),
which only the group's state read back from the broker shows.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from kworkers import Message, NonRetryableError, RetryableError, RetryPolicy, TierLadder, Worker
from kworkers.activity import ActivityInvoker
from kworkers.idempotency import TransactionalStore, open_store
from kworkers.metrics import MetricsServer
from kworkers.share import delivery_count
from kworkers.testing.instruments import Deliveries, KillPoint, RecordingInvoker, message_key
from kworkers.testing.ledger import Ledger


class CountingInvoker:
    """An ``Invoker`` that appends each record's delivery count to ``counts``, then calls
    ``inner`` (placed before the receiver, so an absorbed redelivery is counted too)."""

    def __init__(self, counts: Ledger, inner: Any) -> None:
        self.counts = counts
        self.inner = inner
        #: a record run again after a lease wait is the same delivery, counted once
        self.deliveries = Deliveries()

    def __call__(self, handler: Any, msg: Message | list[Message]) -> Any:
        for m in msg if isinstance(msg, list) else (msg,):
            if self.deliveries.new(m):
                self.counts.apply(message_key(m), m, note=str(delivery_count(m)))
        return self.deliveries.call(self.inner, handler, msg)


LEASE_S = 2.0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("group")
    ap.add_argument("--store", required=True, help="idempotency store URL (sqlite/postgres)")
    ap.add_argument("--dc-ledger", help="standalone ledger for delivery counts")
    ap.add_argument("--slow-ms", type=float, default=0.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--crash-key", action="append", default=[])
    ap.add_argument("--kill", action="append", default=[], metavar="KEY@STEP")
    ap.add_argument("--markers", help="directory of the kill points' markers")
    ap.add_argument("--flaky-every", type=int, default=0)
    ap.add_argument("--poison-every", type=int, default=0)
    ap.add_argument("--canary", choices=["accept-early", "no-last-delivery", "no-receiver",
                                         "dead-letter-all", "no-ack"])
    ap.add_argument("--metrics", action="store_true",
                    help="serve /metrics on a free loopback port, printed as 'metrics port N'")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(message)s")
    kills = [KillPoint(spec, args.markers) for spec in args.kill]
    store: Any = open_store(args.store)
    txn: TransactionalStore[Any] = store
    ledger = Ledger.on_store(store)
    counts = Ledger(args.dc_ledger, table="share_dc") if args.dc_ledger else None
    if args.canary == "no-ack":
        from kworkers.kafka.share_consumer import ShareConsumerAdapter

        ShareConsumerAdapter.acknowledge = lambda self, key, kind: None  # type: ignore[method-assign]
    if args.canary == "no-last-delivery":
        from kworkers.share.rules import ShareRules

        ShareRules.is_last_delivery = lambda self, n: False  # type: ignore[method-assign,assignment]
    # The lease a killed member leaves on a key: the next member's attempt waits in its lane
    # for its end (LeaseBusy spends no attempt), then the takeover counts the dead attempt
    # (AttemptCrashed, retried through a tier): a 2 s lease keeps that wait short
    receiver = ActivityInvoker(store, lease_s=LEASE_S)
    invoker = RecordingInvoker(ledger, receiver if counts is None else
                               CountingInvoker(counts, receiver))
    worker = Worker(
        topics=[args.topic], group_id=args.group, bootstrap_servers=args.bootstrap,
        mode="share", concurrency=args.concurrency, invoke=invoker, drain_timeout=20.0,
        # the retry tiers' group: KIP-848, so processes starting one after another do not hold
        # the tier records behind classic rebalances (a revoke commit there waited 25 s)
        group_protocol="consumer",
        retry=RetryPolicy(initial=0.2, backoff=2.0, max_interval=1.0, max_attempts=12),
        tiers=TierLadder((0.25, 0.5)),
    )
    later: list[threading.Thread] = []

    def effect(key: str, msg: Message) -> None:
        for k in kills:
            k.at("before-effect", key)
        if args.canary == "no-receiver":
            ledger.apply(key, msg)  # no transaction with a done-mark: at least once
            return
        txn.apply_once(key, lambda conn: ledger.apply_in(conn, key, msg))

    @worker.handler
    def handle(msg: Message) -> None:
        key = message_key(msg)
        if args.slow_ms:
            time.sleep(args.slow_ms / 1000)
        if key in args.crash_key:
            os.kill(os.getpid(), signal.SIGKILL)
        n = int(key) if key.isdigit() else -1
        if args.canary == "dead-letter-all":
            for k in kills:
                k.at("before-effect", key)
            raise NonRetryableError("Poison", f"canary: every record dead-lettered ({key})")
        if args.poison_every and n % args.poison_every == 0:
            raise NonRetryableError("Poison", f"record {key} can never be handled")
        if args.flaky_every and n % args.flaky_every == 0 and msg.attempt == 1:
            raise RetryableError("Flaky", f"record {key} fails its first attempt")
        if args.canary == "accept-early":
            # a tuple of two calls' Nones: one lambda runs both
            t = threading.Thread(target=lambda: (time.sleep(1.0), effect(key, msg)),  # type: ignore[func-returns-value]
                                 daemon=True)
            t.start()
            later.append(t)
            return
        effect(key, msg)
        for k in kills:
            k.at("after-effect", key)

    worker.create_topics()  # idempotent; several workers may race to it
    if args.metrics:
        server = MetricsServer(worker.metrics, 0, host="127.0.0.1").start()
        print(f"metrics port {server.port}", flush=True)
    print("worker ready", flush=True)
    worker.run()
    for t in later:
        t.join()
    print("worker stopped cleanly", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

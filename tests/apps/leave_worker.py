"""A slow worker for the fast-leave tests: every handler start and every applied effect goes to
the append-only ledger (in the idempotency store's database, so the effect row commits with the
done-mark).

    python -m tests.apps.leave_worker BOOTSTRAP TOPIC GROUP STORE_URL [options]

``--slow-ms``: each handler call sleeps this long before its effect. ``--linger OFFSET:SECONDS``
(repeatable): the record at OFFSET of partition 0 sleeps this long *after* its effect (a slow
acknowledgement downstream), so a stop that does not wait for it leaves an applied effect whose
offset is not committed: the next owner gets the record again and the receiver absorbs it.

``--canary slow-drain`` is the leave the fast-leave test must catch: a stop that keeps the
lanes working through the fetched queue, for three times its bound and the kubelet's margin
(``GRACE_MARGIN_S``), so past the rendered grace period (before issue #16's fix a drain ran the
queue down for ``drain_timeout``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from kworkers import Message, Worker
from kworkers.activity import ActivityInvoker
from kworkers.idempotency import open_store
from kworkers.testing.instruments import RecordingInvoker, message_key
from kworkers.testing.ledger import Ledger


def _slow_drain() -> None:
    """The canary: a stop halts nothing (lanes go on through their queues) and the drain
    waits three times its bound for them, and the grace period's margin beyond: the kubelet
    would SIGKILL it (``kworkers.deploy.manifests.grace_period``)."""
    from kworkers.consumer.partition import PartitionState
    from kworkers.consumer.processor import Processor
    from kworkers.consumer.settings import LoopSettings
    from kworkers.deploy.manifests import GRACE_MARGIN_S

    bound = LoopSettings.started_work_bound
    PartitionState.halt = lambda self: None  # type: ignore[method-assign]
    Processor.stop = lambda self: self._stop.set()  # type: ignore[method-assign]
    LoopSettings.started_work_bound = (  # type: ignore[method-assign]
        lambda self: 3 * bound(self) + GRACE_MARGIN_S)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("group")
    ap.add_argument("store")
    ap.add_argument("--slow-ms", type=float, default=0.0)
    ap.add_argument("--linger", action="append", default=[], metavar="OFFSET:SECONDS")
    ap.add_argument("--drain-timeout", type=float, default=30.0)
    ap.add_argument("--message-timeout", type=float, default=None)
    ap.add_argument("--revoke-timeout", type=float, default=10.0)
    ap.add_argument("--canary", choices=["slow-drain"])
    args = ap.parse_args(argv)
    if args.canary == "slow-drain":
        _slow_drain()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(message)s")
    linger = {int(o): float(s) for o, s in (x.split(":") for x in args.linger)}
    store: Any = open_store(args.store)
    ledger = Ledger.on_store(store)
    worker = Worker(
        topics=[args.topic], group_id=args.group, bootstrap_servers=args.bootstrap,
        consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
        drain_timeout=args.drain_timeout, message_timeout=args.message_timeout,
        revoke_timeout=args.revoke_timeout, invoke=RecordingInvoker(ledger, ActivityInvoker()),
    )

    @worker.handler
    def handle(msg: Message) -> None:
        key = message_key(msg)
        if args.slow_ms:
            time.sleep(args.slow_ms / 1000)
        store.apply_once(key, lambda conn: ledger.apply_in(conn, key, msg))
        if msg.partition == 0 and msg.offset in linger:
            time.sleep(linger[msg.offset])

    worker.create_topics()  # idempotent
    print("worker ready", flush=True)
    worker.run()
    print("worker stopped cleanly", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A scheduler worker process for the scheduling proofs: the rungs of DEST, its ids' state in
STORE (a store URL), exactly once.

    python -m tests.apps.schedule_worker BOOTSTRAP STORE DEST GROUP --txn-id ID
        [--thresholds 2,5] [--horizon 5] [--fast-clock SECONDS]

Canaries: ``--fast-clock`` runs the worker's clock that many seconds ahead, so it releases and
delivers records early; ``--no-state`` delivers every copy without asking the id's state, so an
id scheduled twice arrives twice and a cancelled one arrives. The judge must catch both.
"""

from __future__ import annotations

import argparse
import logging
import sys

from kworkers import RetryPolicy, TierLadder
from kworkers.clock import SystemClock
from kworkers.idempotency import open_store
from kworkers.schedule import ScheduleLadder, Scheduler, Verdict


class FastClock(SystemClock):
    def __init__(self, ahead: float) -> None:
        self.ahead = ahead

    def now(self) -> float:
        return super().now() + self.ahead


#: the scheduler workers' retry settings (the test creates their tier topics with them)
SETTINGS = {"retry": RetryPolicy(initial=0.2, backoff=2.0, max_interval=0.5, max_attempts=10),
            "tiers": TierLadder((0.5,))}


def ladder(thresholds: str, horizon: float) -> ScheduleLadder:
    return ScheduleLadder(tuple(float(t) for t in thresholds.split(",")), horizon=horizon)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("store")
    ap.add_argument("dest")
    ap.add_argument("group")
    ap.add_argument("--txn-id", required=True)
    ap.add_argument("--thresholds", default="2,5")
    ap.add_argument("--horizon", type=float, default=5.0)
    ap.add_argument("--fast-clock", type=float, default=0.0)
    ap.add_argument("--no-state", action="store_true",
                    help="canary: every record delivered, the id's state never asked")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(message)s")
    clock = FastClock(args.fast_clock) if args.fast_clock else SystemClock()
    sched = Scheduler(args.bootstrap, open_store(args.store), [args.dest],
                      ladder=ladder(args.thresholds, args.horizon), clock=clock)
    if args.no_state:
        sched.state.claim_delivery = lambda *_: Verdict.DELIVER  # type: ignore[method-assign]
    worker = sched.worker(args.group, transactional_id=args.txn_id, concurrency=4,
                          drain_timeout=5.0, transaction_timeout=10.0, **SETTINGS)
    worker.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

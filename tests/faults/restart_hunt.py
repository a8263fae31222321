"""Hunting committed work run again around a broker's hard restart (issue #44, section 1).

    python -m tests.faults.restart_hunt [--rounds N] [--restarts R] [--records N] [--out DIR]

Not a test: a harness that repeats, many times per run, what the kill loop
(``test_idempotent_receiver.py::test_flaky_kill_loop_exactly_once``) does once: three
``ledger_worker`` processes (SQLite store, ``txn`` effect, half of the attempts failing) work
through an activity topic while the broker is SIGKILLed and restarted every few seconds and a
worker is SIGKILLed between restarts. Each round is judged by the same checker; a round that
finds ``rerun_committed`` or ``non_monotonic`` writes the evidence (the sampler's readings,
``__consumer_offsets``, every worker's commit trail and its client's offset fetches,
``support.commit_evidence``) and the broker's log under ``--out``. One broker at a time.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import threading
import time
from pathlib import Path

from kworkers.idempotency import open_store
from kworkers.testing.broker import broker_from_env
from kworkers.testing.checker import CommitSampler, FaultLog, check, read_log
from kworkers.testing.ledger import Ledger
from kworkers.testing.processes import WorkerProcess, keep_alive
from kworkers.testing.workload import make_topic, produce_activities, unique
from tests.faults.support import COMMIT_LOG_ENV, commit_evidence

ROOT = str(Path(__file__).resolve().parents[2])
#: set by SIGTERM: the round ends at its next step (judged, its broker and workers closed)
STOP = threading.Event()


def one_round(out: Path, records: int, restarts: int, every_s: float, rnd: random.Random
              ) -> bool:
    out.mkdir(parents=True, exist_ok=True)
    broker = broker_from_env(own=True)
    broker.start()
    workers: list[WorkerProcess] = []
    try:
        bs = broker.bootstrap_servers
        topic, group = make_topic(bs, unique("hunt"), 6), unique("g")
        url = f"sqlite:///{out}/store.db"
        ledger = Ledger.on_store(open_store(url))  # type: ignore[arg-type]
        keys = set(produce_activities(bs, topic, records, unique("act")))
        args = ["-m", "tests.apps.ledger_worker", bs, topic, group, "--store", url,
                "--effect", "txn", "--claim", "--fail-rate", "0.5", "--lease-s", "3",
                "--slow-ms", "20"]
        workers = [WorkerProcess(args, out, f"w{i}", cwd=ROOT, env=COMMIT_LOG_ENV)
                   for i in range(3)]
        commits = CommitSampler(bs, group, topic).start()
        faults = FaultLog(commits.latest, settle_s=3.0)
        tick = keep_alive(workers, faults)
        tick()
        done_restarts = 0
        next_fault = time.monotonic() + every_s
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and not STOP.is_set():
            tick()
            applied = set(ledger.applications()) & keys
            positions = commits.samples[-1].positions if commits.samples else {}
            if applied >= keys and done_restarts >= restarts and \
                    sum(max(0, p) for p in positions.values()) >= records:
                break
            if time.monotonic() >= next_fault and done_restarts < restarts and \
                    not STOP.is_set():
                if rnd.random() < 0.5:
                    victim = rnd.choice(workers)
                    if victim.alive:
                        victim.kill()
                        tick()
                time.sleep(rnd.uniform(0, 2))
                broker.restart(hard=True)
                faults.record("broker SIGKILL and restart")
                done_restarts += 1
                next_fault = time.monotonic() + every_s
            time.sleep(0.2)
        for w in workers:
            if w.alive:
                w.terminate()
        samples = commits.stop()
        report = check(ledger, log=read_log(bs, topic), faults=faults.faults, commits=samples)
        moved = ({p for p, _ in report.rerun_committed} |
                 {p for p, *_ in report.non_monotonic})
        print(f"{out.name}: restarts {done_restarts} {report.summary()} "
              f"sampler gaps {commits.gaps}", flush=True)
        logs = [(w.log_path.stem, w.log()) for w in workers]
        commit_evidence(set(samples[-1].positions), topic=topic, group=group, bootstrap=bs,
                        samples=samples, deliveries=ledger.deliveries(), faults=faults.faults,
                        logs=logs, out=out / "evidence-all.txt")  # every round's, to compare
        if moved:
            (out / "broker.log").write_text(broker.logs())
            commit_evidence(moved, topic=topic, group=group, bootstrap=bs, samples=samples,
                            deliveries=ledger.deliveries(), faults=faults.faults,
                            logs=logs, out=out / "evidence.txt")
            print(f"{out.name}: EVIDENCE in {out / 'evidence.txt'}", flush=True)
        return not moved
    finally:
        for w in workers:
            w.close()
        broker.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--restarts", type=int, default=8)
    ap.add_argument("--every", type=float, default=8.0, help="seconds between restarts")
    ap.add_argument("--records", type=int, default=1500)
    ap.add_argument("--out", default="/tmp/kworkers-restart-hunt")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    # SIGTERM stops it cleanly (the round judged, its broker and workers closed); a
    # background job ignores SIGINT
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    rnd = random.Random(args.seed)
    bad = 0
    for i in range(args.rounds):
        if STOP.is_set():
            break
        ok = one_round(Path(args.out) / f"round-{i + 1}", args.records, args.restarts,
                       args.every, rnd)
        bad += not ok
    print(f"{args.rounds} rounds, {bad} with committed work run again or moved back")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

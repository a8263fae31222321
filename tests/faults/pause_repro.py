"""A bounded attempt to reproduce librdkafka's abort after a broker pause (issue #43, item 3).

    bash -c 'source scripts/lib.sh && ensure_kafka && \\
             .venv/bin/python -m tests.faults.pause_repro --minutes 20 --workdir /tmp/repro'

Not a test (it proves nothing when the abort does not come, and it takes minutes): a tool run
by hand, whose figures docs/RELIABILITY.md keeps. A broker of its own (``broker_from_env``),
an 8-partition topic under steady production, 4 worker processes (``kworkers run
tests.apps.abort_worker:worker``, which never aborts on these records), and a loop: freeze the
broker (``docker pause``) for 60, 20, 40 or 10 s, thaw it, give the workers 20 s, look at every
worker (alive? its exit status, an ``Assertion`` or a ``Fatal Python error`` in its output) and
start again any that died, as Kubernetes would. At the end production stops, the workers drain
and the append-only ledger says whether every record produced was applied (nothing lost).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from kworkers.testing.broker import Broker, broker_from_env
from kworkers.testing.ledger import Ledger
from kworkers.testing.workload import committed_total, end_offsets_total, make_topic, unique

ROOT = str(Path(__file__).resolve().parents[2])
PAUSES = (60.0, 20.0, 40.0, 10.0)
PARTS = 8


class _Worker:
    def __init__(self, n: int, bs: str, topic: str, group: str, work: Path) -> None:
        self.n, self.log = n, work / f"worker-{n}.log"
        self.env = {**os.environ, "KWORKERS_BOOTSTRAP_SERVERS": bs, "KWORKERS_TOPICS": topic,
                    "KWORKERS_GROUP_ID": group, "ABORT_WORKER_DIR": str(work),
                    "PYTHONUNBUFFERED": "1"}
        self.proc: subprocess.Popen[bytes] | None = None
        self.exits: list[int] = []

    def start(self) -> None:
        with open(self.log, "ab") as out:
            out.write(f"--- start {len(self.exits) + 1}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kworkers.cli", "run", "tests.apps.abort_worker:worker"],
                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)

    def check(self) -> int | None:
        """The exit status if it died (then it is started again), else None."""
        assert self.proc is not None
        rc = self.proc.poll()
        if rc is None:
            return None
        self.exits.append(rc)
        self.start()
        return rc

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _produce(bs: str, topic: str, stop: threading.Event, sent: list[int]) -> None:
    p = Producer({"bootstrap.servers": bs, "linger.ms": 5, "enable.idempotence": True,
                  "log_level": 3, "message.timeout.ms": 600_000})
    i = 0
    while not stop.is_set():
        try:
            p.produce(topic, key=f"k{i % 64}".encode(), value=str(i).encode())
            i += 1
        except BufferError:
            p.poll(0.1)
            continue
        p.poll(0)
        time.sleep(0.005)  # about 200 records a second
    p.flush(600)
    sent.append(i)


def _pause(broker: Broker) -> bool:
    """``docker pause``, tried a few times: the cgroup freezer sometimes refuses ("unable to
    freeze") on a loaded machine."""
    for _ in range(5):
        try:
            broker.pause()
            return True
        except Exception as exc:
            print(f"  pause refused: {str(exc)[-120:]}", flush=True)
            time.sleep(1)
    return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    broker = broker_from_env()
    broker.start()
    workers: list[_Worker] = []
    stop = threading.Event()
    sent: list[int] = []
    try:
        bs = broker.bootstrap_servers
        topic, group = make_topic(bs, unique("pause-repro"), PARTS), unique("g-repro")
        producer = threading.Thread(target=_produce, args=(bs, topic, stop, sent), daemon=True)
        producer.start()
        workers = [_Worker(n, bs, topic, group, work) for n in range(4)]
        for w in workers:
            w.start()
        time.sleep(20)
        end = time.monotonic() + args.minutes * 60
        cycle = 0
        while time.monotonic() < end:
            pause = PAUSES[cycle % len(PAUSES)]
            cycle += 1
            if not _pause(broker):  # docker could not freeze it (seen under load): next one
                print(f"cycle {cycle}: the broker could not be frozen", flush=True)
                time.sleep(5)
                continue
            print(f"cycle {cycle}: broker frozen {pause:.0f}s", flush=True)
            time.sleep(pause)
            broker.resume()
            time.sleep(20)
            for w in workers:
                rc = w.check()
                if rc is not None:
                    text = w.log.read_text("utf-8", "replace")
                    print(f"  worker {w.n} exited {rc}; assertion in its output: "
                          f"{'Assertion' in text}; faulthandler stack: "
                          f"{'Fatal Python error' in text}", flush=True)
        stop.set()
        producer.join(600)
        total = sent[0] if sent else 0
        ledger = Ledger(work / "ledger.db")
        deadline = time.monotonic() + 300
        while committed_total(bs, group, topic, PARTS) < end_offsets_total(bs, topic, PARTS) \
                and time.monotonic() < deadline:
            for w in workers:
                w.check()
            time.sleep(2)
        applied = set(ledger.applications())
        missing = [i for i in range(total) if str(i) not in applied]
        print(f"{cycle} pauses; worker exits: {[w.exits for w in workers]}; produced {total}, "
              f"applied {len(applied)}, missing {len(missing)} {missing[:10]}", flush=True)
        return 0
    finally:
        stop.set()
        for w in workers:
            w.stop()
        broker.close()


if __name__ == "__main__":
    sys.exit(main())

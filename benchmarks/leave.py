"""leave: seconds from SIGTERM to exit with a slow handler and a large backlog, and how soon
another member handles the partitions that moved.

Member A runs as an operator runs it (``kworkers run``, default settings, a 10 ms sync handler)
in a process of its own; member B runs beside it (a Worker in this process, same handler) and
owns the other half of the partitions. Both have a backlog far larger than they can handle in
the run. A gets SIGTERM; figures:

- ``exit_s``: SIGTERM to A's exit. A stops dispatching its fetched backlog at once and waits for
  handler calls already started (about one handler duration), commits, leaves the group;
- ``moved_s``: SIGTERM to B's first record on the last of A's partitions: A's leave, the
  rebalance, B's fetch. Under the classic protocol B learns of the rebalance at its next
  heartbeat (``heartbeat.interval.ms``: 3 s by default, 500 ms here, as stated in the table);
  under KIP-848 the broker's ``group.consumer.heartbeat.interval.ms`` rules (500 ms on the
  test broker);
- ``fair``: over the 3 s after that, the fewest records B started on one partition divided by
  the most (1.0: every partition, moved or its own, got the same share of B's runners).

Each protocol is run ≥ 3 times, alternated; medians and spreads are printed.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

from benchmarks.common import Mode, console, kafka, produce_fill, quiet_logs, result, table
from kworkers import Message, Worker
from kworkers.testing.broker import free_port
from kworkers.testing.workload import make_topic, unique

PARTITIONS = 6
HANDLER_MS = 10
CLASSIC = {"heartbeat.interval.ms": 500, "session.timeout.ms": 6000}
ROOT = Path(__file__).resolve().parents[1]


def _records_ok(port: int, group: str) -> float:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return -1.0
    for line in text.decode().splitlines():
        if line.startswith(f'kworkers_records_total{{group="{group}",outcome="ok"}}'):
            return float(line.split()[-1])
    return 0.0


def _one(bs: str, n: int, protocol: str) -> tuple[float, float, float]:
    topic, group = make_topic(bs, unique("leave"), PARTITIONS), unique("g")
    produce_fill(bs, topic, n, PARTITIONS)
    port = free_port()
    env = {**os.environ, "KWORKERS_BOOTSTRAP_SERVERS": bs, "KWORKERS_TOPICS": topic,
           "KWORKERS_GROUP_ID": group, "KWORKERS_GROUP_PROTOCOL": protocol,
           "LEAVE_HANDLER_MS": str(HANDLER_MS)}
    args = [sys.executable, "-m", "kworkers.cli", "run", "benchmarks.leave_app:worker",
            "--metrics-port", str(port), "--log-level", "WARNING"]
    if protocol == "classic":
        args += [x for k, v in CLASSIC.items() for x in ("-X", f"{k}={v}")]
    a = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    first: dict[int, float] = {}
    starts: Counter[int] = Counter()
    counting = threading.Event()
    lock = threading.Lock()
    b = Worker(topics=[topic], group_id=group, bootstrap_servers=bs, group_protocol=protocol,
               consumer_config=dict(CLASSIC) if protocol == "classic" else {})

    @b.handler
    def handle(msg: Message) -> None:
        now = time.monotonic()
        with lock:
            first.setdefault(msg.partition, now)
            if counting.is_set():
                starts[msg.partition] += 1
        time.sleep(HANDLER_MS / 1000)

    t = threading.Thread(target=b.run, args=(False,), daemon=True)
    try:
        deadline = time.monotonic() + 60
        while _records_ok(port, group) < 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        t.start()
        # both members working: B owns some partitions, A the rest
        while not (b.loops and len(b.loops[0].parts) and len(b.loops[0].parts) < PARTITIONS):
            if time.monotonic() > deadline + 60:
                raise TimeoutError("B never got a share of the partitions")
            time.sleep(0.05)
        time.sleep(2.0)
        mine = {p for (_t, p) in b.loops[0].parts}
        a_parts = set(range(PARTITIONS)) - mine
        with lock:
            first.clear()
            for p in mine:
                first[p] = 0.0
        t_sig = time.monotonic()
        a.send_signal(signal.SIGTERM)
        a.wait(120)
        exit_s = time.monotonic() - t_sig
        deadline = time.monotonic() + 60
        while not a_parts <= set(first) and time.monotonic() < deadline:
            time.sleep(0.01)
        moved_s = max(first[p] for p in a_parts) - t_sig if a_parts <= set(first) else float("nan")
        counting.set()
        time.sleep(3.0)
        with lock:
            got = [starts.get(p, 0) for p in range(PARTITIONS)]
        fair = min(got) / max(got) if max(got) else float("nan")
    finally:
        if a.poll() is None:
            a.kill()
        b.stop()
        t.join(60)
    return exit_s, moved_s, fair


def main(mode: Mode) -> None:
    quiet_logs()
    n = mode.pick(6_000, 60_000, 300_000)
    runs = mode.pick(1, 3, 3)
    out: dict[str, list[tuple[float, float, float]]] = {"classic": [], "consumer": []}
    with kafka() as bs:
        for i in range(runs):
            for protocol in ("classic", "consumer") if i % 2 == 0 else ("consumer", "classic"):
                r = _one(bs, n, protocol)
                out[protocol].append(r)
                console.print(f"[dim]run {i + 1} {protocol}: exit {r[0]:.2f}s, moved "
                              f"partitions handled by B after {r[1]:.2f}s, fairness "
                              f"{r[2]:.2f}[/dim]")
    rows = []
    med: dict[str, tuple[float, float, float]] = {}
    for protocol, rs in out.items():
        ex = [r[0] for r in rs]
        mv = [r[1] for r in rs]
        fa = [r[2] for r in rs]
        med[protocol] = (statistics.median(ex), statistics.median(mv), statistics.median(fa))
        rows.append([protocol, f"{med[protocol][0]:.2f} ({min(ex):.2f}-{max(ex):.2f})",
                     f"{med[protocol][1]:.2f} ({min(mv):.2f}-{max(mv):.2f})",
                     f"{med[protocol][2]:.2f} ({min(fa):.2f}-{max(fa):.2f})"])
    table(f"leave: SIGTERM with a {HANDLER_MS} ms handler and {n:,} records of backlog on "
          f"{PARTITIONS} partitions; classic heartbeat 500 ms, KIP-848 broker heartbeat "
          "500 ms", ["protocol", "SIGTERM -> exit s (spread)", "SIGTERM -> moved partitions "
                     "handled s (spread)", "B's starts min/max per partition (spread)"], rows)
    result("leave", {"exit_s_classic": round(med["classic"][0], 3),
                     "exit_s_consumer": round(med["consumer"][0], 3),
                     "moved_s_classic": round(med["classic"][1], 3),
                     "moved_s_consumer": round(med["consumer"][1], 3),
                     "fair_classic": round(med["classic"][2], 3),
                     "fair_consumer": round(med["consumer"][2], 3),
                     "handler_ms": HANDLER_MS, "backlog": n, "runs": runs})

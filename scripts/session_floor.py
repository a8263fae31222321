"""By hand (issue #42): can the test broker's 6 s group session drop without false expulsions?

For each session timeout asked for, a broker of its own (the test broker's settings with the
session and heartbeat overridden), then a classic group and a KIP-848 group of MEMBERS consumer
processes each, on a loaded machine (LOAD spinning processes beside them, plus whatever else
runs), reading a topic that keeps receiving records and spending CPU on each. After the groups
have formed, nothing is killed or stopped: every partition revoked or lost during the WINDOW is
a false expulsion (or a rebalance caused by one). Counted from the members' own rebalance
callbacks, written to files by the member processes, and the records delivered twice (read back
from what each member wrote). Prints one line per session and protocol.

    .venv/bin/python scripts/session_floor.py [--sessions 6000,3000,2000] [--window 90] [--load 4]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kworkers.testing.broker import broker_from_env

PARTITIONS = 6
MEMBERS = 3


def spin(stop_at: float) -> None:
    while time.time() < stop_at:
        sum(i * i for i in range(10_000))


def member(bootstrap: str, topic: str, group: str, protocol: str, session_ms: int,
           out: str, stop_at: float) -> None:
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": group,
                            "auto.offset.reset": "earliest", "enable.auto.commit": True,
                            "log_level": 0}
    if protocol == "classic":
        conf |= {"group.protocol": "classic", "session.timeout.ms": session_ms,
                 "heartbeat.interval.ms": max(100, session_ms // 10),
                 "partition.assignment.strategy": "cooperative-sticky"}
    else:
        conf |= {"group.protocol": "consumer"}
    events = open(out, "a", buffering=1)  # noqa: SIM115 - kept open for the member's life

    def note(kind: str, parts: list[Any]) -> None:
        events.write(json.dumps({"t": time.time(), "kind": kind,
                                 "parts": [p.partition for p in parts]}) + "\n")

    consumer = Consumer(conf)
    consumer.subscribe([topic], on_assign=lambda c, p: note("assign", p),
                       on_revoke=lambda c, p: note("revoke", p),
                       on_lost=lambda c, p: note("lost", p))
    while time.time() < stop_at:
        msg = consumer.poll(0.5)
        if msg is None or msg.error():
            continue
        events.write(json.dumps({"t": time.time(), "kind": "rec",
                                 "key": (msg.key() or b"").decode()}) + "\n")
        spin(time.time() + 0.005)  # a handler's CPU
    consumer.close()
    events.close()


def produce(bootstrap: str, topic: str, stop_at: float) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
    n = 0
    while time.time() < stop_at:
        for _ in range(50):
            producer.produce(topic, key=str(n).encode(), value=b"x" * 100)
            n += 1
        producer.poll(0)
        time.sleep(0.1)
    producer.flush(10)


def judge(files: list[Path], formed_at: float, ends_at: float) -> tuple[int, int, int]:
    """(revocations or losses after formation and before the members close, records seen
    twice, records seen)."""
    moves, seen, twice = 0, set[str](), 0
    for f in files:
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if (e["kind"] in ("revoke", "lost") and formed_at < e["t"] < ends_at - 1.0
                    and e["parts"]):  # a member's own close revokes too: not counted
                moves += 1
            elif e["kind"] == "rec":
                twice += e["key"] in seen
                seen.add(e["key"])
    return moves, twice, len(seen)


def run(session_ms: int, window: float, load: int) -> None:
    heartbeat = max(200, session_ms // 12)
    broker = broker_from_env(own=True, extra_env={
        "KAFKA_GROUP_CONSUMER_SESSION_TIMEOUT_MS": str(session_ms),
        "KAFKA_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": str(heartbeat),
        "KAFKA_GROUP_CONSUMER_MIN_HEARTBEAT_INTERVAL_MS": str(min(200, heartbeat))})
    broker.start()
    try:
        bs = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bs, "log_level": 0})
        topics = {p: f"floor-{p}-{session_ms}" for p in ("classic", "consumer")}
        for f in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics.values()],
                                     operation_timeout=30).values():
            f.result()
        tmp = Path(tempfile.mkdtemp(prefix="floor-"))
        formation = 20.0
        stop_at = time.time() + formation + window
        procs: list[Any] = []
        files: dict[str, list[Path]] = {p: [] for p in topics}
        for _ in range(load):
            procs.append(mp.Process(target=spin, args=(stop_at,)))
        for protocol, topic in topics.items():
            threading.Thread(target=produce, args=(bs, topic, stop_at), daemon=True).start()
            for i in range(MEMBERS):
                out = tmp / f"{protocol}-{i}.jsonl"
                files[protocol].append(out)
                procs.append(mp.Process(target=member, args=(
                    bs, topic, f"g-{protocol}", protocol, session_ms, str(out), stop_at)))
        for p in procs:
            p.start()
        formed_at = time.time() + formation
        for p in procs:
            p.join(formation + window + 60)
        for protocol in topics:
            moves, twice, seen = judge(files[protocol], formed_at, stop_at)
            print(f"session {session_ms / 1000:g} s, heartbeat {heartbeat} ms, {protocol:8} "
                  f"{MEMBERS} members, load +{load} spinning, {window:.0f} s after formation: "
                  f"revocations/losses {moves}, records delivered twice {twice} of {seen} "
                  f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        broker.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", default="6000,3000,2000")
    ap.add_argument("--window", type=float, default=90.0)
    ap.add_argument("--load", type=int, default=4)
    args = ap.parse_args()
    for s in args.sessions.split(","):
        run(int(s), args.window, args.load)
    return 0


if __name__ == "__main__":
    sys.exit(main())

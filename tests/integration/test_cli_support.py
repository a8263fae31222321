"""Helpers shared by the CLI tests (no tests here): run the real entry point, make dead letters.

Every CLI test runs ``python -m kworkers.cli`` as a subprocess, as an operator would, so exit
codes, stdout and stderr are the real ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kworkers import Message, NonRetryableError, RetryPolicy, TierLadder, Worker
from kworkers.envelope import ActivityTask, SingleObjectCodec
from kworkers.testing.workload import make_topic, produce, read_all, unique
from tests.integration.conftest import running, wait_for

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, env: Mapping[str, str] | None = None, timeout: float = 120.0,
        cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """``kworkers ARGS`` through its real entry point; the timeout only bounds a hang."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "kworkers.cli", *args], capture_output=True,
                          text=True, env=full_env, timeout=timeout, cwd=cwd or ROOT)


def one_error_line(p: subprocess.CompletedProcess[str]) -> str:
    """The single ``kworkers: error:`` line of a failed command (asserts there is one)."""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("kworkers: error: "), p.stderr
    assert "Traceback" not in p.stdout + p.stderr
    return lines[0]


@dataclass(frozen=True)
class DeadLetters:
    topic: str
    dlq: str
    group: str
    poison: dict[int, str]  # record number -> error type
    envelope: int  # the record number whose value is a task envelope


def make_dead_letters(bootstrap: str, n: int = 12,
                      error_type: Callable[[int], str | None] | None = None,
                      partitions: int = 3) -> DeadLetters:
    """Produce ``n`` records (key ``k<i>``, value ``v<i>``; record 3 an Avro task envelope) and
    run a Worker whose handler raises ``NonRetryableError(error_type(i))`` for some of them,
    until all of those are in the DLQ."""
    pick = error_type or (lambda i: ("Malformed" if i % 2 == 0 else "Expired")
                          if i % 3 == 0 else None)
    poison = {i: t for i in range(n) if (t := pick(i)) is not None}
    topic = make_topic(bootstrap, unique("cli"), partitions)
    codec = SingleObjectCodec()

    def value(i: int) -> bytes:
        if i == 3:
            return codec.encode(ActivityTask("wf-3", "act-3", "charge", b"amount=3"))
        return f"v{i}".encode()

    w = Worker(topics=[topic], group_id=unique("g"), bootstrap_servers=bootstrap,
               retry=RetryPolicy(initial=0.2, max_attempts=2), tiers=TierLadder((0.25,)))
    w.create_topics()
    produce(bootstrap, topic, ((f"k{i}".encode(), value(i)) for i in range(n)))

    @w.handler
    def handle(msg: Message) -> None:
        i = int((msg.key or b"k-1")[1:])
        if i in poison:
            raise NonRetryableError(poison[i], f"record {i} cannot be handled")

    dlq = w.config.tiers.dlq_topic(topic)
    with running(w):
        wait_for(lambda: len(read_all(bootstrap, dlq, 5)) >= len(poison), 90,
                 f"{len(poison)} dead letters")
    return DeadLetters(topic, dlq, w.config.group_id, poison, 3)

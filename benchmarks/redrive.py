"""A redrive at scale: N dead letters replayed by ``kworkers dlq redrive``, and once more with a
SIGKILL at 50 % and a rerun, every replay then counted from the broker (issue #50, item 4).

Two DLQs of N dead letters each (``<source>.dlq``, 6 partitions, 100-byte values, the headers
kworkers' DLQ path writes), produced straight to the DLQ (a worker failing N records would take
longer than the redrive). Then, each as an operator runs it (``python -m kworkers.cli``, a
process of its own, timed from its start to its exit; CPU seconds from the kernel for that
process, ``os.wait4``, and its peak RSS, ``VmHWM``):

- ``clean``: one redrive of the first DLQ, start to end;
- ``crash``: a redrive of the second DLQ that SIGKILLs itself after N/2 replays inside an open
  transaction (``KWORKERS_REDRIVE_CRASH_AFTER``), then the same command again.

Both are judged from data read back, not from the tool's counters: the source topic read
``read_committed`` (as workers read it), counting each replay's ``kw-redrive-of`` (the DLQ
coordinate it replays), and the ledger ``<dlq>.redriven`` counting its keys, with ``kcat``
when it is installed (an independent client), else a plain confluent-kafka consumer. Exactly
once: every one of the N coordinates replayed once (``missing=0``, ``duplicates=0``) and
marked once in the ledger.

Aim: N = 1,000,000 in <= 10 minutes on this machine, memory bounded (the RSS here, and the
bound ``kworkers.dlq.sweep`` states).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import Mode, console, fast_producer, fmt, kafka, result
from kworkers.kafka.admin import admin_client, create_topics
from kworkers.message import Message
from kworkers.retry_tiers.headers import dead_letter_headers
from kworkers.retry_tiers.routing import DeadLetterDecision
from kworkers.testing.workload import produce_patiently, unique
from kworkers.topic_names import ledger_topic
from kworkers.topic_plan import TopicSpec

PARTITIONS = 6
VALUE_SIZE = 100
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Run:
    """One ``kworkers dlq redrive`` process: how it ended and what it cost."""

    status: int
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    last_line: str

    def __str__(self) -> str:
        return (f"exit {self.status}, {self.wall_s:.1f}s wall, {self.cpu_s:.1f}s CPU, peak RSS "
                f"{self.peak_rss_mb:.0f} MiB" + (f": {self.last_line}" if self.status == 0
                                                  else ""))


@dataclass(frozen=True)
class ReadBack:
    """What the broker holds after the redrives of one DLQ of ``n``."""

    replays: int
    distinct: int
    duplicates: int
    missing: int
    ledger_records: int
    ledger_keys: int
    reader: str

    @property
    def exactly_once(self) -> bool:
        return (self.duplicates == 0 and self.missing == 0 and self.replays == self.distinct
                and self.ledger_keys == self.distinct)


def make_dlq(bs: str, n: int) -> tuple[str, str]:
    """A source topic and its DLQ holding ``n`` dead letters (as kworkers' DLQ path writes
    them: the failure headers and Spring's aliases); returns (source, dlq)."""
    source = unique("bench-redrive")
    dlq = f"{source}.dlq"
    create_topics(admin_client(bs), [TopicSpec(t, PARTITIONS, 1) for t in (source, dlq)])
    p = fast_producer(bs)
    decision = DeadLetterDecision(5, "exhausted", "Timeout", "the downstream timed out")
    pad = b"x" * VALUE_SIZE
    at = time.time()
    for i in range(n):
        part = i % PARTITIONS
        key = b"k%d" % i
        value = (b"%d:" % i + pad)[:VALUE_SIZE]
        src = Message(source, part, i // PARTITIONS, key, value, (), 1_700_000_000_000)
        headers: list[tuple[str, str | bytes | None]] = list(
            dead_letter_headers(src, "bench", decision, at))
        produce_patiently(p, dlq, value=value, key=key, headers=headers, partition=part)
        if i % 20_000 == 0:
            p.poll(0)
    if p.flush(300):
        raise RuntimeError(f"dead letters not delivered to {dlq}")
    return source, dlq


def redrive(bs: str, dlq: str, env: dict[str, str] | None = None,
            module: str = "kworkers.cli") -> Run:
    """``kworkers dlq redrive`` as an operator runs it, timed from the process's start
    (``module``: the entry point; a test's canary runs a broken redrive through its own)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    with tempfile.TemporaryFile() as out:
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", module, "dlq", "redrive",
                                 "-b", bs, "--dlq", dlq], stdout=out, stderr=subprocess.STDOUT,
                                env=full_env, cwd=ROOT)
        peak_kb, status, usage = _follow(proc.pid)
        wall = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        lines = out.read().decode("utf-8", "replace").strip().splitlines()
    return Run(proc.returncode, wall, usage.ru_utime + usage.ru_stime, peak_kb / 1024,
               lines[-1] if lines else "")


def _follow(pid: int) -> tuple[int, int, resource.struct_rusage]:
    """Waits for ``pid``: its peak RSS in KiB (``VmHWM``, read every 0.1 s: a high-water mark,
    so the last reading is the peak but for the last 0.1 s), its wait status and its rusage.
    Not ``ru_maxrss``: Linux carries the RSS of the process that forked it (this one, with
    the producer's buffers) across the ``exec`` into it."""
    peak = 0
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return peak, status, usage
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.1)


def _kcat(bs: str, topic: str, fmt_: str) -> list[str]:
    p = subprocess.run(["kcat", "-C", "-b", bs, "-t", topic, "-e", "-q", "-f", fmt_,
                        "-X", "isolation.level=read_committed"], capture_output=True,
                       check=True, timeout=1800)
    return p.stdout.decode("utf-8", "replace").splitlines()


def _client(bs: str, topic: str, what: str) -> list[str]:
    """Every committed record of ``topic`` to its end: a plain confluent-kafka consumer (not
    kworkers' reader, the code under test), one string per record (``what``: key or the
    kw-redrive-of header)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bs, "group.id": unique("bench-read"),
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "enable.partition.eof": True, "isolation.level": "read_committed"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in parts}
        pending = {p for p, hi in ends.items() if hi > 0}
        c.assign([TopicPartition(topic, p, 0) for p in pending])
        out: list[str] = []
        deadline = time.monotonic() + 1800
        while pending and time.monotonic() < deadline:
            for m in c.consume(1000, 1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition())
                    continue
                if what == "key":
                    out.append((m.key() or b"").decode())
                else:
                    of = dict(m.headers() or []).get("kw-redrive-of")
                    if isinstance(of, bytes):
                        out.append(of.decode())
                if (m.offset() or 0) >= ends[m.partition() or 0] - 1:
                    pending.discard(m.partition() or 0)
        if pending:
            raise TimeoutError(f"reading {topic} did not reach its end")
        return out
    finally:
        c.close()


def read_back(bs: str, source: str, dlq: str, n: int) -> ReadBack:
    """The replays in ``source`` and the markers in the ledger, counted from the broker."""
    if shutil.which("kcat"):
        reader = "kcat"
        replays = [h.split("kw-redrive-of=", 1)[1].split(",", 1)[0]
                   for h in _kcat(bs, source, "%h\n") if "kw-redrive-of=" in h]
        marks = _kcat(bs, ledger_topic(dlq), "%k\n")
    else:
        reader = "confluent-kafka"
        replays = _client(bs, source, "kw-redrive-of")
        marks = _client(bs, ledger_topic(dlq), "key")
    counts = Counter(replays)
    expected = {f"{dlq}/{i % PARTITIONS}/{i // PARTITIONS}" for i in range(n)}
    return ReadBack(len(replays), len(counts), sum(1 for c in counts.values() if c > 1),
                    len(expected - counts.keys()), len(marks), len(set(marks) & expected),
                    reader)


def main(mode: Mode) -> None:
    n = mode.pick(2_000, 100_000, 1_000_000)
    with kafka() as bs:
        load_before = os.getloadavg()
        t0 = time.monotonic()
        source, dlq = make_dlq(bs, n)
        source2, dlq2 = make_dlq(bs, n)
        console.print(f"{n:,} dead letters in each of two DLQs, produced in "
                      f"{time.monotonic() - t0:.1f}s (load average before: "
                      f"{load_before[0]:.2f})")

        clean = redrive(bs, dlq)
        console.print(f"clean: {clean}")
        clean_back = read_back(bs, source, dlq, n)
        console.print(f"clean, read back ({clean_back.reader}): {clean_back}")

        crashed = redrive(bs, dlq2, {"KWORKERS_REDRIVE_CRASH_AFTER": str(n // 2)})
        console.print(f"crash at 50 %: {crashed}")
        rerun = redrive(bs, dlq2)
        console.print(f"rerun: {rerun}")
        crash_back = read_back(bs, source2, dlq2, n)
        console.print(f"crash + rerun, read back ({crash_back.reader}): {crash_back}")
        load_after = os.getloadavg()
    me = resource.getrusage(resource.RUSAGE_SELF)
    result("redrive", {
        "n": n,
        "redrive_rps": n / clean.wall_s if clean.status == 0 else 0.0,
        "wall_s": fmt(clean.wall_s, 1),
        "cpu_s": fmt(clean.cpu_s, 1),
        "peak_rss_mb": fmt(clean.peak_rss_mb, 0),
        "clean_once": int(clean.status == 0 and clean_back.exactly_once),
        "crash_status": crashed.status,
        "crash_s": fmt(crashed.wall_s, 1),
        "rerun_s": fmt(rerun.wall_s, 1),
        "rerun_peak_rss_mb": fmt(rerun.peak_rss_mb, 0),
        "replays": crash_back.replays,
        "duplicates": crash_back.duplicates,
        "missing": crash_back.missing,
        "ledger_keys": crash_back.ledger_keys,
        "crash_once": int(rerun.status == 0 and crash_back.exactly_once),
        "bench_cpu_s": fmt(me.ru_utime + me.ru_stime, 1),
        "load_avg": f"{load_before[0]:.2f}->{load_after[0]:.2f}",
    })

"""What every benchmark shares: sizes per mode, the broker, a fast producer, a worker in a thread.

Figures are printed, never asserted: the machine is shared and timings are noisy. Each benchmark
ends with exactly one ``RESULT <name> key=value ...`` line, which the smoke test parses.
"""

from __future__ import annotations

import enum
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from kworkers import Worker
from kworkers.testing.workload import produce_patiently

console = Console(highlight=False, soft_wrap=True)
T = TypeVar("T")


class Mode(enum.Enum):
    SMOKE = "smoke"
    QUICK = "quick"
    FULL = "full"

    def pick(self, smoke: T, quick: T, full: T) -> T:
        """The size for this mode (``--smoke``: seconds of work, ``--quick``: under a minute)."""
        return {Mode.SMOKE: smoke, Mode.QUICK: quick, Mode.FULL: full}[self]


# ------------------------------------------------------------------------------------ broker


@contextmanager
def kafka() -> Iterator[str]:
    """One broker per benchmark run: ``KWORKERS_BOOTSTRAP`` if set, else a fresh container."""
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    from kworkers.testing import broker_from_env

    broker = broker_from_env()
    t0 = time.monotonic()
    broker.start()
    console.print(f"[dim]broker {broker.bootstrap_servers} ready in "
                  f"{time.monotonic() - t0:.1f}s ({type(broker).__name__})[/dim]")
    try:
        yield broker.bootstrap_servers
    finally:
        # Clients still referenced from reference cycles (a stopped Worker's hand-off producer)
        # would log connection errors once the broker is gone: destroy them first.
        gc.collect()
        broker.close()


def quiet_logs() -> None:
    """Warnings from kworkers are expected in some benchmarks (retries); keep the output short."""
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")


# ---------------------------------------------------------------------------------- producing


def fast_producer(bootstrap: str, **extra: Any) -> Producer:
    """A producer for pre-loading topics quickly (large batches, no compression), idempotent:
    a batch retried without it may be written twice or behind the next one, and a topic whose
    records are duplicated or out of order reads as order violations on every side (iobound,
    2026-12-06: 248 on each side, every run, of one pre-loaded topic)."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 50,
        "batch.size": 1_000_000,
        "batch.num.messages": 100_000,
        "compression.type": "none",
        "acks": "all",
        "enable.idempotence": True,
        "queue.buffering.max.messages": 2_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "log_level": 3,
    }
    conf.update(extra)
    return Producer(conf)


def produce_fill(bootstrap: str, topic: str, n: int, partitions: int, value_size: int = 100,
                 key: Callable[[int], bytes | None] | None = None) -> float:
    """``n`` records of ``value_size`` bytes spread evenly over ``partitions``; returns seconds.

    Values start with the record number so a reader could tell records apart.
    """
    p = fast_producer(bootstrap)
    pad = b"x" * value_size
    t0 = time.monotonic()
    for i in range(n):
        head = b"%d:" % i
        value = head + pad[: max(0, value_size - len(head))]
        k = key(i) if key is not None else None
        produce_patiently(p, topic, value=value, key=k, partition=i % partitions)
        if i % 20_000 == 0:
            p.poll(0)
    left = p.flush(120)
    if left:
        raise RuntimeError(f"{left} records not delivered to {topic}")
    return time.monotonic() - t0


class SteadyProducer:
    """Produces ``per_second`` records spread over ``partitions`` until stopped (a thread)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, per_second: float) -> None:
        self.topic = topic
        self.partitions = partitions
        self.per_second = per_second
        self.sent = 0
        self._p = fast_producer(bootstrap, **{"linger.ms": 5})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-steady-producer",
                                        daemon=True)

    def start(self) -> SteadyProducer:
        self._thread.start()
        return self

    def _run(self) -> None:
        tick = 0.01
        t0 = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - t0) * self.per_second)
            while self.sent < due:
                i = self.sent
                self._p.produce(self.topic, value=b"%d" % i, partition=i % self.partitions)
                self.sent += 1
            self._p.poll(0)
            time.sleep(tick)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._p.flush(30)


# ---------------------------------------------------------------------------------- workers


@contextmanager
def running(worker: Worker, ready_timeout: float = 60.0,
            join_timeout: float = 120.0) -> Iterator[Worker]:
    """Runs ``worker`` in a thread until the block ends, then stops it and joins the thread."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run(install_signals=False)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=target, name="kworkers-main-loop", daemon=True)
    t.start()
    try:
        wait_for(lambda: worker.ready or bool(errors), ready_timeout, "worker ready")
        if errors:
            raise errors[0]
        yield worker
    finally:
        worker.stop()
        t.join(join_timeout)
        if t.is_alive():
            console.print("[red]warning: a worker did not stop in time[/red]")
        if errors:
            raise errors[0]


def wait_for(cond: Callable[[], bool], timeout: float, what: str, poll: float = 0.01) -> float:
    """Polls ``cond``; returns the time it became true. The timeout only bounds a hang."""
    deadline = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        if cond():
            return now
        if now > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


def counter_value(metric: Any, *labels: str) -> float:
    """The value of a prometheus_client counter child (kworkers' ``Metrics``)."""
    return float(metric.labels(*labels)._value.get())


def rss_mb() -> float:
    """Resident set size of this process in MiB, from /proc/self/status."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) per thread group of this process, from /proc/self/task.

    Threads are grouped by name, numbered suffixes dropped: Python's by their ``name``, the
    others (librdkafka's ``rdk:main``, ``rdk:broker...``) by their kernel name.
    """
    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        cpu = (int(fields[11]) + int(fields[12])) / tick
        name = names.get(int(tid)) or _comm(tid)
        group = name.rstrip("0123456789").rstrip("-:/") or name
        out[group] = out.get(group, 0.0) + cpu
    return out


def _comm(tid: str) -> str:
    """The kernel's name of a thread Python did not start (librdkafka names its ``rdk:...``)."""
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip() or "native"
    except OSError:
        return "native"


def cpu_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def tune_collector(options: Mapping[str, Any]) -> None:
    """``options["gc"]``, what an application may do with the interpreter's collector before
    it runs (``{"threshold": [20_000, 10, 10], "freeze": true}``): every side that takes a
    ``+gc`` variant applies it the same way, so both sides of a ratio are tuned alike."""
    tune = options.get("gc") or {}
    if tune.get("threshold"):
        gc.set_threshold(*tune["threshold"])
    if tune.get("freeze"):
        gc.collect()
        gc.freeze()


# ---------------------------------------------------------------------------------- output


def table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    t = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*r)
    console.print(t)


def fmt(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}f}"


def result(name: str, figures: Mapping[str, float | int | str]) -> None:
    """The one machine-readable line a benchmark ends with."""
    parts = [f"{k}={_text(v)}" for k, v in figures.items()]
    print(f"RESULT {name} " + " ".join(parts), flush=True)


def _text(v: float | int | str) -> str:
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)

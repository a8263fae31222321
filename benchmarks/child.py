"""One side of a comparison, in a process of its own: ``python -m benchmarks.child '<spec>'``.

Why a process per side: the CPU of a side is then the CPU of its process (all its threads,
librdkafka's included) and nothing else, and a side never inherits another's warm caches,
threads or garbage. The peers run this module with their own interpreter (their own venv, see
``benchmarks.peer_envs``), so it imports only the standard library at module level; each side's
code imports its library when it runs.

The spec is JSON: ``side`` names an entry of ``SIDES`` (``module:function``), the other keys are
the side's (bootstrap, topic, n, group, consumer_config, broker_cpu, options). The function gets
the spec and a ``Meter`` and returns extra figures; the child then prints one line
``SIDE <json>`` with the meter's readings and those extras, and exits.
"""

from __future__ import annotations

import importlib
import itertools
import json
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

# side name -> "module:function"; every function takes (spec, meter) and returns a dict
SIDES: dict[str, str] = {
    "readahead": "benchmarks.sides_peers:readahead_probe",
    "raw": "benchmarks.sides_peers:raw",
    "raw_fields": "benchmarks.sides_peers:raw_fields",
    "quix": "benchmarks.sides_peers:quix",
    "arroyo": "benchmarks.sides_peers:arroyo",
    "faststream": "benchmarks.sides_peers:faststream",
    "kworkers": "benchmarks.sides_kworkers:sync_noop",
    "kworkers_output": "benchmarks.sides_kworkers:one_output",
    "raw_eos": "benchmarks.sides_peers:raw_eos",
    "kworkers_async": "benchmarks.sides_kworkers:async_noop",
    "kworkers_inline": "benchmarks.sides_kworkers:inline_noop",
    "kworkers_batch": "benchmarks.sides_kworkers:batch_noop",
    "slow_io": "benchmarks.slow_io:side",
    "iobound_kworkers": "benchmarks.iobound:kworkers_side",
    "iobound_asyncio": "benchmarks.iobound:asyncio_side",
    "rebalance": "benchmarks.rebalance:side",
    "storm_raw": "benchmarks.storm:raw_side",
    "storm_handoff": "benchmarks.storm:handoff_side",
}


class Unavailable(Exception):
    """This side cannot run here (e.g. the API it needs does not exist yet); not a failure."""


# ---------------------------------------------------------------------------- broker CPU


def read_broker_cpu(source: Mapping[str, str] | None) -> float | None:
    """CPU seconds the broker has used so far, from the source ``method.locate_broker_cpu``
    found (a cgroup counter for a container, /proc/<pid>/stat for a plain process)."""
    if not source:
        return None
    kind, path = source.get("kind"), source.get("path", "")
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    if kind == "cgroup_ns":  # cgroup v1 cpuacct.usage
        return int(text.strip()) / 1e9
    if kind == "cgroup_usec":  # cgroup v2 cpu.stat
        for line in text.splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
        return None
    if kind == "proc_stat":  # utime + stime (+ waited-for children) in clock ticks
        import os

        fields = text.rsplit(")", 1)[1].split()
        ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
        return ticks / os.sysconf("SC_CLK_TCK")
    return None


# ---------------------------------------------------------------------------- the meter


class Meter:
    """The readings of one run: the clock starts when the side starts consuming (subscribe,
    or the library's own start call that subscribes), and stops at the ``n``-th record.

    The side's handler calls ``hit()`` once per record (``hit_many(k)`` for a batch): that is
    the whole handler, the same on every side. ``hit`` is a step of ``itertools.count``
    (atomic under the GIL) and two comparisons. CPU is ``time.process_time()`` of this process
    (every thread, librdkafka's included) over the same window; the broker's CPU is read at
    the same two moments.
    """

    def __init__(self, n: int, broker_cpu: Mapping[str, str] | None) -> None:
        self.n = n
        self.done = threading.Event()
        self._seq = itertools.count()
        self._last = n - 1
        self._lock = threading.Lock()
        self._many = 0
        self._broker = broker_cpu
        self.t0 = self.cpu0 = 0.0
        self.broker0: float | None = None
        self.first = self.end = self.cpu_end = 0.0
        self.broker_end: float | None = None

    def start(self) -> None:
        self.broker0 = read_broker_cpu(self._broker)
        self.cpu0 = time.process_time()
        self.t0 = time.monotonic()

    def hit(self) -> None:
        i = next(self._seq)
        if i == 0:
            self.first = time.monotonic()
        if i == self._last:
            self._finish()

    def hit_many(self, k: int) -> None:
        with self._lock:
            before = self._many
            self._many = before + k
        if before == 0:
            self.first = time.monotonic()
        if before <= self._last < before + k:
            self._finish()

    def _finish(self) -> None:
        self.end = time.monotonic()
        self.cpu_end = time.process_time()
        self.broker_end = read_broker_cpu(self._broker)
        self.done.set()

    @property
    def count(self) -> int:
        """Records seen so far (for messages only: reading it costs a step of the counter)."""
        return max(next(self._seq) - 1, 0) + self._many

    def wait(self, timeout: float) -> None:
        if not self.done.wait(timeout):
            raise TimeoutError(f"{self.count:,} of {self.n:,} records in {timeout:.0f}s")

    def readings(self) -> dict[str, Any]:
        broker = (self.broker_end - self.broker0
                  if self.broker_end is not None and self.broker0 is not None else None)
        return {"records": self.n, "seconds": self.end - self.t0,
                "first_s": self.first - self.t0, "cpu_s": self.cpu_end - self.cpu0,
                "broker_cpu_s": broker}


def stop_when_done(meter: Meter, stop: Callable[[], None], timeout: float) -> threading.Thread:
    """A thread that calls ``stop`` once the meter saw ``n`` records (or the timeout passed:
    the side then reports the timeout, the child never hangs)."""

    def run() -> None:
        meter.done.wait(timeout)
        stop()

    t = threading.Thread(target=run, name="bench-stopper", daemon=True)
    t.start()
    return t


# ---------------------------------------------------------------------------- entry point


def main(argv: list[str]) -> int:
    spec: dict[str, Any] = json.loads(argv[1])
    side = spec["side"]
    module, _, func = SIDES[side].partition(":")
    meter = Meter(int(spec.get("n", 0)), spec.get("broker_cpu"))
    out: dict[str, Any] = {"side": side, "python": sys.executable}
    try:
        fn = getattr(importlib.import_module(module), func)
        extra = fn(spec, meter) or {}
    except Unavailable as exc:
        out["unavailable"] = str(exc)
    else:
        if meter.n:
            if not meter.done.is_set():
                raise RuntimeError(f"{side}: returned after {meter.count:,} of {meter.n:,}")
            out.update(meter.readings())
        out["extra"] = extra
    print("SIDE " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy, so that the sides (which import
    # benchmarks.child) and main share one Unavailable class and one Meter class.
    from benchmarks.child import main as _main

    sys.exit(_main(sys.argv))

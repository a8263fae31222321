"""The method every benchmark that compares sides follows, so that it cannot fool itself.

1. **Read-ahead capped equally.** librdkafka fetches ahead of the application, by default up
   to 100,000 records per partition (``queued.min.messages``) or 64 MB
   (``queued.max.messages.kbytes``). A clock that starts at the first record then times the
   drain of local memory (the old "raw 1,236,018 records/s"). Every side gets ``CAP`` through
   its own configuration API, and the read-ahead that results is *measured*
   (``measure_read_ahead``, librdkafka's own ``rxmsgs`` statistic) in each side's environment.
2. **N large next to the read-ahead.** Each table states N / read-ahead; a run under 10 is
   flagged.
3. **Timed from subscribe** (or the library's start call that subscribes) to the N-th record
   handled, so fetching is inside the window; the time to the first record is shown apart.
4. **One process per side** (``benchmarks.child``): the side's CPU is its process's CPU over
   the window; the broker's CPU over the same window is read from its cgroup (or /proc).
5. **Sides alternate** (A B C A B C ...), each at least 3 times outside smoke mode, with a
   fresh group each time; tables give the median, the spread (min-max), CPU seconds of the side
   and of the broker.
6. **Flags, not silence.** After each run the group's committed offsets are read back from
   the broker with a fresh client; a side that committed fewer than N records is flagged. A
   side faster than the raw loop is flagged (nothing should beat it: such a figure needs
   explaining), and so is a side that mostly waited (side + broker CPU under half the wall
   time: a no-op consumer should be CPU-bound; this is how the 1 s ``fetch.queue.backoff.ms``
   default showed up under a small cap).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape

from benchmarks.common import console, fmt, produce_fill, table
from kworkers.testing.workload import committed_total, make_topic, unique

ROOT = Path(__file__).resolve().parents[1]

#: The read-ahead cap every side gets (librdkafka names; each side passes them its own way).
#: Measured result on the 6-partition, 100-byte topic: see ``measure_read_ahead``.
CAP: dict[str, int] = {
    "queued.min.messages": 5000,  # per partition (default 100,000)
    "queued.max.messages.kbytes": 8192,  # the whole consumer queue (default 65,536)
    "fetch.max.bytes": 4_194_304,  # per fetch response (default 52,428,800)
    "max.partition.fetch.bytes": 1_048_576,  # per partition in a response (the default)
    # librdkafka waits this long (default 1000 ms!) before fetching again for a partition whose
    # queue went over the caps above: at the default, a cap stalls every fast side.
    "fetch.queue.backoff.ms": 1,
}
MIN_N_OVER_READ_AHEAD = 10
#: A no-op consumer is CPU-bound (its own process or the broker's): side + broker CPU under
#: this share of the wall time means something throttles it (a fetch back-off, a timeout).
WAITING = 0.5


# ------------------------------------------------------------------------------ broker CPU


def locate_broker_cpu(bootstrap: str) -> dict[str, str] | None:
    """Where to read the CPU the broker has used: the process listening on the bootstrap port,
    then its container's cgroup counter if it runs in one (the JVM and all its threads), else
    its /proc/<pid>/stat. None when neither can be read (then tables say n/a)."""
    port = int(bootstrap.split(",")[0].rpartition(":")[2])
    pid = listener_pid(port)
    if pid is None:
        return None
    source = container_cgroup(pid) or {"kind": "proc_stat", "path": f"/proc/{pid}/stat"}
    return {**source, "pid": str(pid)}


def listener_pid(port: int) -> int | None:
    inodes = set()
    for table_path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table_path) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return int(pid)
            except OSError:
                continue
    return None


def container_cgroup(pid: int) -> dict[str, str] | None:
    """The CPU counter of ``pid``'s container cgroup (cgroup v1 cpuacct or v2 cpu.stat);
    None for a process outside a container, whose cgroup may hold far more than the broker."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    markers = ("docker", "containerd", "libpod", "kubepods")
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if not any(m in path for m in markers):
            continue
        if "cpuacct" in controllers.split(","):
            for mount in ("cpuacct", "cpu,cpuacct", "cpuacct,cpu"):
                usage = f"/sys/fs/cgroup/{mount}{path}/cpuacct.usage"
                if os.path.exists(usage):
                    return {"kind": "cgroup_ns", "path": usage}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" and any(m in path for m in markers):
            for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                stat = f"{mount}{path}/cpu.stat"
                if os.path.exists(stat):
                    return {"kind": "cgroup_usec", "path": stat}
    return None


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


# ------------------------------------------------------------------------------ sides


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a ``benchmarks.child`` side run by ``python``."""

    name: str  # key in benchmarks.child.SIDES
    label: str  # its name in tables and RESULT lines
    python: str = sys.executable
    n: int | None = None  # records to time; None: the comparison's N
    options: Mapping[str, Any] = field(default_factory=dict)
    capped: bool = True  # False: librdkafka's default read-ahead (a control)
    unavailable: str | None = None  # known before running (e.g. a peer that failed to install)


@dataclass(frozen=True)
class Reading:
    """One run of one side, as its child process measured it, plus what was read back."""

    label: str
    group: str
    records: int
    seconds: float
    first_s: float
    cpu_s: float
    broker_cpu_s: float | None
    committed: int
    extra: Mapping[str, Any]

    @property
    def mps(self) -> float:
        return self.records / self.seconds


@dataclass(frozen=True)
class Summary:
    label: str
    n: int
    runs: tuple[Reading, ...] = ()
    unavailable: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return bool(self.runs)

    def median(self, f: Callable[[Reading], float | None]) -> float | None:
        values = [v for v in map(f, self.runs) if v is not None]
        return statistics.median(values) if values else None

    @property
    def mps(self) -> float:
        return self.median(lambda r: r.mps) or 0.0

    @property
    def short_commits(self) -> int:
        """Runs whose group committed fewer than N records (read back from the broker)."""
        return sum(1 for r in self.runs if r.committed < r.records)

    @property
    def spread(self) -> tuple[float, float]:
        values = [r.mps for r in self.runs]
        return (min(values), max(values)) if values else (0.0, 0.0)


def run_child(python: str, spec: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """Runs one side in a fresh process; returns what its ``SIDE`` line says."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run([python, "-m", "benchmarks.child", json.dumps(spec)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"side {spec['side']} did not finish in {timeout:.0f}s") from exc
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("SIDE ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"side {spec['side']} ({python}) exited {proc.returncode}:\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(lines[-1][5:])
    return result


class Comparison:
    """Sides compared on one topic of one broker, by the method above."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, n: int,
                 timeout: float = 900.0, cpu_bound: bool = True) -> None:
        self.bootstrap = bootstrap
        self.cpu_bound = cpu_bound  # False: the sides wait by design (slow_io)
        self.topic = topic
        self.partitions = partitions
        self.n = n
        self.timeout = timeout
        self.broker_cpu = locate_broker_cpu(bootstrap)
        self.read_ahead: dict[str, int] = {}  # python -> records measured
        where = (f"{self.broker_cpu['kind']} {self.broker_cpu['path']}" if self.broker_cpu
                 else "not found (n/a)")
        console.print(f"[dim]broker CPU read from {where}[/dim]")

    @classmethod
    def on_new_topic(cls, bootstrap: str, prefix: str, n: int, partitions: int = 6,
                     value_size: int = 100, **kw: Any) -> Comparison:
        """A fresh topic of ``n`` records (``value_size`` bytes) to compare sides on."""
        topic = make_topic(bootstrap, unique(prefix), partitions)
        secs = produce_fill(bootstrap, topic, n, partitions, value_size)
        console.print(f"produced {n:,} records of {value_size} B over {partitions} partitions "
                      f"in {secs:.1f}s; read-ahead cap {CAP}")
        return cls(bootstrap, topic, partitions, n, **kw)

    def spec(self, side: Side, group: str, n: int) -> dict[str, Any]:
        return {"side": side.name, "bootstrap": self.bootstrap, "topic": self.topic, "n": n,
                "group": group, "consumer_config": CAP if side.capped else {},
                "broker_cpu": self.broker_cpu, "options": dict(side.options),
                "timeout": self.timeout}

    def measure_read_ahead(self, python: str, capped: bool = True) -> int:
        """Records librdkafka holds ahead of the application under ``CAP`` (or its defaults),
        measured by the ``readahead`` probe with ``python``'s confluent-kafka."""
        probe = Side("readahead", "read-ahead", python=python, capped=capped)
        out = run_child(python, self.spec(probe, unique("bench-ra"), 0), self.timeout)
        ra = int(out["extra"]["read_ahead"])
        console.print(f"  read-ahead {'capped' if capped else 'at defaults'}: {ra:,} records "
                      f"(librdkafka {out['extra']['librdkafka']}, {python})")
        if capped:
            self.read_ahead[python] = ra
        return ra

    def run(self, side: Side) -> Reading | str:
        """One run of ``side`` with a fresh group; a string says why it could not run."""
        n = side.n or self.n
        group = unique(f"bench-{side.name}")
        out = run_child(side.python, self.spec(side, group, n), self.timeout)
        if "unavailable" in out:
            return str(out["unavailable"])
        committed = committed_total(self.bootstrap, group, self.topic, self.partitions)
        return Reading(side.label, group, int(out["records"]), float(out["seconds"]),
                       float(out["first_s"]), float(out["cpu_s"]), out.get("broker_cpu_s"),
                       committed, out.get("extra", {}))

    def alternate(self, sides: Sequence[Side], rounds: int) -> dict[str, Summary]:
        """Every side once per round, in the same order each round (A B C A B C ...)."""
        runs: dict[str, list[Reading]] = {s.label: [] for s in sides}
        missing: dict[str, str] = {s.label: s.unavailable for s in sides if s.unavailable}
        for label, why in missing.items():
            console.print(f"  [yellow]{label}: not available: {escape(why)}[/yellow]")
        for r in range(rounds):
            for side in sides:
                if side.label in missing:
                    continue
                got = self.run(side)
                if isinstance(got, str):
                    missing[side.label] = got
                    console.print(f"  [yellow]{side.label}: not available: "
                                  f"{escape(got)}[/yellow]")
                    continue
                runs[side.label].append(got)
                console.print(f"  round {r + 1}/{rounds} {side.label:16s} {got.records:>9,} in "
                              f"{got.seconds:6.2f}s = {got.mps:>9,.0f}/s (first record at "
                              f"{got.first_s:.2f}s), CPU {got.cpu_s:5.2f}s, broker "
                              f"{_secs(got.broker_cpu_s)}, committed {got.committed:,}")
        return {s.label: self._summary(s, runs[s.label], missing.get(s.label)) for s in sides}

    def _summary(self, side: Side, runs: list[Reading], unavailable: str | None) -> Summary:
        n = side.n or self.n
        notes = []
        if any(r.committed < r.records for r in runs):
            notes.append("committed < N in a run")
        ra = self.read_ahead.get(side.python)
        if side.capped and ra and n / ra < MIN_N_OVER_READ_AHEAD:
            notes.append(f"N only {n / ra:.0f}x read-ahead")
        if not side.capped:
            notes.append("default read-ahead")
        if self.cpu_bound and any(
                r.cpu_s + (r.broker_cpu_s or 0.0) < WAITING * (r.seconds - r.first_s)
                for r in runs):
            notes.append("waited (CPU < wall/2)")
        return Summary(side.label, n, tuple(runs), None if runs else unavailable, tuple(notes))

    @staticmethod
    def flag_faster_than(summaries: dict[str, Summary], baseline: str) -> None:
        """Marks sides whose median beats ``baseline`` (the raw loop) by more than 10%."""
        base = summaries.get(baseline)
        if base is None or not base.ok:
            return
        for label, s in list(summaries.items()):
            if label != baseline and s.ok and s.mps > 1.1 * base.mps:
                summaries[label] = Summary(s.label, s.n, s.runs, s.unavailable,
                                           (*s.notes, f"faster than {baseline}: check why"))


def _secs(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}s"


def summary_table(title: str, summaries: Iterable[Summary], baseline: str | None = None,
                  read_ahead: Mapping[str, int] | None = None) -> None:
    """Median, spread, CPU of the side and of the broker, per side; ratios to ``baseline``."""
    rows = []
    items = list(summaries)
    base = next((s for s in items if s.label == baseline and s.ok), None)
    for s in items:
        if not s.ok:
            rows.append([s.label, "not available", "", "", "", "", "", "",
                         escape(s.unavailable or "")])
            continue
        lo, hi = s.spread
        cpu = s.median(lambda r: r.cpu_s) or 0.0
        broker = s.median(lambda r: r.broker_cpu_s)
        secs = s.median(lambda r: r.seconds) or 0.0
        ratio = fmt(s.mps / base.mps, 2) if base and s is not base else ""
        rows.append([s.label, f"{s.n:,}", f"{s.mps:,.0f}", f"{lo:,.0f}-{hi:,.0f}",
                     f"{secs:.2f} ({s.median(lambda r: r.first_s) or 0:.2f})",
                     f"{cpu:.2f} ({cpu / s.n * 1e6:.1f} us/rec)",
                     "n/a" if broker is None else f"{broker:.2f}", ratio,
                     "; ".join(s.notes)])
    table(title, ["side", "N", "records/s (median)", "spread (min-max)",
                  "s to N (to 1st)", "CPU s side", "CPU s broker",
                  f"x {baseline}" if baseline else "", "notes"], rows)
    if read_ahead:
        parts = [f"{ra:,} records ({Path(py).parts[-3] if 'peers' in py else 'project venv'})"
                 for py, ra in read_ahead.items()]
        console.print("read-ahead measured under the cap: " + ", ".join(parts))

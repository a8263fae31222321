"""The autoscaling scenarios' harness (tests/faults/test_autoscaling.py, ``python -m benchmarks
autoscale``): a rendered ScaledObject read as KEDA reads it, the scaling loop driven on it, and
``kworkers run`` processes started and SIGTERMed as its replicas.

* ``Reader``: every trigger of one ScaledObject: Kafka triggers from KEDA's own scaler
  (``keda_probe``, one scaler per trigger across polls), Prometheus triggers from a real
  Prometheus evaluating the rendered query (``prometheus``).
* ``Replicas``: the Deployment: ``kworkers run APP`` processes with their metrics ports as the
  Prometheus server's targets; scale-in SIGTERMs the newest (its exit code kept).
* ``drive``: the loop (``scaling_loop``, every interval divided by ``SPEEDUP``) and its
  canaries' shadow loops (same moments, same broker, replicas counted but not started).
* ``before_47``: the ScaledObject kworkers rendered before issue #47 (raw lag everywhere,
  lagThreshold 100, tiers with excludePersistentLag), the canaries' baseline.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from kworkers.config import WorkerConfig
from kworkers.deploy import manifests
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.testing.broker import free_port
from kworkers.testing.keda_probe import KedaScaler, kafka_triggers, probe_path
from kworkers.testing.processes import WorkerProcess, health
from kworkers.testing.prometheus import PrometheusServer
from kworkers.testing.scaling_loop import Figure, LoopSpec, ScalingLoop, unread_problems
from kworkers.testing.workload import make_topic, unique

ROOT = Path(__file__).resolve().parents[2]
SPEEDUP = 30.0
PARTITIONS = 4
RETRY_S = 15.0
#: bounds a hung scenario only; never a pass criterion
HANG_S = 240.0


def topics(bs: str, prefix: str) -> str:
    """The source topic and its retry tier, made before the pool exists (as ``kworkers topics
    create --tiers`` does: KEDA's scaler reports an error on a topic that does not exist)."""
    topic = make_topic(bs, unique(prefix), PARTITIONS)
    make_topic(bs, f"{topic}.retry.{int(RETRY_S)}s", PARTITIONS)
    return topic


def render(bs: str, topic: str, group: str, prometheus: str | None,
           **config: Any) -> dict[str, Any]:
    cfg = WorkerConfig(topics=(topic,), group_id=group, bootstrap_servers=bs,
                       tiers=TierLadder((RETRY_S,)), **config)
    objs = manifests(cfg, image="kworkers/worker:test", app="scaled", module="m:worker",
                     partitions=PARTITIONS, prometheus=prometheus, allow_loopback=True)
    return objs["keda/scaledobject.yaml"]


def before_47(so_without_prometheus: Mapping[str, Any]) -> dict[str, Any]:
    """The ScaledObject rendered before #47: raw lag everywhere, lagThreshold 100, the tiers
    with excludePersistentLag (git show 945b9fb^:deploy/keda/scaledobject.yaml)."""
    so = copy.deepcopy(dict(so_without_prometheus))
    for trig in so["spec"]["triggers"]:
        trig["metadata"]["lagThreshold"] = "100"
        if trig["metadata"]["consumerGroup"].endswith(".retry"):
            trig["metadata"]["excludePersistentLag"] = "true"
    so["spec"].pop("advanced", None)
    return so


def without_drainable(so: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(so))
    out["spec"]["triggers"] = [t for t in out["spec"]["triggers"] if t["type"] == "kafka"]
    return out


class Reader:
    """Every trigger of one ScaledObject read as KEDA would: Kafka from KEDA's scaler,
    Prometheus from the server."""

    def __init__(self, so: Mapping[str, Any], bs: str, prom: PrometheusServer) -> None:
        self.keda = KedaScaler(kafka_triggers(so, bs), probe_path())
        self.prom = prom
        self.queries = [(t["name"], t["metadata"]["query"], float(t["metadata"]["threshold"]),
                         float(t["metadata"].get("activationThreshold", "0")))
                        for t in so["spec"]["triggers"] if t["type"] == "prometheus"]
        #: (time, the drainable series) whenever a Prometheus trigger read above 0: what
        #: a scale-out was made of, printed by the scenarios
        self.nonzero: list[tuple[float, list[tuple[dict[str, str], float]]]] = []

    def __call__(self) -> list[Figure]:
        out = [Figure(r.name, r.value, r.target, r.active, r.error)
               for r in self.keda.poll().values()]
        for name, q, target, activation in self.queries:
            try:
                v = self.prom.query(q)
            except OSError as exc:  # unreachable or timed out: KEDA's trigger errs likewise
                out.append(Figure(name, math.nan, target, False, f"prometheus: {exc}"))
                continue
            out.append(Figure(name, v, target, v > activation))
            if v > 0 and len(self.nonzero) < 20:
                self.nonzero.append((time.monotonic(), [
                    ({k: x[k] for k in ("group", "topic", "partition", "instance") if k in x}, y)
                    for x, y in self.prom.series("kworkers_drainable_lag > 0")]))
        return out

    def close(self) -> None:
        self.keda.close()


class Replicas:
    """The Deployment: ``kworkers run`` processes, the newest SIGTERMed first on scale-in
    (a pod's grace period: waited for at the end, every exit code 0)."""

    def __init__(self, tmp: Path, bs: str, topic: str, group: str,
                 prom: PrometheusServer, app: str = "tests.apps.autoscale_worker:worker",
                 ) -> None:
        self.tmp, self.bs, self.topic, self.group, self.prom = tmp, bs, topic, group, prom
        self.app = app
        self.live: list[tuple[WorkerProcess, int]] = []
        self.gone: list[WorkerProcess] = []
        self.started = 0

    def scale_to(self, n: int) -> None:
        changed = False
        while len(self.live) < n:
            port = free_port()
            self.started += 1
            w = WorkerProcess(
                ["-m", "kworkers.cli", "run", self.app, "-b", self.bs,
                 *(["--topic", self.topic, "--group", self.group] if self.topic else []),
                 "--metrics-port", str(port), "--log-level", "WARNING"],
                self.tmp, f"replica-{self.started}", cwd=str(ROOT)).start()
            self.live.append((w, port))
            changed = True
        while len(self.live) > n:
            w, _ = self.live.pop()
            assert w.proc is not None
            w.proc.send_signal(signal.SIGTERM)
            self.gone.append(w)
            changed = True
        if changed:
            self.prom.set_targets(p for _, p in self.live)

    def ready(self) -> bool:
        return bool(self.live) and all(health(p) == 200 for _, p in self.live)

    def close(self) -> list[tuple[str, int | None]]:
        """Stops every replica (SIGTERM) and returns each one's exit code."""
        self.scale_to(0)
        codes: list[tuple[str, int | None]] = []
        for w in self.gone:
            assert w.proc is not None
            try:
                codes.append((w.log_path.name, w.proc.wait(90)))
            except subprocess.TimeoutExpired:  # a hung replica: reported as None
                w.close()
                codes.append((w.log_path.name, None))
        return codes


@dataclasses.dataclass
class Shadow:
    """A canary: the same loop on another ScaledObject, its replicas counted, not started."""

    name: str
    loop: ScalingLoop
    read: Reader


@dataclasses.dataclass
class Run:
    loop: ScalingLoop
    read: Reader
    shadows: dict[str, Shadow]
    #: (time, replicas) after every step, the real loop's
    trace: list[tuple[float, int]]
    exit_codes: list[tuple[str, int | None]]


def drive(so: Mapping[str, Any], canaries: Mapping[str, Mapping[str, Any]], bs: str,
          prom: PrometheusServer, replicas: Replicas,
          until: Callable[[float, ScalingLoop], bool],
          on_step: Callable[[float, ScalingLoop], None] | None = None) -> Run:
    """Runs the loop (and its canaries' shadows) every 0.1 s until ``until(now, loop)``."""
    loop = ScalingLoop(LoopSpec.from_scaledobject(so, SPEEDUP))
    read = Reader(so, bs, prom)
    shadows = {name: Shadow(name, ScalingLoop(LoopSpec.from_scaledobject(c, SPEEDUP)),
                            Reader(c, bs, prom)) for name, c in canaries.items()}
    trace: list[tuple[float, int]] = []
    t0 = time.monotonic()
    try:
        while True:
            now = time.monotonic() - t0
            replicas.scale_to(loop.advance(now, read))
            for s in shadows.values():
                s.loop.advance(now, s.read)
            trace.append((now, loop.replicas))
            if on_step is not None:
                on_step(now, loop)
            if until(now, loop):
                break
            assert now < HANG_S, f"the scenario hung: {loop.events}"
            time.sleep(0.1)
    finally:
        read.close()
        for s in shadows.values():
            s.read.close()
        codes = replicas.close()
    # a scaler error holds the loop, as it holds KEDA: a run judged on holds is no run
    unread = unread_problems(loop.readings)
    assert not unread, f"{unread}; events: {loop.events}"
    return Run(loop, read, shadows, trace, codes)


def explain(run: Run) -> str:
    """What a failed scenario prints: every replica change with the figures that made it, and
    the drainable series behind each Prometheus reading above 0."""
    events = [(round(e.at, 2), e.before, e.after, e.by,
               [(f.name, f.value, f.target) for f in e.figures]) for e in run.loop.events]
    return f"events {events}; drainable series at readings above 0: {run.read.nonzero}"


def committed_and_ends(bs: str, group: str, topic: str) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": bs, "group.id": group, "log_level": 3})
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        committed = sum(max(tp.offset, 0) for tp in c.committed(tps, timeout=30))
        ends = sum(c.get_watermark_offsets(tp, timeout=30)[1] for tp in tps)
        return committed, ends
    finally:
        c.close()


def reversals(trace: Sequence[tuple[float, int]], start: float, end: float) -> int:
    """Direction changes of the replica count within [start, end]: a scale-down followed by
    a scale-up or the other way round (a flap)."""
    steps = [b - a for (t, a), (_, b) in itertools.pairwise(trace)
             if start <= t <= end and b != a]
    return sum(1 for x, y in itertools.pairwise(steps) if (x > 0) != (y > 0))


def unstabilized(so: Mapping[str, Any]) -> dict[str, Any]:
    """The same ScaledObject with no scale-down stabilization (the flap check's canary)."""
    out = copy.deepcopy(dict(so))
    out["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"] = {
        "stabilizationWindowSeconds": 0,
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}
    return out


def replay(loop: ScalingLoop) -> list[tuple[float, int]]:
    """A shadow loop's replica count at each of its readings (from its events)."""
    out, n = [], 0
    events = list(loop.events)
    for t, _ in loop.readings:
        while events and events[0].at <= t:
            n = events.pop(0).after
        out.append((t, n))
    return out


def produce_paced(bs: str, topic: str, values: range, per_second: float = 100.0) -> None:
    """``values`` as records k<i>/<i>, 10 at a time, ``per_second`` (the tests' and the
    benchmark's steady arrivals)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "log_level": 3})
    t0 = time.monotonic()
    for j, i in enumerate(values):
        p.produce(topic, key=f"k{i}".encode(), value=str(i).encode())
        if j % 10 == 9:
            p.poll(0)
            time.sleep(max(0.0, t0 + (j + 1) / per_second - time.monotonic()))
    assert p.flush(30) == 0

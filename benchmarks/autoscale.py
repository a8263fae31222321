"""autoscale: a kworkers pool scaled by KEDA's algorithm, the rendered ScaledObject beside the one
rendered before issue #47.

Two phases on one broker, each with real ``kworkers run`` replicas
(``kworkers.testing.autoscaling``: Kafka triggers read by KEDA's own scaler, the Prometheus
trigger by a real Prometheus; every interval divided by 30, as in
tests/faults/test_autoscaling.py) driven by the rendered ScaledObject, and the ScaledObject
before #47 (raw lag, lagThreshold 100, tiers with excludePersistentLag) run as a shadow loop
on the same moments (its replicas counted, not started):

1. **backlog**: N records (100 ms each) arrive on 4 partitions with the pool at zero: seconds
   to the first scale-out, to full drain (committed = log end, read from the broker), and
   from the drain to zero replicas; flaps (direction reversals of the replica count); the
   replica count over time.
2. **waiting retries**: M records whose first attempt fails wait 15 s in the retry tier:
   spurious scale-outs (replicas above one while the retries wait and the source is drained).

Needs Debian's ``prometheus`` and the KEDA probe (``ensure_prometheus``, ``ensure_keda_probe``
in scripts/lib.sh). Times are in the loop's seconds; multiply by 30 for a cluster's.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Mode, console, quiet_logs, result, table
from kworkers.consumer.processor import LAG_INTERVAL_S
from kworkers.retry_tiers.headers import due_at_of
from kworkers.testing.autoscaling import (
    SPEEDUP,
    Replicas,
    before_47,
    committed_and_ends,
    drive,
    produce_paced,
    render,
    replay,
    reversals,
    topics,
)
from kworkers.testing.keda_probe import cache_dir
from kworkers.testing.ledger import Ledger
from kworkers.testing.prometheus import PrometheusServer
from kworkers.testing.scaling_loop import ScalingLoop
from kworkers.testing.workload import produce, read_all, unique


def _needs() -> None:
    probe = os.environ.get("KWORKERS_KEDA_PROBE") or str(cache_dir() / "keda-scaler-probe")
    missing = [what for what, ok in (("prometheus (ensure_prometheus)",
                                      shutil.which("prometheus") is not None),
                                     ("the KEDA probe (ensure_keda_probe)",
                                      os.access(probe, os.X_OK))) if not ok]
    if missing:
        raise SystemExit(f"autoscale: needs {' and '.join(missing)}: "
                         "bash -c 'source scripts/lib.sh; ensure_prometheus; ensure_keda_probe'")


def _env(ledger: Path, **kw: str) -> None:
    for k in [k for k in os.environ if k.startswith("KW_AS_")]:
        del os.environ[k]
    os.environ.update({"KW_AS_LEDGER": str(ledger), "KW_AS_RETRY_S": "15",
                       "KW_AS_LAG_INTERVAL_S": f"{LAG_INTERVAL_S / SPEEDUP:g}", **kw})


def _series(trace: list[tuple[float, int]], step: float, end: float) -> list[int]:
    out, i, n = [], 0, 0
    t = 0.0
    while t <= end:
        while i < len(trace) and trace[i][0] <= t:
            n = trace[i][1]
            i += 1
        out.append(n)
        t += step
    return [*out, trace[-1][1]] if trace else out


def _backlog(bs: str, tmp: Path, n: int) -> dict[str, Any]:
    topic, group = topics(bs, "bench-scale"), unique("g")
    _env(tmp / "backlog.db", KW_AS_SLOW_MS="100")
    with PrometheusServer(tmp / "prom-backlog", 30 / SPEEDUP) as prom:
        so = render(bs, topic, group, prom.url)
        canary = before_47(render(bs, topic, group, None))
        produce(bs, topic, ((f"k{i}".encode(), str(i).encode()) for i in range(n)))
        replicas = Replicas(tmp, bs, topic, group, prom)
        drained: list[float] = []

        def until(now: float, loop: ScalingLoop) -> bool:
            if not drained and now > 1 and int(now * 10) % 5 == 0:
                c, e = committed_and_ends(bs, group, topic)
                if c == e:
                    drained.append(now)
            return bool(drained) and loop.replicas == 0

        run = drive(so, {"before #47": canary}, bs, prom, replicas, until)
    applied = Ledger(tmp / "backlog.db").applications()
    assert len(applied) == n, f"{n - len(applied)} records not applied"
    shadow = run.shadows["before #47"].loop
    out: dict[str, Any] = {"drain_s": drained[0], "twice": sum(1 for c in applied.values()
                                                               if c > 1)}
    for name, loop, trace in (("rendered", run.loop, run.trace),
                              ("before47", shadow, replay(shadow))):
        ups = [e.at for e in loop.events if e.after > e.before and e.after > 1]
        zero = [e.at for e in loop.events if e.after == 0 and e.at > drained[0]]
        out[name] = {"first_scale_out_s": ups[0] if ups else float("nan"),
                     "peak": loop.peak,
                     "zero_after_drain_s": (zero[0] - drained[0]) if zero else float("nan"),
                     "flaps": reversals(trace, 0.0, drained[0]),
                     "series": _series(trace, 2.0, run.trace[-1][0])}
    return out


def _retries(bs: str, tmp: Path, m: int) -> dict[str, int]:
    """Spurious scale-outs while ``m`` retries wait: replica counts above 1 (each rise counted
    once) between the source's drain and the first retry's due time."""
    topic, group = topics(bs, "bench-wait"), unique("g")
    _env(tmp / "retries.db", KW_AS_FAIL_FIRST="1")
    ledger = Ledger(tmp / "retries.db")
    with PrometheusServer(tmp / "prom-retries", 30 / SPEEDUP) as prom:
        so = render(bs, topic, group, prom.url)
        canary = before_47(render(bs, topic, group, None))
        produce(bs, topic, [(b"k0", b"0")])
        replicas = Replicas(tmp, bs, topic, group, prom)
        paced = threading.Thread(target=produce_paced, args=(bs, topic, range(1, m)), daemon=True)
        state: dict[str, float | None] = {"started": None, "drained": None,
                                          "first_due": None, "done": None}
        tier = f"{topic}.retry.15s"

        def on_step(now: float, loop: ScalingLoop) -> None:
            if state["started"] is None and replicas.ready():
                paced.start()  # once a replica runs: each fails at once, paced
                state["started"] = now
            tick = int(now * 10) % 5 == 0
            if state["started"] is not None and state["drained"] is None and tick \
                    and not paced.is_alive():
                c, e = committed_and_ends(bs, group, topic)
                waiting = read_all(bs, tier, 2) if c == e else []
                if c == e and len(waiting) >= m:
                    dues = [due_at_of(tuple(h.items())) for _, _, h in waiting]
                    state["drained"] = now
                    state["first_due"] = now + min(d for d in dues if d is not None) \
                        - time.time()
            if state["drained"] is not None and state["done"] is None and tick \
                    and len(ledger.applications()) >= m:
                state["done"] = now

        def until(now: float, loop: ScalingLoop) -> bool:
            return state["done"] is not None and loop.replicas == 0

        run = drive(so, {"before #47": canary}, bs, prom, replicas, until, on_step)
    lo, hi = state["drained"], state["first_due"]
    assert lo is not None and hi is not None

    def spurious(trace: list[tuple[float, int]]) -> int:
        inside = [r for t, r in trace if lo <= t < hi]
        rises = sum(1 for a, b in itertools.pairwise(inside) if b > a and b > 1)
        return rises + (1 if inside and inside[0] > 1 else 0)

    return {"rendered": spurious(run.trace),
            "before47": spurious(replay(run.shadows["before #47"].loop))}


def main(mode: Mode) -> None:
    quiet_logs()
    _needs()
    from benchmarks.common import kafka

    n = mode.pick(200, 800, 4000)
    m = mode.pick(100, 400, 2000)
    with tempfile.TemporaryDirectory(prefix="kw-autoscale-") as d, kafka() as bs:
        tmp = Path(d)
        b = _backlog(bs, tmp, n)
        r = _retries(bs, tmp, m)
    rows = []
    for name, label in (("rendered", "rendered (#47)"), ("before47", "before #47")):
        x = b[name]
        rows.append([label, f"{x['first_scale_out_s']:.1f}", str(x["peak"]),
                     f"{x['zero_after_drain_s']:.1f}", str(x["flaps"]),
                     str(r[name])])
    table(f"autoscale: backlog {n} (drained at {b['drain_s']:.1f} s), {m} waiting retries; "
          f"seconds of the loop (x{SPEEDUP:g} for a cluster's)",
          ["ScaledObject", "first scale-out s", "peak replicas", "drain -> zero s", "flaps",
           "spurious scale-outs (retries waiting)"], rows)
    for name in ("rendered", "before47"):
        console.print(f"replicas every 2 s, {name}: {' '.join(map(str, b[name]['series']))}")
    result("autoscale", {
        "records": n, "retries": m, "drain_s": round(b["drain_s"], 1),
        "first_scale_out_s": round(b["rendered"]["first_scale_out_s"], 1),
        "zero_after_drain_s": round(b["rendered"]["zero_after_drain_s"], 1),
        "flaps": b["rendered"]["flaps"], "spurious": r["rendered"],
        "before47_spurious": r["before47"], "twice": b["twice"]})

"""iobound: thousands of I/O-bound handlers at once, against plain asyncio doing the same work.

Every record's handler awaits 100 ms (``asyncio.sleep``), nothing else: the rate a process
reaches is then set by how many handlers it keeps waiting at once (ideal: in flight / 0.1 s)
and by its cost per record once that is high. Configurations (issue #50, item 1): 1,000 keys
at 1,000 in flight, 10,000 keys at 2,500 and at 5,000 in flight (``ordering="key"``), and
partition order (``ordering="partition"``, one record of a partition at a time) on a topic of
many partitions, as many in flight as partitions.

Sides, each in a process of its own (``benchmarks.child``), alternated, the same records:

- **kworkers**: a ``Worker`` at its defaults but ``ordering`` and ``concurrency`` (= in
  flight), with an async handler.
- **asyncio**: plain asyncio *consuming the records itself* with a plain confluent-kafka
  consumer (``consume()`` in the default executor, the same read-ahead cap), one chain per key
  (per partition in partition order) that runs its records in order, and a semaphore of the
  same size bounding the handlers under way. It keeps no offsets while it runs: it commits
  once, after the clock stopped (so the read-back of committed offsets still checks it).
  It holds every record it has read (nothing bounds it; at full size the whole topic), where
  kworkers holds at most ``max_in_flight`` (20,000) fetched and not completed, and a window
  (from a partition's oldest record not yet done on) of ``backpressure.WINDOW_FACTOR`` shares.
  Hence two controls in key order (not in smoke mode): **asyncio held**, the same plain side
  that stops reading while it holds ``max_in_flight`` records: with few records in flight per
  key, which records are held decides how many keys have one to run; and **kworkers, window 1
  share**: kworkers with its window bounded at one share, which is the rule before issue #50
  counted the whole window against the share (what counting records not yet done bought).
  A third: **kworkers, deadline**, kworkers with a ``message_timeout`` its handlers never
  reach (``DEADLINE_S``): what bounding every call costs, against the kworkers side.

Both are timed from subscribe to the N-th record handled (the group join inside the window:
the time to the first record is printed apart, and so is the rate after it). Every record
carries its key's sequence number; the handler counts a violation when a key's record starts
out of order (or twice), and in partition order also when a partition's offset goes back.

Two more sides in key order: **kworkers+gc**, kworkers with the interpreter's collector as
``kworkers run`` sets it (``kworkers.cli.collector``: ``gc.set_threshold(20_000, 10, 10)``),
which docs/CONFIG.md suggests to an application that embeds a ``Worker``; and **asyncio+gc**,
plain asyncio with the same setting, so that the ratio of the two compares like with like. Why: at
thousands of handlers in flight every record's objects (its task, coroutines, contexts, the
runner's pass) live ~100 ms, long enough to be carried into the old generation, so CPython's
full passes come often and walk hundreds of thousands of objects while the event loop waits:
each side prints the seconds its process spent in the collector and its full passes
(``gc.callbacks``), so what the collector costs is read from the run, not guessed.

``--profile`` runs the kworkers side at 5,000 in flight once under py-spy instead.

``options.loop = "uvloop"`` runs either side on uvloop (its event loop policy set before the
loop is made); shown only when uvloop is installed (it is not a dependency).
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import random
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from benchmarks.child import Meter, Unavailable
from benchmarks.common import (
    Mode,
    console,
    fast_producer,
    fmt,
    kafka,
    quiet_logs,
    result,
    table,
    tune_collector,
)
from benchmarks.method import Comparison, Side, Summary, summary_table
from benchmarks.throughput import GC_TUNED
from kworkers import Message, Worker
from kworkers.config import WorkerConfig
from kworkers.testing.workload import make_topic, produce_patiently, unique

SEED = 20261205
WAIT_S = 0.1
KEY_PARTITIONS = 6
#: kworkers' default ``max_in_flight``: records fetched and not yet completed, per loop
#: the ``kworkers, deadline`` side's ``message_timeout``: never reached, so what it measures is
#: the cost of bounding every call (a timer and, before issue #50's fix, a task per call)
DEADLINE_S = 30.0
HELD = WorkerConfig(topics=("t",), group_id="g").max_in_flight


@dataclass(frozen=True)
class Config:
    name: str  # in RESULT keys: the in-flight figure of a key configuration, or "partition"
    ordering: str
    keys: int
    in_flight: int
    partitions: int
    n: int

    @property
    def label(self) -> str:
        if self.ordering == "partition":
            return f"partition order, {self.partitions} partitions, {self.in_flight} in flight"
        return f"{self.keys:,} keys, {self.in_flight:,} in flight"


def configs(mode: Mode) -> list[Config]:
    n = mode.pick(400, 20_000, 100_000)
    keyed = [Config("1000", "key", mode.pick(100, 1_000, 1_000),
                    mode.pick(100, 1_000, 1_000), KEY_PARTITIONS, n)]
    if mode is not Mode.SMOKE:
        keyed += [Config("2500", "key", 10_000, 2_500, KEY_PARTITIONS, n),
                  Config("5000", "key", 10_000, 5_000, KEY_PARTITIONS, n)]
    parts = mode.pick(4, 32, 64)
    keyed.append(Config("partition", "partition", mode.pick(100, 1_000, 1_000), parts, parts,
                        mode.pick(40, 2_000, 10_000)))
    return keyed


def produce_keyed(bootstrap: str, topic: str, keys: int, n: int, partitions: int) -> int:
    """``n`` records over ``keys`` keys (as even as ``n`` allows), seeded order; a key's
    records go to one partition (``key % partitions``). Value: ``<key>:<seq>``."""
    rng = random.Random(SEED)
    order = [i % keys for i in range(n)]
    rng.shuffle(order)
    seq: dict[int, int] = {}
    p = fast_producer(bootstrap)
    for i, k in enumerate(order):
        s = seq.get(k, 0)
        seq[k] = s + 1
        produce_patiently(p, topic, key=b"k%d" % k, value=b"%d:%d" % (k, s),
                          partition=k % partitions)
        if i % 20_000 == 0:
            p.poll(0)
    if p.flush(60):
        raise RuntimeError("records not delivered")
    return len(seq)


@dataclass
class Probe:
    """What the handler saw (the same on both sides): per-key order, per-partition offsets."""

    meter: Meter
    by_partition: bool  # partition order: a partition's offsets never go back either
    last: dict[bytes, int] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)
    violations: int = 0
    handled: int = 0

    async def handle(self, value: bytes, partition: int, offset: int) -> None:
        key, _, s = value.partition(b":")
        seq = int(s)
        if self.last.get(key, -1) != seq - 1:
            self.violations += 1
        self.last[key] = seq
        if self.by_partition:
            if self.offsets.get(partition, -1) >= offset:
                self.violations += 1
            self.offsets[partition] = offset
        await asyncio.sleep(WAIT_S)
        self.handled += 1
        self.meter.hit()


class CollectorClock:
    """Seconds this process spends in the cyclic garbage collector, and its full passes."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._t0 = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._t0
        self.full += info["generation"] == 2

    def figures(self) -> dict[str, Any]:
        gc.callbacks.remove(self._on)
        return {"gc_s": round(self.seconds, 3), "gc_full": self.full}


def use_loop(options: dict[str, Any]) -> None:
    if options.get("loop") == "uvloop":
        try:
            import uvloop  # type: ignore[import-not-found, unused-ignore]
        except ImportError as exc:
            raise Unavailable("uvloop is not installed (not a dependency)") from exc
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def kworkers_side(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    from benchmarks.sides_kworkers import run_worker

    options = spec["options"]
    use_loop(options)
    if "window_factor" in options:  # the control: the share counted over the whole window
        from kworkers.consumer import backpressure

        backpressure.WINDOW_FACTOR = int(options["window_factor"])
    probe = Probe(meter, options["ordering"] == "partition")
    collector = CollectorClock()

    def register(w: Worker) -> None:
        @w.handler
        async def handle(msg: Message) -> None:
            await probe.handle(msg.value or b"", msg.partition, msg.offset)

    deadline: dict[str, Any] = ({"message_timeout": float(options["deadline"])}
                                if "deadline" in options else {})
    extra = run_worker(spec, meter, register, ordering=options["ordering"],
                       concurrency=int(options["concurrency"]), **deadline)
    return {**extra, "violations": probe.violations, **collector.figures()}


def asyncio_side(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """Plain asyncio: a plain consumer, one chain per key (or partition), a semaphore."""
    from confluent_kafka import Consumer

    options = spec["options"]
    use_loop(options)
    tune_collector(options)
    by_key = options["ordering"] == "key"
    probe = Probe(meter, not by_key)
    collector = CollectorClock()
    consumer = Consumer({"bootstrap.servers": spec["bootstrap"], "group.id": spec["group"],
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "log_level": 3, **spec["consumer_config"]})

    async def main() -> None:
        loop = asyncio.get_running_loop()
        sem = asyncio.Semaphore(int(options["concurrency"]))
        chains: dict[Any, deque[Any]] = {}
        tasks: set[asyncio.Task[None]] = set()

        async def chain(lane: Any, queue: deque[Any]) -> None:
            while queue:
                m = queue[0]
                async with sem:
                    await probe.handle(m.value(), m.partition(), m.offset())
                queue.popleft()
            del chains[lane]  # no await since the queue was seen empty: nothing was added

        held, taken = int(options.get("held") or 0), 0
        meter.start()
        consumer.subscribe([spec["topic"]])
        while not meter.done.is_set():
            if held and taken - probe.handled >= held:
                await asyncio.sleep(0.005)  # as many records held as kworkers may hold
                continue
            msgs = await loop.run_in_executor(None, consumer.consume, 1000, 0.05)
            for m in msgs:
                if m.error():
                    continue
                taken += 1
                lane = m.key() if by_key else m.partition()
                queue = chains.get(lane)
                if queue is not None:
                    queue.append(m)
                    continue
                chains[lane] = queue = deque((m,))
                task = loop.create_task(chain(lane, queue))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)

    asyncio.run(main())
    consumer.commit(asynchronous=False)  # after the clock: every record was handled
    consumer.close()
    return {"violations": probe.violations, **collector.figures()}


def sides_for(cfg: Config, loops: tuple[str, ...], held: bool = False) -> list[Side]:
    """kworkers and asyncio on each loop; ``held``: and asyncio holding at most as many
    records as kworkers' ``max_in_flight`` default (a control: the plain side holds all)."""
    out = []
    for loop in loops:
        suffix = "" if loop == "asyncio" else f"+{loop}"
        opts = {"ordering": cfg.ordering, "concurrency": cfg.in_flight, "loop": loop}
        out += [Side("iobound_kworkers", f"kworkers{suffix}", options=opts),
                Side("iobound_asyncio", f"asyncio{suffix}", options=opts)]
    if held:
        out.append(Side("iobound_kworkers", "kworkers+gc",
                        options={"ordering": cfg.ordering, "concurrency": cfg.in_flight,
                                 **GC_TUNED}))
        out.append(Side("iobound_asyncio", "asyncio+gc",
                        options={"ordering": cfg.ordering, "concurrency": cfg.in_flight,
                                 **GC_TUNED}))
        out.append(Side("iobound_asyncio", "asyncio held",
                        options={"ordering": cfg.ordering, "concurrency": cfg.in_flight,
                                 "held": HELD}))
        out.append(Side("iobound_kworkers", "kworkers, window 1 share",
                        options={"ordering": cfg.ordering, "concurrency": cfg.in_flight,
                                 "window_factor": 1}))
        out.append(Side("iobound_kworkers", "kworkers, deadline",
                        options={"ordering": cfg.ordering, "concurrency": cfg.in_flight,
                                 "deadline": DEADLINE_S}))
    return out


def uvloop_available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def after_first(s: Summary) -> float:
    """Records/s after the first record (the group join left out), median."""
    return s.median(lambda r: (r.records - 1) / max(r.seconds - r.first_s, 1e-9)) or 0.0


def profile_kworkers(mode: Mode) -> None:
    """``--profile``: the kworkers side of the 5,000-in-flight configuration (the largest of
    the mode) once under py-spy (``benchmarks.profile``)."""
    from benchmarks.profile import profile_side

    cfg = [c for c in configs(mode) if c.ordering == "key"][-1]
    with kafka() as bs:
        topic = make_topic(bs, unique("iobound"), cfg.partitions)
        produce_keyed(bs, topic, cfg.keys, cfg.n, cfg.partitions)
        cmp = Comparison(bs, topic, cfg.partitions, cfg.n, cpu_bound=False)
        profile_side(cmp, sides_for(cfg, ("asyncio",))[0], top=12)


def main(mode: Mode, profile: bool = False) -> None:
    quiet_logs()
    if profile:
        profile_kworkers(mode)
        return
    rounds = mode.pick(1, 3, 3)
    loops = ("asyncio", "uvloop") if uvloop_available() and mode is not Mode.SMOKE \
        else ("asyncio",)
    figures: dict[str, float | int | str] = {}
    rows = []
    violations = short = 0
    with kafka() as bs:
        topics: dict[tuple[int, int, int], str] = {}
        for cfg in configs(mode):
            where = (cfg.keys, cfg.partitions, cfg.n)
            if where not in topics:
                topics[where] = make_topic(bs, unique("iobound"), cfg.partitions)
                distinct = produce_keyed(bs, topics[where], cfg.keys, cfg.n, cfg.partitions)
                console.print(f"produced {cfg.n:,} records over {distinct:,} keys, "
                              f"{cfg.partitions} partitions")
            console.print(f"[bold]{cfg.label}[/bold]: handler awaits {WAIT_S * 1000:.0f} ms, "
                          f"ideal {cfg.in_flight / WAIT_S:,.0f} records/s")
            cmp = Comparison(bs, topics[where], cfg.partitions, cfg.n, cpu_bound=False)
            held = mode is not Mode.SMOKE and cfg.ordering == "key"
            summaries = cmp.alternate(sides_for(cfg, loops, held), rounds)
            summary_table(f"iobound: {cfg.label}, {cfg.n:,} records, {rounds} run(s) each, "
                          "alternated, timed from subscribe", summaries.values(), "asyncio")
            kw, plain = summaries["kworkers"], summaries["asyncio"]
            ratio = kw.mps / plain.mps
            by_side = {label: [int(r.extra["violations"]) for r in s.runs]
                       for label, s in summaries.items()}
            v = sum(map(sum, by_side.values()))
            if v:  # which side, which run: a sum alone cannot tell a side's bug from a rerun
                console.print(f"  [red]violations by side, run by run: {by_side}[/red]")
            violations += v
            console.print("  the collector, medians of the runs: " + ", ".join(
                f"{label} {statistics.median(float(r.extra['gc_s']) for r in s.runs):.2f} s "
                f"({statistics.median(int(r.extra['gc_full']) for r in s.runs):.0f} full passes)"
                for label, s in summaries.items()))
            short += sum(s.short_commits for s in summaries.values())
            figures |= {f"ratio_{cfg.name}": round(ratio, 3), f"kworkers_{cfg.name}":
                        round(kw.mps), f"asyncio_{cfg.name}": round(plain.mps)}
            row = [cfg.label, f"{cfg.in_flight / WAIT_S:,.0f}", f"{kw.mps:,.0f}",
                   f"{plain.mps:,.0f}", fmt(ratio, 2),
                   fmt(after_first(kw) / after_first(plain), 2), str(v)]
            if "uvloop" in loops:
                kwu, plu = summaries["kworkers+uvloop"], summaries["asyncio+uvloop"]
                figures |= {f"ratio_uvloop_{cfg.name}": round(kwu.mps / plain.mps, 3),
                            f"kworkers_uvloop_{cfg.name}": round(kwu.mps),
                            f"asyncio_uvloop_{cfg.name}": round(plu.mps)}
                row += [f"{kwu.mps:,.0f} ({kwu.mps / kw.mps:.2f}x)",
                        f"{plu.mps:,.0f} ({plu.mps / plain.mps:.2f}x)"]
            if held:
                control = summaries["asyncio held"]
                one = summaries["kworkers, window 1 share"]
                bounded = summaries["kworkers, deadline"]
                tuned, plain_tuned = summaries["kworkers+gc"], summaries["asyncio+gc"]
                figures |= {f"kworkers_gc_{cfg.name}": round(tuned.mps),
                            f"ratio_gc_{cfg.name}": round(tuned.mps / plain.mps, 3),
                            f"asyncio_gc_{cfg.name}": round(plain_tuned.mps),
                            f"ratio_gc_both_{cfg.name}": round(tuned.mps / plain_tuned.mps, 3),
                            f"asyncio_held_{cfg.name}": round(control.mps),
                            f"ratio_held_{cfg.name}": round(kw.mps / control.mps, 3),
                            f"kworkers_window1_{cfg.name}": round(one.mps),
                            f"ratio_window1_{cfg.name}": round(one.mps / plain.mps, 3),
                            f"kworkers_deadline_{cfg.name}": round(bounded.mps),
                            f"deadline_x_kworkers_{cfg.name}": round(bounded.mps / kw.mps, 3)}
                row += [f"{tuned.mps:,.0f} ({tuned.mps / plain.mps:.2f}x)",
                        f"{plain_tuned.mps:,.0f} "
                        f"(kworkers+gc x it {tuned.mps / plain_tuned.mps:.2f})",
                        f"{control.mps:,.0f} ({kw.mps / control.mps:.2f}x)",
                        f"{one.mps:,.0f} ({one.mps / plain.mps:.2f}x)",
                        f"{bounded.mps:,.0f} ({bounded.mps / kw.mps:.2f}x)"]
            else:
                row += ["", "", "", "", ""]
            rows.append(row)
    columns = ["configuration", "ideal/s", "kworkers/s", "asyncio/s", "x asyncio",
               "x asyncio after 1st record", "violations"]
    if "uvloop" in loops:
        columns += ["kworkers+uvloop/s (x kworkers)", "asyncio+uvloop/s (x asyncio)"]
    columns += [f"kworkers+gc (threshold {GC_TUNED['gc']['threshold'][0]:,}, as kworkers run)/s "
                "(x asyncio)", "asyncio+gc/s (kworkers+gc x it)",
                f"asyncio holding <= {HELD:,}/s (kworkers x it)",
                "kworkers, window 1 share/s (x asyncio)",
                f"kworkers, {DEADLINE_S:.0f} s deadline/s (x kworkers)"]
    table("iobound (medians; aims: >= 0.8x asyncio at 5,000 in flight, >= 0.95x at 1,000, "
          "0 violations)", columns, rows)
    result("iobound", {**figures, "violations": violations, "short_commits": short,
                       "uvloop": "yes" if "uvloop" in loops else "no"})

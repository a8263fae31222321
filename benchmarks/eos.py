"""eos: a handler that produces one output per record, at least once against exactly once.

Sides (``benchmarks.method``: one process each, alternated, a fresh group each run, timed from
subscribe to the N-th record handled, read-ahead capped):

- ``raw_eos``: the hand-written exactly-once loop at best (confluent-kafka, one thread:
  ``consume(500)``, a transactional producer, ``send_offsets_to_transaction`` + commit once a
  second): the ceiling of an exactly-once Python consumer;
- ``kworkers_alo``: ``activity.produce`` under ``guarantee="at_least_once"`` (the record
  completes once its output is acknowledged);
- ``kworkers_eos``: the same handler under ``guarantee="exactly_once"`` (outputs held until the
  transaction that commits their record's offset, one per loop per commit interval);
- ``quix_eos`` / ``quix_alo``: quixstreams ``StreamingDataFrame.to_topic`` under its
  ``processing_guarantee`` (outside smoke mode; its own venv).

The meter counts records handled; an exactly-once side's last outputs commit up to one
interval after its N-th record, inside the final commit of its stop (not timed, for every side
alike). Each side writes to an output topic of its own.
"""

from __future__ import annotations

import dataclasses
import time

from rich.markup import escape

from benchmarks import peer_envs
from benchmarks.common import Mode, console, kafka, quiet_logs, result
from benchmarks.method import Comparison, Side, loadavg, summary_table
from kworkers.testing.workload import end_offsets_total, make_topic, unique

PARTITIONS = 6
VALUE_SIZE = 100
AIMS = (("kworkers_eos", "kworkers_alo", 0.5), ("kworkers_eos", "quix_eos", 1.0))


def sides(mode: Mode, bootstrap: str) -> list[Side]:
    def out() -> str:
        return make_topic(bootstrap, unique("eos-out"), PARTITIONS)

    made = [Side("raw_eos", "raw_eos", options={"output": out()}),
            Side("kworkers_output", "kworkers_alo",
                 options={"output": out(), "guarantee": "at_least_once"}),
            Side("kworkers_output", "kworkers_eos",
                 options={"output": out(), "guarantee": "exactly_once"})]
    quix = next(p for p in peer_envs.PEERS if p.name == "quix")
    labels = (("quix_eos", "exactly-once"), ("quix_alo", "at-least-once"))
    if mode is Mode.SMOKE:
        return made + [Side("quix", label, unavailable="skipped in smoke mode")
                       for label, _ in labels]
    try:
        python = peer_envs.ensure(quix)
    except RuntimeError as exc:
        return made + [Side("quix", label, unavailable=str(exc)) for label, _ in labels]
    return made + [Side("quix", label, python=python,
                        options={"output": out(), "guarantee": g}) for label, g in labels]


def main(mode: Mode) -> None:
    quiet_logs()
    n = mode.pick(20_000, 200_000, 500_000)
    rounds = mode.pick(1, 3, 3)
    t0 = time.monotonic()
    console.print(f"load average {loadavg()}")
    with kafka() as bs:
        cmp = Comparison.on_new_topic(bs, "eos", n, PARTITIONS, VALUE_SIZE)
        the_sides = sides(mode, bs)
        for python in dict.fromkeys(s.python for s in the_sides if not s.unavailable):
            cmp.measure_read_ahead(python)
        summaries = cmp.alternate(the_sides, rounds)
        # the outputs are there: each side's output topic ends at least at runs x N (an
        # exactly-once side's ends count its transaction markers too)
        for side in the_sides:
            done = summaries[side.label].runs
            if side.unavailable or not done:
                continue
            written = end_offsets_total(bs, side.options["output"], PARTITIONS)
            console.print(f"  {side.label}: output topic ends at {written:,} after "
                          f"{len(done)} run(s) of {n:,}")
            if written < len(done) * n:
                was = summaries[side.label]
                summaries[side.label] = dataclasses.replace(
                    was, notes=(*was.notes, "fewer outputs than records"))
    summary_table(f"eos: one output per record, {n:,} records x {VALUE_SIZE} B, {PARTITIONS} "
                  f"partitions, {rounds} run(s) each, alternated, timed from subscribe",
                  summaries.values(), "raw_eos", cmp.read_ahead)
    figures: dict[str, float | int | str] = {
        f"{label}_mps": round(s.mps) if s.ok else "n/a" for label, s in summaries.items()}
    for (mine, against, aim), key in zip(AIMS, ("ratio_alo", "ratio_quix"), strict=True):
        a, b = summaries.get(mine), summaries.get(against)
        if a is None or b is None or not a.ok or not b.ok:
            figures[key] = "n/a"
            console.print(escape(f"{mine}/{against}: not measured"))
            continue
        figures[key] = round(a.mps / b.mps, 3)
        console.print(f"{mine}/{against} = {a.mps / b.mps:.3f} (aim >= {aim})")
    figures["short_commits"] = sum(s.short_commits for s in summaries.values())
    figures["records"] = n
    figures["seconds"] = round(time.monotonic() - t0)
    result("eos", figures)

"""peers: kworkers beside the raw client loop and the Python peers, on one topic of one broker.

Sides, each in its own process, alternated round by round with a fresh group each (the method
is ``benchmarks.method``):

- ``raw``: confluent-kafka ``consume(500)`` loop, a synchronous commit a second;
- ``kworkers`` (sync no-op handler, on the handler threads: the default), ``kworkers_inline``
  (the same handler on the poll thread, ``execution="inline"``, opt-in), ``kworkers_async``
  (``async def`` no-op), and ``kworkers_batch`` (a batch handler of a list of records);
- ``quix``: quixstreams ``Application`` + ``StreamingDataFrame.update``;
- ``arroyo``: ``StreamProcessor`` + ``RunTask`` + ``CommitOffsets``, ``ONCE_PER_SECOND``;
- ``faststream``: faststream's confluent ``KafkaBroker`` with one default subscriber, and
  ``faststream_batch``: its batch subscriber (``batch=True, max_records=500``).

The peers run in venvs of their own, installed on first use (``benchmarks.peer_envs``); in
``--smoke`` mode they are skipped (no installs in CI). faststream is far slower than the rest
(one record per ``poll()`` through an executor hop), so it gets a smaller N, still at least
10x the read-ahead; the table says so.
"""

from __future__ import annotations

import time

from rich.markup import escape

from benchmarks import peer_envs
from benchmarks.common import Mode, console, kafka, quiet_logs, result
from benchmarks.method import Comparison, Side, Summary, loadavg, summary_table

PARTITIONS = 6
VALUE_SIZE = 100
AIMS = (  # (side, against, at least): issue #32's against the raw loop (#18's were 0.8, 0.8,
    # 0.6 and 0.9; missed, and restated by #32), #18's against the peers
    ("kworkers", "raw", 0.4),
    ("kworkers_async", "raw", 0.3),
    ("kworkers_batch", "raw", 0.6),
    ("kworkers", "quix", 1.5),
    ("kworkers", "arroyo", 3.0),
)


def sides(mode: Mode, n_slow: int) -> list[Side]:
    out = [Side("raw", "raw"), Side("kworkers", "kworkers"),
           Side("kworkers_inline", "kworkers_inline"),
           Side("kworkers_async", "kworkers_async"), Side("kworkers_batch", "kworkers_batch")]
    for peer in peer_envs.PEERS:
        variants: list[tuple[str, int | None, dict[str, object]]] = [
            (peer.label, n_slow if peer.name == "faststream" else None, {})]
        if peer.name == "faststream":
            variants.append(("faststream_batch", None, {"batch": True}))
        if mode is Mode.SMOKE:
            out += [Side(peer.name, label, unavailable="skipped in smoke mode")
                    for label, _, _ in variants]
            continue
        try:
            python = peer_envs.ensure(peer)
        except RuntimeError as exc:
            out += [Side(peer.name, label, unavailable=str(exc)) for label, _, _ in variants]
            continue
        out += [Side(peer.name, label, python=python, n=n, options=options)
                for label, n, options in variants]
    return out


#: the kworkers sides ``--profile`` runs under py-spy, one after the other
PROFILED = ("kworkers", "kworkers_inline", "kworkers_async", "kworkers_batch")


def main(mode: Mode, profile: bool = False) -> None:
    quiet_logs()
    n = mode.pick(20_000, 300_000, 1_000_000)
    n_slow = mode.pick(20_000, 60_000, 100_000)
    rounds = mode.pick(1, 3, 3)
    t_start = time.monotonic()
    if profile:
        from benchmarks.profile import profile_side

        with kafka() as bs:
            cmp = Comparison.on_new_topic(bs, "peers", n, PARTITIONS, VALUE_SIZE)
            for name in PROFILED:
                profile_side(cmp, Side(name, name))
        return
    if mode is Mode.SMOKE:
        console.print(escape("peers skipped in smoke mode (no installs in CI): "
                             + ", ".join(p.requirement for p in peer_envs.PEERS)))
    the_sides = sides(mode, n_slow)
    console.print(f"load average {loadavg()}")
    with kafka() as bs:
        cmp = Comparison.on_new_topic(bs, "peers", n, PARTITIONS, VALUE_SIZE)
        for python in dict.fromkeys(s.python for s in the_sides if not s.unavailable):
            cmp.measure_read_ahead(python)
        summaries = cmp.alternate(the_sides, rounds)
        cmp.flag_faster_than(summaries, "raw")
    took = time.monotonic() - t_start
    summary_table(f"peers: {PARTITIONS} partitions x {VALUE_SIZE} B, timed from subscribe to "
                  f"the N-th record, {rounds} run(s) each, alternated ({took:.0f}s in all; "
                  f"load average now {loadavg()})", summaries.values(), "raw",
                  cmp.read_ahead)
    aims(summaries)
    figures: dict[str, float | int | str] = {}
    for label in ("raw", "kworkers", "kworkers_inline", "kworkers_async", "kworkers_batch",
                  "quix", "arroyo",
                  "faststream", "faststream_batch"):
        s = summaries[label]
        figures[f"{label}_mps"] = round(s.mps) if s.ok else "n/a"
    figures["records"] = n
    figures["read_ahead"] = max(cmp.read_ahead.values())
    figures["short_commits"] = sum(s.short_commits for s in summaries.values())
    figures["seconds"] = round(took)
    result("peers", figures)


def aims(summaries: dict[str, Summary]) -> None:
    """The aims as ratios of medians, met or not (n/a when a side did not run)."""
    parts = []
    for side, against, at_least in AIMS:
        a, b = summaries[side], summaries[against]
        if a.ok and b.ok:
            r = a.mps / b.mps
            parts.append(f"{side}/{against} = {r:.2f} (aim >= {at_least}: "
                         f"{'met' if r >= at_least else 'MISSED'})")
        else:
            parts.append(f"{side}/{against}: n/a (aim >= {at_least})")
    console.print("aims: " + "; ".join(parts))

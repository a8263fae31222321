"""Exactly-once outputs under SIGKILL: each input has exactly one output a read_committed reader
sees, no matter where the kills land (issue #30).

Two ``tests/apps/eos_worker.py`` processes (KIP-848, a stable transactional id per slot, so a
restarted slot fences its killed predecessor at once) consume a numbered source; each record
produces one output carrying its source place, and every fifth record fails its first attempt
after producing (the output of that attempt must never be seen; its retry goes through a tier in
the same transaction as the offset). Workers are SIGKILLed mid-flight and restarted.

Judged from data read back: the output topic read from every partition's start with
read_committed (``checker.read_log``), against the source as produced; the handler-start ledger
(append-only) shows the kills made records run again (else the run proved nothing). The
canary runs the same at least once: the judge must find duplicates there.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from kworkers.retry_tiers.headers import ORIGINAL_OFFSET, ORIGINAL_PARTITION
from kworkers.testing import Broker, broker_from_env
from kworkers.testing.broker import free_port
from kworkers.testing.checker import read_log
from kworkers.testing.ledger import Ledger
from kworkers.testing.netns import NetnsLink, netns_available
from kworkers.testing.processes import WorkerProcess
from kworkers.testing.workload import full_size, make_topic, produce_numbered, unique
from tests.faults.hostile import topic_ends
from tests.integration.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = str(Path(__file__).resolve().parents[2])
PARTS = 3


def exactly_once_problems(expected: set[str], seen: Counter[str]) -> list[str]:
    """What breaks "each input exactly one output": missing, doubled, or from nowhere."""
    out = [f"lost {p}" for p in sorted(expected - set(seen))]
    out += [f"{p} seen {n} times" for p, n in sorted(seen.items()) if n > 1]
    out += [f"{p} is no input" for p in sorted(set(seen) - expected)]
    if not expected:
        out.append("no input at all: an empty run proves nothing")
    return out


def _outputs(bs: str, topic: str) -> Counter[str]:
    return Counter((dict(r.headers).get("src") or b"?").decode() for r in read_log(bs, topic))


@dataclass(frozen=True)
class Run:
    expected: set[str]  # the places of the inputs that must have one output
    poison: set[str]  # the places of the inputs that must have one dead letter
    outputs: Counter[str]  # read back with read_committed, by source place
    dead: Counter[str]
    ledger: Ledger


def _dead(bs: str, dlq: str) -> Counter[str]:
    return Counter(f"{int(h[ORIGINAL_PARTITION])}@{int(h[ORIGINAL_OFFSET])}"
                   for h in (dict(r.headers) for r in read_log(bs, dlq)))


def _kill_loop(bs: str, tmp: Path, guarantee: str, kills: int,
               restart: Callable[[], None] | None = None) -> Run:
    src = make_topic(bs, unique("eos-src"), PARTS)
    out = make_topic(bs, unique("eos-out"), PARTS)
    group = unique("eos")
    total = full_size(20_000, 750)  # CI: the smallest size seen to catch its canary (#42)
    produce_numbered(bs, src, total, keys=total)
    source = read_log(bs, src)
    assert len(source) == total
    poison = {f"{r.partition}@{r.offset}" for r in source if int(r.value or b"0") % 50 == 7}
    expected = {f"{r.partition}@{r.offset}" for r in source} - poison
    ledger = Ledger(tmp / "ledger.db")
    workers = [WorkerProcess(["-m", "tests.apps.eos_worker", bs, src, out, group,
                              "--ledger", str(tmp / "ledger.db"), "--guarantee", guarantee,
                              "--txn-id", f"{group}-slot{i}", "--slow-ms", "15"],
                             tmp, f"w{i}", cwd=ROOT) for i in range(2)]
    try:
        for w in workers:
            w.start()
        for k in range(kills):
            goal = total * (k + 1) // (kills + 2)
            wait_for(lambda g=goal: ledger.counts()[1] >= g, 120,  # type: ignore[misc]
                     f"{goal} starts before kill {k + 1}")
            victim = workers[k % len(workers)]
            victim.kill()
            if restart is not None and k == kills // 2:
                restart()  # the broker SIGKILLed and started again, transactions open
            victim.start()
        def all_out() -> bool:
            try:
                return set(_outputs(bs, out)) >= expected and \
                    set(_dead(bs, f"{src}.dlq")) >= poison
            except TimeoutError:  # a killed producer's transaction holds the stable offset
                return False

        wait_for(all_out, 240, "an output of every input")
        for w in workers:
            assert w.terminate() == 0, w.log()[-3000:]
        return Run(expected, poison, _outputs(bs, out), _dead(bs, f"{src}.dlq"), ledger)
    finally:
        for w in workers:
            w.close()


def test_sigkill_loop_each_input_has_exactly_one_committed_output(
        fault_broker: Broker, tmp_path: Path) -> None:
    bs = fault_broker.bootstrap_servers
    run = _kill_loop(bs, tmp_path, "exactly_once", kills=4,
                     restart=lambda: fault_broker.restart(hard=True))
    starts = Counter(e.key for e in run.ledger.effects())
    ran_again = sum(1 for n in starts.values() if n > 1)
    print(f"inputs {len(run.expected) + len(run.poison)}, outputs read_committed "
          f"{sum(run.outputs.values())}, dead letters {sum(run.dead.values())} "
          f"(poison {len(run.poison)}), records started more than once {ran_again}")
    problems = exactly_once_problems(run.expected, run.outputs)
    assert not problems, problems[:20]
    dead = exactly_once_problems(run.poison, run.dead)
    assert not dead, dead[:20]  # the DLQ holds exactly the poison records, once each
    # the run tested something: the kills made records run again (every fifth record's
    # retry is planned: those start twice even without a kill)
    planned = (len(run.expected) + len(run.poison) + 4) // 5  # values 0..n-1, 0 mod 5
    assert ran_again > planned, "no kill landed on work in flight"


def test_canary_at_least_once_under_the_same_kills_is_caught(
        kafka_broker: Broker, tmp_path: Path) -> None:
    run = _kill_loop(kafka_broker.bootstrap_servers, tmp_path, "at_least_once", kills=3)
    problems = exactly_once_problems(run.expected, run.outputs)
    assert any("times" in p for p in problems), "the judge found no duplicate: it cannot fail"


def test_the_judge_reports_loss_duplicates_strays_and_an_empty_run() -> None:
    assert exactly_once_problems({"0@0", "0@1"}, Counter({"0@0": 1, "0@1": 1})) == []
    assert exactly_once_problems({"0@0", "0@1"}, Counter({"0@0": 2, "9@9": 1})) == [
        "lost 0@1", "0@0 seen 2 times", "9@9 is no input"]
    assert exactly_once_problems(set(), Counter()) != []


def cut_off_problems(b_late: int, late_writes: int) -> list[str]:
    """What makes the cut-off run prove nothing, whatever the outputs: B started no record
    after the cut (it held no work to deliver), or none of its writes reached the output topic
    once A was done (the fence was never tried)."""
    out = []
    if b_late < 1:
        out.append("B started nothing after the cut: it held no work to deliver")
    if late_writes < 1:
        out.append("no record reached the output topic after A was done: B never tried")
    return out


@pytest.mark.parametrize("variant", ["exactly_once", "at_least_once", "b_gone"],
                         ids=["transactions", "canary-at-least-once", "canary-b-gone"])
def test_a_member_cut_off_commits_no_output_of_its_lost_partitions(
        tmp_path: Path, variant: str) -> None:
    """B (200 ms a record, self-fencing OFF, so only the broker's fencing is left) works alone
    in a network namespace; its link is cut, A takes every partition after the session and
    finishes; the link heals and B, still holding records, tries to deliver. Exactly once: B's
    transaction is refused (its generation is gone), nothing of it is seen. Asserted too, from
    the ledger and the broker: B started records after the cut, and its writes reached the
    output topic after A was done (records read with read_uncommitted past the ends of A's
    finish: aborted ones count, transaction markers do not). The canary (at least once) shows
    B's late outputs as duplicates; the canary ``b_gone`` (B SIGKILLed at the cut, exactly
    once) passes the exactly-once verdict alone and fails those two checks."""
    guarantee = "at_least_once" if variant == "at_least_once" else "exactly_once"
    why = netns_available()
    if why is not None:
        pytest.skip(f"network namespaces unavailable here: {why}")
    link = NetnsLink()
    workers: list[WorkerProcess] = []
    broker = None
    try:
        link.create()
        ns_bs = f"{link.host_ip}:{free_port()}"  # B's only way to the broker
        broker = broker_from_env(own=True, listeners={"NETNS": ns_bs})
        broker.start()
        bs = broker.bootstrap_servers
        src = make_topic(bs, unique("eos-cut"), 2)
        out = make_topic(bs, unique("eos-cut-out"), 2)
        group = unique("eos")
        total = 200 if variant == "b_gone" else full_size(2_000, 300)  # (#42: size search)
        produce_numbered(bs, src, total, keys=total)
        source = read_log(bs, src)
        poison = {f"{r.partition}@{r.offset}" for r in source if int(r.value or b"0") % 50 == 7}
        expected = {f"{r.partition}@{r.offset}" for r in source} - poison
        ledger = Ledger(tmp_path / "ledger.db")

        def worker(name: str, boot: str, slow: str) -> WorkerProcess:
            return WorkerProcess(["-m", "tests.apps.eos_worker", boot, src, out, group,
                                  "--ledger", str(tmp_path / "ledger.db"), "--guarantee",
                                  guarantee, "--txn-id", f"{group}-{name}", "--slow-ms", slow,
                                  "--no-fencing"], tmp_path, name, cwd=ROOT)

        a, b = worker("a", bs, "5"), worker("b", ns_bs, "200")
        b.args = link.command(b.args)  # runs inside the namespace
        workers = [a, b]
        b.start()
        wait_for(lambda: ledger.counts()[1] >= 20, 90, "B at work")
        b_pid = b.pid
        cut_at = time.time()
        link.cut()
        if variant == "b_gone":
            b.kill()
        a.start()  # the group expels B after its session; A gets every partition

        def all_out() -> bool:
            try:
                return set(_outputs(bs, out)) >= expected and \
                    set(_dead(bs, f"{src}.dlq")) >= poison
            except TimeoutError:
                return False

        wait_for(all_out, 180, "A finished every input")
        a_done = _outputs(bs, out)
        ends_a_done = topic_ends(bs).get(out, {})  # B cut off, A has nothing more to write
        link.heal()
        if guarantee == "at_least_once":  # B's late outputs arrive as duplicates
            wait_for(lambda: any(n > 1 for n in _outputs(bs, out).values()), 60,
                     "B's late outputs")
        else:  # B reconnects holding outputs, then its SIGTERM's drain commits what it holds
            time.sleep(3.0)  # not a bound: B's chance to reach the broker before its stop
        for w in (b, a):
            if w.alive:
                w.terminate()
        moved = sum(topic_ends(bs).get(out, {}).values()) - sum(ends_a_done.values())
        # every record written after A was done, aborted ones too (markers are no records)
        late_writes = sum(1 for r in read_log(bs, out, config={
            "isolation.level": "read_uncommitted"}) if r.offset >= ends_a_done.get(
                r.partition, 0))
        seen = _outputs(bs, out)
        b_ran = [e for e in ledger.effects() if e.pid == b_pid]
        b_late = sum(1 for e in b_ran if e.at > cut_at)
        print(f"{variant}: B started {len(b_ran)} records, {b_late} after the cut; outputs "
              f"{sum(seen.values())} for {len(expected)} inputs (when A was done: "
              f"{sum(a_done.values())}); after A was done {late_writes} records reached the "
              f"output topic (its end moved {moved}: aborted records and markers count)")
        problems = exactly_once_problems(expected, seen)
        tested = cut_off_problems(b_late, late_writes)
        print(f"{variant}: the cut-off checks find {tested}")
        if variant == "exactly_once":
            assert not problems, problems[:20]
            assert not exactly_once_problems(poison, _dead(bs, f"{src}.dlq"))
            assert not tested, tested
        elif variant == "at_least_once":
            assert any("times" in p for p in problems), "the canary shows no duplicate"
            assert not tested, tested
        else:  # the exactly-once verdict alone passes a run in which B never came back
            assert not problems, problems[:20]
            assert len(tested) == 2, tested
    finally:
        for w in workers:
            w.close()
        if broker is not None:
            broker.close()
        link.close()

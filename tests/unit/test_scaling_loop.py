"""The scaling loop's rules worked by hand (kworkers.testing.scaling_loop): KEDA's activation
and cooldown, the HPA's ceil(value / target), max over metrics, tolerance, stabilization and
rate policies, min/max, and a rendered ScaledObject read with its intervals sped up."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kworkers.deploy import example_config, manifests
from kworkers.deploy.samples import EXAMPLE_ARGS
from kworkers.testing.scaling_loop import (
    Direction,
    Figure,
    LoopSpec,
    Policy,
    ScalingLoop,
    metric_replicas,
)

FAST_UP = Direction(0.0, (Policy("Percent", 100, 15.0), Policy("Pods", 4, 15.0)))


def wake(active: bool, lag: float = 0.0) -> Figure:
    return Figure("wake", lag, 10.0**15, active)


def drain(value: float, target: float = 100.0) -> Figure:
    return Figure("drain", value, target, value > 0)


def run(loop: ScalingLoop, script: Sequence[tuple[float, Sequence[Figure]]],
        until: float, step: float = 1.0) -> list[tuple[float, int]]:
    """Advance second by second; the figures are the script's latest entry at that time."""
    out, t = [], 0.0
    while t <= until:
        figs = [f for at, f in script if at <= t][-1]

        def read(figs: Sequence[Figure] = figs) -> Sequence[Figure]:
            return figs

        out.append((t, loop.advance(t, read)))
        t += step
    return out


def test_metric_replicas_is_ceil_of_value_over_target_outside_the_tolerance() -> None:
    assert metric_replicas(drain(250), 1, 0.1) == 3
    assert metric_replicas(drain(0), 3, 0.1) == 0
    assert metric_replicas(drain(310), 3, 0.1) == 3  # 310 / 300 within 10%: stays
    assert metric_replicas(drain(340), 3, 0.1) == 4
    assert metric_replicas(wake(True, 5_000_000), 2, 0.1) == 1  # the wake trigger asks for 1


def test_activation_wakes_from_zero_and_the_hpa_takes_the_largest_metric() -> None:
    loop = ScalingLoop(LoopSpec(polling_interval=30, sync_period=15, max_replicas=6,
                                up=FAST_UP))
    assert loop.advance(0, lambda: [wake(False), drain(0)]) == 0
    assert loop.advance(15, lambda: [wake(False), drain(0)]) == 0  # HPA idle at 0
    assert loop.advance(30, lambda: [wake(True, 450), drain(450)]) == 5  # keda 1, hpa 5
    assert [(e.by, e.before, e.after) for e in loop.events] == [("keda", 0, 1), ("hpa", 1, 5)]


def test_scale_up_is_limited_per_period_by_the_policies() -> None:
    loop = ScalingLoop(LoopSpec(polling_interval=30, sync_period=15, max_replicas=20,
                                up=Direction(0.0, (Policy("Pods", 2, 60.0),))))
    loop.advance(0, lambda: [wake(True), drain(2000)])
    assert loop.replicas == 3  # 1 + 2 pods a minute
    loop.advance(15, lambda: [wake(True), drain(2000)])
    assert loop.replicas == 3  # the period's 2 pods spent
    loop.advance(61, lambda: [wake(True), drain(2000)])
    assert loop.replicas == 5


def test_max_replicas_caps_and_zero_waits_for_the_cooldown() -> None:
    spec = LoopSpec(polling_interval=30, cooldown=300, max_replicas=3, sync_period=15,
                    up=FAST_UP, down=Direction(0.0, (Policy("Percent", 100, 15.0),)))
    loop = ScalingLoop(spec)
    trace = run(loop, [(0, [wake(True, 900), drain(900)]), (60, [wake(False), drain(0)])],
                until=400)
    assert max(r for _, r in trace) == 3
    ones = [t for t, r in trace if r == 1]
    assert ones and ones[0] >= 60  # scaled down to the floor of 1 once the lag is gone
    zero = min(t for t, r in trace if t > 60 and r == 0)
    assert 30 + 300 <= zero <= 30 + 300 + 30  # last active poll at 30, then the cooldown


def test_a_wake_trigger_alone_keeps_one_replica_never_more_never_zero() -> None:
    loop = ScalingLoop(LoopSpec(polling_interval=30, cooldown=300, max_replicas=6))
    trace = run(loop, [(0, [wake(True, 1840), drain(0)])], until=1200)
    assert {r for t, r in trace if t > 0} == {1}


def test_scale_down_stabilization_takes_the_largest_recommendation_of_the_window() -> None:
    spec = LoopSpec(polling_interval=30, sync_period=15, max_replicas=6, up=FAST_UP,
                    down=Direction(300.0, (Policy("Percent", 100, 15.0),)))
    loop = ScalingLoop(spec)
    trace = run(loop, [(0, [wake(True), drain(500)]), (100, [wake(True), drain(120)])],
                until=500)
    assert dict(trace)[99] == 5
    assert dict(trace)[350] == 5  # 5 recommended at 90: held until 90 + 300
    assert dict(trace)[420] == 2


def test_steady_load_wobbling_around_a_threshold_does_not_flap() -> None:
    spec = LoopSpec(polling_interval=30, sync_period=15, max_replicas=6, up=FAST_UP,
                    down=Direction(300.0, (Policy("Percent", 50, 60.0),)))
    loop = ScalingLoop(spec)
    script = [(float(t), [wake(True), drain(190.0 if (t // 15) % 2 else 210.0)])
              for t in range(0, 1200, 15)]
    run(loop, script, until=1200)
    assert loop.changes_within(100, 1200) == 0


def test_the_same_loop_flaps_without_stabilization() -> None:
    """Canary for the flap count: no down window, no tolerance."""
    spec = LoopSpec(polling_interval=30, sync_period=15, max_replicas=6, up=FAST_UP,
                    tolerance=0.0, down=Direction(0.0, (Policy("Percent", 100, 15.0),)))
    loop = ScalingLoop(spec)
    script = [(float(t), [wake(True), drain(190.0 if (t // 15) % 2 else 210.0)])
              for t in range(0, 1200, 15)]
    run(loop, script, until=1200)
    assert loop.changes_within(100, 1200) > 10


def test_a_rendered_scaledobject_sped_up() -> None:
    objs = manifests(example_config(), **EXAMPLE_ARGS)
    so = objs["keda/scaledobject.yaml"]
    spec = LoopSpec.from_scaledobject(so, speedup=30)
    assert (spec.polling_interval, spec.cooldown, spec.sync_period) == (1.0, 10.0, 0.5)
    assert (spec.min_replicas, spec.max_replicas) == (0, 6)
    assert spec.down.window == 10.0 and spec.up.window == 0.0
    assert spec.down.policies == (Policy("Percent", 50, 2.0),)
    assert spec.up.policies == (Policy("Percent", 100, 0.5), Policy("Pods", 4, 0.5))


@pytest.mark.parametrize("minimum", [1, 2])
def test_min_replicas_is_a_floor_and_never_zero(minimum: int) -> None:
    loop = ScalingLoop(LoopSpec(polling_interval=30, min_replicas=minimum, max_replicas=6))
    trace = run(loop, [(0, [wake(False), drain(0)])], until=900)
    assert {r for _, r in trace} == {minimum}


def unread(name: str = "wake") -> Figure:
    return Figure(name, float("nan"), 10.0**15, False, "not the leader for this partition")


def test_a_trigger_unread_holds_the_pool_where_it_is_never_to_zero() -> None:
    """KEDA with no trigger active and one erring neither scales to zero nor counts the
    cooldown as met by the error; once the trigger reads inactive again, the cooldown since
    the last active poll decides, as before."""
    loop = ScalingLoop(LoopSpec(polling_interval=10, sync_period=15, cooldown=60,
                                max_replicas=4))
    trace = run(loop, [(0, [wake(True, 5), drain(0)]), (5, [unread(), drain(0)]),
                       (200, [wake(False), drain(0)])], until=230)
    assert dict(trace)[199] == 1  # held through 190 s of errors, past the 60 s cooldown
    assert dict(trace)[230] == 0  # read inactive again: the cooldown had passed
    assert [(e.before, e.after, e.by) for e in loop.events] == [(0, 1, "keda"), (1, 0, "keda")]


def test_a_trigger_unread_wakes_nothing_but_another_active_one_still_does() -> None:
    loop = ScalingLoop(LoopSpec(polling_interval=10, sync_period=15, max_replicas=4))
    assert loop.advance(0, lambda: [unread(), drain(0)]) == 0
    assert loop.advance(10, lambda: [unread(), drain(150)]) == 1


def test_the_hpa_scales_up_on_the_metrics_it_reads_and_never_down_while_one_is_unread(
) -> None:
    """Kubernetes' rule: with a metric unreadable, a scale-up the others ask for happens, a
    scale-down they ask for is skipped (no recommendation kept), and so is a sync with none
    readable."""
    spec = LoopSpec(polling_interval=1000, sync_period=15, max_replicas=6, up=FAST_UP,
                    down=Direction(0.0, (Policy("Percent", 100, 15.0),)))
    loop = ScalingLoop(spec, replicas=2)
    assert loop.hpa_sync(0, [unread(), drain(450)]) == 5  # up: 450 / 100
    assert loop.hpa_sync(15, [unread(), drain(100)]) == 5  # down skipped
    assert loop.hpa_sync(30, [unread(), unread("drain")]) == 5  # none readable
    assert loop.recommendations == [(0, 5)]
    assert loop.hpa_sync(45, [wake(False), drain(100)]) == 1  # all read: down as asked


def test_a_run_mostly_unread_cannot_be_judged() -> None:
    """The guard every scenario's run passes (``autoscaling.drive``): a few errors pass, a
    run on holds does not, nor an empty one."""
    from kworkers.testing.scaling_loop import unread_problems

    fine = [(float(t), (wake(False), drain(0))) for t in range(20)]
    assert unread_problems(fine) == []
    assert unread_problems(fine + [(20.0, (unread(), drain(0)))] * 2) == []
    held = fine[:5] + [(float(t), (unread(), drain(0))) for t in range(5, 20)]
    assert unread_problems(held) and "15 of 20" in unread_problems(held)[0]
    assert unread_problems([]) == ["no reading at all"]

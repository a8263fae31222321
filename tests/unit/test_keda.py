"""The KEDA replica calculator on hand-worked cases (each comment shows the arithmetic)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kworkers.errors import ConfigError
from kworkers.keda import (
    PartitionOffsets,
    ScaleDecision,
    ScalerSettings,
    committed_offsets,
    desired_replicas,
)

T = "orders"


def parts(*lags: int, latest: int = 1000) -> list[PartitionOffsets]:
    """Partitions 0..n-1 of ``orders`` with the given lags (committed = latest - lag)."""
    return [PartitionOffsets(T, i, latest, latest - lag) for i, lag in enumerate(lags)]


def no_commit(n: int, latest: int = 100) -> list[PartitionOffsets]:
    return [PartitionOffsets(T, i, latest, None) for i in range(n)]


def decide(settings: ScalerSettings, ps: list[PartitionOffsets], prev: dict[tuple[str, int], int]
           | None = None, current: int = 1, lo: int = 0, hi: int = 100,
           **kw: float) -> ScaleDecision:
    return desired_replicas(settings, ps, prev, current, lo, hi, **kw)


DEFAULT = ScalerSettings()


def test_defaults_are_kedas() -> None:
    s = ScalerSettings()
    assert (s.lag_threshold, s.activation_lag_threshold, s.offset_reset_policy) == (10, 0, "latest")
    assert not (s.allow_idle_consumers or s.scale_to_zero_on_invalid_offset
                or s.exclude_persistent_lag or s.limit_to_partitions_with_lag)


def test_plain_lag() -> None:
    # 5 + 20 + 0 = 25; ceil(25 / 10) = 3
    assert decide(DEFAULT, parts(5, 20, 0)) == ScaleDecision(25, 25, True, 3)


def test_no_lag_scales_to_zero_or_to_min() -> None:
    assert decide(DEFAULT, parts(0, 0, 0)) == ScaleDecision(0, 0, False, 0)
    assert decide(DEFAULT, parts(0, 0, 0), lo=2).replicas == 2


def test_invalid_offset_latest_counts_one_per_partition() -> None:
    # no commit under `latest`: lag 1 each -> 6; ceil(6 / 10) = 1
    assert decide(DEFAULT, no_commit(6)) == ScaleDecision(6, 6, True, 1)


def test_invalid_offset_latest_scale_to_zero() -> None:
    s = ScalerSettings(scale_to_zero_on_invalid_offset=True)
    assert decide(s, no_commit(6)) == ScaleDecision(0, 0, False, 0)


def test_invalid_offset_earliest_counts_the_whole_log() -> None:
    # no commit under `earliest`: lag = latest = 100 each -> 600; capped at 6 x 10 = 60 -> 6
    s = ScalerSettings(offset_reset_policy="earliest")
    assert decide(s, no_commit(6)) == ScaleDecision(600, 60, True, 6)
    # Kafka reports "no commit" as -1: same thing
    minus_one = [PartitionOffsets(T, i, 100, -1) for i in range(6)]
    assert decide(s, minus_one) == ScaleDecision(600, 60, True, 6)


def test_invalid_offset_earliest_scale_to_zero() -> None:
    s = ScalerSettings(offset_reset_policy="earliest", scale_to_zero_on_invalid_offset=True)
    assert decide(s, no_commit(6)) == ScaleDecision(0, 0, False, 0)


def test_cap_at_partitions_times_threshold() -> None:
    # 4 partitions, 250 each = 1000; 1000 // 10 = 100 > 4 -> capped at 40 -> 4 replicas
    assert decide(DEFAULT, parts(250, 250, 250, 250)) == ScaleDecision(1000, 40, True, 4)


def test_cap_keeps_kedas_integer_division() -> None:
    # 6 partitions, lag 65: 65 // 10 = 6 is not > 6, so no cap: ceil(6.5) = 7 replicas, one
    # more than there are partitions -- unless maxReplicaCount <= partitions (what render enforces)
    d = decide(DEFAULT, parts(65, 0, 0, 0, 0, 0), hi=10)
    assert d == ScaleDecision(65, 65, True, 7)
    assert decide(DEFAULT, parts(65, 0, 0, 0, 0, 0), hi=6).replicas == 6
    # 70 // 10 = 7 > 6: capped to 60 -> 6
    assert decide(DEFAULT, parts(70, 0, 0, 0, 0, 0), hi=10) == ScaleDecision(70, 60, True, 6)


def test_allow_idle_consumers_lifts_the_cap() -> None:
    s = ScalerSettings(allow_idle_consumers=True)
    # 1000 / 10 = 100 wanted, clamped by maxReplicaCount 20
    assert decide(s, parts(250, 250, 250, 250), hi=20) == ScaleDecision(1000, 1000, True, 20)


def test_max_replicas_above_partitions_is_clamped_by_the_cap() -> None:
    # maxReplicaCount 10 but 6 partitions: the cap (6 x 10) keeps it at 6
    assert decide(DEFAULT, parts(*[500] * 6), hi=10) == ScaleDecision(3000, 60, True, 6)


def test_limit_to_partitions_with_lag() -> None:
    # 2 of 6 partitions lag: cap 2 x 10 = 20 -> 2 replicas
    s = ScalerSettings(limit_to_partitions_with_lag=True)
    assert decide(s, parts(500, 500, 0, 0, 0, 0)) == ScaleDecision(1000, 20, True, 2)


def test_persistent_lag_is_excluded_from_scaling_not_from_activation() -> None:
    # A retry tier: every committed offset sits where it was at the last poll (the head
    # record is not due yet). Lag 40 x 3 = 120 keeps the pool active but scales nothing.
    s = ScalerSettings(exclude_persistent_lag=True)
    ps = parts(40, 40, 40)
    prev = committed_offsets(ps)
    assert decide(s, ps, prev) == ScaleDecision(120, 0, True, 1)
    # without the setting the same offsets ask for ceil(120 / 10) = 12, capped at 3 x 10 -> 3
    assert decide(DEFAULT, ps, prev) == ScaleDecision(120, 30, True, 3)


def test_persistent_lag_first_poll_and_moving_partitions_count() -> None:
    s = ScalerSettings(exclude_persistent_lag=True)
    ps = parts(5, 5, 5)  # committed 995 each
    # first poll: nothing to compare with -> everything counts (KEDA records and counts)
    assert decide(s, ps, None) == ScaleDecision(15, 15, True, 2)
    # partition 0 moved from 990 to 995: it counts; 1 and 2 did not move
    prev = {(T, 0): 990, (T, 1): 995, (T, 2): 995}
    assert decide(s, ps, prev) == ScaleDecision(15, 5, True, 1)


def test_activation_threshold() -> None:
    s = ScalerSettings(activation_lag_threshold=50)
    ten = parts(*[5] * 10)  # lag 50: not > 50
    assert decide(s, ten) == ScaleDecision(50, 50, False, 0)
    assert decide(s, ten, lo=1).replicas == 5  # min 1: KEDA leaves it to the HPA
    more = parts(6, *[5] * 9)  # lag 51 > 50: active, ceil(5.1) = 6
    assert decide(s, more) == ScaleDecision(51, 51, True, 6)


def test_activation_counts_persistent_lag() -> None:
    s = ScalerSettings(exclude_persistent_lag=True, activation_lag_threshold=20)
    ps = parts(10, 10, 10)
    prev = committed_offsets(ps)
    assert decide(s, ps, prev, current=0) == ScaleDecision(30, 0, True, 1)
    quiet = ScalerSettings(exclude_persistent_lag=True, activation_lag_threshold=40)
    assert decide(quiet, ps, prev, current=1) == ScaleDecision(30, 0, False, 0)


def test_ensure_even_distribution() -> None:
    # 6 partitions, lag 45: plain HPA wants 5 (6 partitions over 5 pods: uneven); the next
    # divisor of 6 covering 45 is 6 -> 60 -> 6 replicas. Lag 25 -> divisor 3 -> 3 replicas.
    s = ScalerSettings(ensure_even_distribution_of_partitions=True)
    assert decide(s, parts(45, 0, 0, 0, 0, 0)).replicas == 6
    assert decide(DEFAULT, parts(45, 0, 0, 0, 0, 0)).replicas == 5
    assert decide(s, parts(25, 0, 0, 0, 0, 0)).replicas == 3


def test_hpa_tolerance_holds_the_current_size() -> None:
    s = ScalerSettings(allow_idle_consumers=True)
    ps = parts(105, *[0] * 11)
    assert decide(s, ps, current=10).replicas == 11  # ceil(10.5)
    assert decide(s, ps, current=10, tolerance=0.1).replicas == 10  # 1.05 is within 10%
    assert decide(s, ps, current=8, tolerance=0.1).replicas == 11  # 1.31 is not


def test_committed_offsets_skip_partitions_without_commit() -> None:
    ps = [PartitionOffsets(T, 0, 10, 4), PartitionOffsets(T, 1, 10, None),
          PartitionOffsets(T, 2, 10, -1)]
    assert committed_offsets(ps) == {(T, 0): 4}


@pytest.mark.parametrize("kw", [{"lag_threshold": 0}, {"lag_threshold": -5},
                                {"activation_lag_threshold": -1},
                                {"offset_reset_policy": "smallest"}])
def test_bad_settings(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        ScalerSettings(**kw)  # type: ignore[arg-type]


def test_bad_bounds() -> None:
    with pytest.raises(ConfigError):
        decide(DEFAULT, parts(1), lo=3, hi=2)
    with pytest.raises(ConfigError):
        decide(DEFAULT, parts(1), current=-1)


def test_trigger_metadata_is_kedas_spelling_and_strings() -> None:
    meta = ScalerSettings(lag_threshold=50, exclude_persistent_lag=True).trigger_metadata()
    assert meta == {
        "lagThreshold": "50", "activationLagThreshold": "0", "offsetResetPolicy": "latest",
        "allowIdleConsumers": "false", "scaleToZeroOnInvalidOffset": "false",
        "excludePersistentLag": "true", "limitToPartitionsWithLag": "false",
    }


@given(lags=st.lists(st.integers(0, 10_000), min_size=1, max_size=32),
       threshold=st.integers(1, 100), hi=st.integers(1, 64), lo=st.integers(0, 64))
def test_replicas_stay_within_bounds_and_partitions(lags: list[int], threshold: int, hi: int,
                                                    lo: int) -> None:
    lo = min(lo, hi)
    hi = min(hi, len(lags))  # what render enforces
    lo = min(lo, hi)
    d = decide(ScalerSettings(lag_threshold=threshold), parts(*lags, latest=20_000), lo=lo, hi=hi)
    assert lo <= d.replicas <= hi
    assert d.scaling_lag <= d.lag
    assert d.active == (sum(lags) > 0)


@pytest.mark.parametrize("kw", [
    {"allow_idle_consumers": True, "limit_to_partitions_with_lag": True},
    {"limit_to_partitions_with_lag": True, "ensure_even_distribution_of_partitions": True},
])
def test_combinations_keda_refuses(kw: dict[str, bool]) -> None:
    with pytest.raises(ConfigError):
        ScalerSettings(**kw)  # type: ignore[arg-type]


def test_the_console_and_the_rendered_scaledobject_share_one_lag_threshold() -> None:
    """Issue #46: the console's "KEDA would scale to" used lagThreshold 10 (KEDA's default)
    while the rendered ScaledObject said 100. Read from what each produces."""
    import yaml
    from click.testing import CliRunner

    from kworkers.cli.console import console_command as console_cmd
    from kworkers.config import WorkerConfig
    from kworkers.console.settings import ConsoleSettings
    from kworkers.deploy import render
    from kworkers.kafka.settings import ClientSettings

    files = render(WorkerConfig(topics=("orders",), group_id="g",
                                bootstrap_servers="kafka:9092"),
                   image="i:1", app="orders", module="m:w", partitions=6)
    scaled = yaml.safe_load(files["keda/scaledobject.yaml"])
    rendered = {int(t["metadata"]["lagThreshold"]) for t in scaled["spec"]["triggers"]
                if t["name"].startswith("main-")}
    assert rendered == {ConsoleSettings(ClientSettings()).lag_threshold}
    help_text = CliRunner().invoke(console_cmd, ["--help"]).output
    assert f"[default: {rendered.pop()};" in " ".join(help_text.split())

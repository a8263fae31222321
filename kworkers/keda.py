"""What KEDA would do with a worker pool: a pure replica calculator (the Kafka scaler on a
consumer group; a Prometheus trigger on the backlog of a share group, at the end).

Why mirror it here: the pool is sized by KEDA, not by kworkers, so the only way to reason about
a deployment (what does one slow partition do? do waiting retries scale the pool? when does it
go to zero?) is to compute what KEDA computes, from offsets a test can write down. Nothing here
talks to a broker; ``PartitionOffsets`` values come from whoever read the offsets.

Checked against KEDA's own code: tests/integration/test_keda_scaler_judge.py polls KEDA
v2.18.0's Kafka scaler (``scalers.NewKafkaScaler``, deploy/keda/scaler-probe) and this model
on the same group states, for every metadata key that changes the figure, and they must agree.

The rules, as KEDA 2.x applies them per poll:

1. Lag per partition is ``latest - committed``. A partition with no committed offset has
   lag 1 under ``offsetResetPolicy: latest`` (0 with ``scaleToZeroOnInvalidOffset``), and the
   whole log (``latest``) under ``earliest`` (0 with ``scaleToZeroOnInvalidOffset``).
2. ``excludePersistentLag``: a partition whose committed offset is the same as at the previous
   poll counts 0 towards scaling (a stuck or waiting consumer gains nothing from more pods),
   but its full lag still counts towards activation.
3. Unless ``allowIdleConsumers``, the scaling lag is capped at ``partitions x lagThreshold``
   (``limitToPartitionsWithLag`` caps at the partitions whose scaling lag is > 0 instead).
   KEDA tests the cap with integer division, ``lag // threshold > partitions``, so a lag just
   under ``(partitions + 1) x threshold`` slips through and asks for one replica more than
   there are partitions; ``maxReplicaCount <= partitions`` is what really holds the line,
   which is why ``kworkers.deploy`` refuses a larger maximum.
4. The HPA then wants ``ceil(scaling_lag / lagThreshold)`` replicas, clamped to
   ``[max(minReplicaCount, 1), maxReplicaCount]``.
5. Activation (the 0 <-> 1 step, which KEDA does itself, not the HPA) uses the lag *including*
   persistent lag: active when it is > ``activationLagThreshold``. Inactive with
   ``minReplicaCount == 0`` means zero replicas.

The HPA's tolerance (``--horizontal-pod-autoscaler-tolerance``, 0.1 in a default cluster: no
change while the ratio to the current size is within 10%) is off unless ``tolerance`` is given,
so the hand-worked examples in the tests read as the formula above.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from kworkers.errors import ConfigError
from kworkers.lag import partition_lag as lag_of
from kworkers.promql import quoted

OffsetResetPolicy = Literal["latest", "earliest"]
TP = tuple[str, int]


#: The lagThreshold kworkers renders (``kworkers deploy render``) and every "what KEDA would do"
#: assumes unless told otherwise (the console): KEDA's own default (10) asks for a pod per ten
#: records behind, but a worker runs ``concurrency`` handlers at once and fetches in batches
#: of hundreds, so 100 (only the per-pod target: the pod count stays capped at the partitions)
RENDERED_LAG_THRESHOLD = 100

@dataclass(frozen=True)
class ScalerSettings:
    """The Kafka trigger's metadata that affects the replica count, with KEDA's defaults."""

    lag_threshold: int = 10
    activation_lag_threshold: int = 0
    offset_reset_policy: OffsetResetPolicy = "latest"
    allow_idle_consumers: bool = False
    scale_to_zero_on_invalid_offset: bool = False
    exclude_persistent_lag: bool = False
    limit_to_partitions_with_lag: bool = False
    ensure_even_distribution_of_partitions: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.lag_threshold, int) or self.lag_threshold <= 0:
            # KEDA refuses 0 too: it is the divisor of every decision.
            raise ConfigError(f"lagThreshold: must be a whole number > 0, got "
                              f"{self.lag_threshold!r}")
        if not isinstance(self.activation_lag_threshold, int) or self.activation_lag_threshold < 0:
            raise ConfigError(f"activationLagThreshold: must be a whole number >= 0, got "
                              f"{self.activation_lag_threshold!r}")
        if self.offset_reset_policy not in ("latest", "earliest"):
            raise ConfigError(f"offsetResetPolicy: 'latest' or 'earliest', got "
                              f"{self.offset_reset_policy!r}")
        # the combinations KEDA itself refuses
        if self.allow_idle_consumers and self.limit_to_partitions_with_lag:
            raise ConfigError("allowIdleConsumers and limitToPartitionsWithLag cannot both be set")
        if self.limit_to_partitions_with_lag and self.ensure_even_distribution_of_partitions:
            raise ConfigError("limitToPartitionsWithLag and ensureEvenDistributionOfPartitions "
                              "cannot both be set")

    def trigger_metadata(self) -> dict[str, str]:
        """These settings as KEDA trigger metadata: its key names, every value a string."""
        def b(x: bool) -> str:
            return "true" if x else "false"

        meta = {
            "lagThreshold": str(self.lag_threshold),
            "activationLagThreshold": str(self.activation_lag_threshold),
            "offsetResetPolicy": self.offset_reset_policy,
            "allowIdleConsumers": b(self.allow_idle_consumers),
            "scaleToZeroOnInvalidOffset": b(self.scale_to_zero_on_invalid_offset),
            "excludePersistentLag": b(self.exclude_persistent_lag),
            "limitToPartitionsWithLag": b(self.limit_to_partitions_with_lag),
        }
        if self.ensure_even_distribution_of_partitions:
            meta["ensureEvenDistributionOfPartitions"] = "true"
        return meta


@dataclass(frozen=True)
class PartitionOffsets:
    """One partition as the scaler sees it: the log end and the group's committed offset.

    ``committed`` is None (or negative: Kafka reports -1) when the group never committed on it.
    """

    topic: str
    partition: int
    latest: int
    committed: int | None = None

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    @property
    def has_commit(self) -> bool:
        return self.committed is not None and self.committed >= 0


@dataclass(frozen=True)
class ScaleDecision:
    """``lag``: total lag including persistent lag (what activation looks at);
    ``scaling_lag``: the metric the HPA gets (persistent lag removed, capped);
    ``active``: KEDA's activation verdict; ``replicas``: what the deployment settles at."""

    lag: int
    scaling_lag: int
    active: bool
    replicas: int


def partition_lag(settings: ScalerSettings, p: PartitionOffsets,
                  previous_committed: Mapping[TP, int] | None) -> tuple[int, int]:
    """(lag counted for scaling, lag counted for activation) of one partition."""
    full = lag_of(p.latest, p.committed if p.has_commit else None,
                  settings.offset_reset_policy, settings.scale_to_zero_on_invalid_offset)
    if not p.has_commit:
        return full, full
    if settings.exclude_persistent_lag and previous_committed is not None:
        before = previous_committed.get(p.tp)
        if before is not None and before == p.committed:
            return 0, full
    return full, full


def _factors(n: int) -> list[int]:
    return [f for f in range(1, n + 1) if n % f == 0]


def desired_replicas(
    settings: ScalerSettings,
    partitions: Sequence[PartitionOffsets],
    previous_committed: Mapping[TP, int] | None,
    current_replicas: int,
    min_replicas: int,
    max_replicas: int,
    *,
    tolerance: float = 0.0,
) -> ScaleDecision:
    """KEDA's decision for one poll of the group.

    ``previous_committed`` is the committed offsets seen at the previous poll
    (``committed_offsets`` of that poll's partitions), or None on the first poll: only
    ``excludePersistentLag`` reads it, and on a first poll nothing counts as persistent.
    """
    _check_bounds(current_replicas, min_replicas, max_replicas)
    threshold = settings.lag_threshold
    scaling = full = with_lag = 0
    for p in partitions:
        lag, lag_all = partition_lag(settings, p, previous_committed)
        scaling += lag
        full += lag_all
        if lag > 0:
            with_lag += 1
    n = len(partitions)
    if (not settings.allow_idle_consumers or settings.limit_to_partitions_with_lag
            or settings.ensure_even_distribution_of_partitions):
        upper = n
        if settings.ensure_even_distribution_of_partitions:
            # the smallest divisor of the partition count that covers the lag, so every
            # consumer gets the same number of partitions
            factor = next((f for f in _factors(n) if f * threshold >= scaling), n)
            scaling = factor * threshold
        if settings.limit_to_partitions_with_lag:
            upper = with_lag
        if _go_div(scaling, threshold) > upper:  # KEDA's integer-division test, kept as is
            scaling = upper * threshold

    active = full > settings.activation_lag_threshold
    if not active and min_replicas == 0:
        return ScaleDecision(full, scaling, False, 0)
    return ScaleDecision(full, scaling, active, _hpa(scaling, threshold, current_replicas,
                                                     min_replicas, max_replicas, tolerance))


def _check_bounds(current: int, min_replicas: int, max_replicas: int) -> None:
    if min_replicas < 0 or max_replicas < 1 or min_replicas > max_replicas:
        raise ConfigError(f"replica bounds: need 0 <= min <= max and max >= 1, got "
                          f"min={min_replicas}, max={max_replicas}")
    if current < 0:
        raise ConfigError(f"current_replicas: must be >= 0, got {current}")


def _hpa(metric: int, threshold: int, current: int, min_replicas: int, max_replicas: int,
         tolerance: float) -> int:
    """The HPA on an AverageValue metric: ``ceil(metric / threshold)`` (held at the current
    size within ``tolerance``), clamped to ``[max(min, 1), max]``."""
    want = math.ceil(metric / threshold) if metric > 0 else 0
    if tolerance > 0 and current > 0 and abs(metric / (threshold * current) - 1.0) <= tolerance:
        want = current
    return min(max(want, min_replicas, 1), max_replicas)


def _go_div(a: int, b: int) -> int:
    """Integer division truncating towards zero, as Go's ``/`` on int64 does."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def committed_offsets(partitions: Iterable[PartitionOffsets]) -> dict[TP, int]:
    """The ``previous_committed`` to pass at the next poll.

    KEDA remembers a partition's committed offset only once it has one; a partition with no
    commit is never persistent.
    """
    return {p.tp: p.committed for p in partitions if p.committed is not None and p.has_commit}


# --- share groups ------------------------------------------------------------------------------
#
# KEDA's Kafka scaler reads consumer-group offsets, which a share group does not have (KEDA
# issue 7920), so a share-mode pool scales on a Prometheus trigger fed by the workers' own
# ``kworkers_share_backlog`` gauge (``kworkers.share.backlog``: per partition, the log end minus
# one past the highest offset that worker acquired). Each replica sees the partitions it
# fetched from, and the one that fetched last is closest, so the query takes the minimum per
# partition over replicas and sums the partitions: summing over replicas would count one backlog
# once per replica and grow the pool on its own output. The Prometheus scaler's default
# ``metricType`` is ``AverageValue``: the HPA wants ``ceil(backlog / threshold)`` replicas, and
# nothing caps that at the partition count; ``maxReplicaCount`` does, and the broker's
# ``group.share.max.size`` (200 by default) bounds the members of one share group.
#
# Scale to zero does not work on this metric: with no replica running nobody exports it, KEDA
# reads no backlog and never activates. Share-mode pools keep ``minReplicaCount >= 1``.

#: members a share group takes by default (the broker's ``group.share.max.size``)
SHARE_GROUP_MAX_SIZE = 200


def share_backlog_query(group: str) -> str:
    """The PromQL of the share trigger: min per partition over replicas, summed."""
    return f"sum(min by (topic, partition) (kworkers_share_backlog{{group={quoted(group)}}}))"


@dataclass(frozen=True)
class BacklogSample:
    """One replica's ``kworkers_share_backlog`` for one partition, as Prometheus has it."""

    replica: str
    topic: str
    partition: int
    backlog: int


def share_backlog(samples: Iterable[BacklogSample]) -> int:
    """What ``share_backlog_query`` evaluates to over these samples."""
    best: dict[TP, int] = {}
    for s in samples:
        tp, n = (s.topic, s.partition), max(0, s.backlog)
        best[tp] = min(best.get(tp, n), n)
    return sum(best.values())


def desired_share_replicas(
    settings: ScalerSettings,
    samples: Iterable[BacklogSample],
    current_replicas: int,
    min_replicas: int,
    max_replicas: int,
    *,
    tolerance: float = 0.0,
) -> ScaleDecision:
    """KEDA's decision for a share-mode pool on the Prometheus trigger: ``lag_threshold`` is
    the trigger's ``threshold`` (backlog per replica), ``activation_lag_threshold`` its
    ``activationThreshold``; the other Kafka-scaler settings do not apply. No partition cap."""
    _check_bounds(current_replicas, min_replicas, max_replicas)
    backlog = share_backlog(samples)
    active = backlog > settings.activation_lag_threshold
    if not active and min_replicas == 0:
        return ScaleDecision(backlog, backlog, False, 0)
    return ScaleDecision(backlog, backlog, active, _hpa(
        backlog, settings.lag_threshold, current_replicas, min_replicas, max_replicas,
        tolerance))

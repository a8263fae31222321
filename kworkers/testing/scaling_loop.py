"""KEDA's and the HPA's scaling algorithm as a pure loop, for tests that scale real workers.

Nothing here does I/O: the loop is handed the time (an injected clock) and each trigger's
figures (read by the caller: Kafka triggers from KEDA's own scaler, ``kworkers.testing.
keda_probe``; Prometheus triggers from a real Prometheus evaluating the rendered query), and
answers how many replicas the Deployment should have. ``tests/unit/test_scaling_loop.py``
works its rules by hand.

What it implements, as documented by KEDA (keda.sh/docs, "Scaling Deployments": pollingInterval,
cooldownPeriod, activation) and Kubernetes (the HorizontalPodAutoscaler's algorithm and
``behavior``):

* **KEDA, every ``pollingInterval``**: each trigger is asked whether it is active (KEDA's Kafka
  scaler: lag including persistent lag > ``activationLagThreshold``; Prometheus: value >
  ``activationThreshold``). Any active trigger with 0 replicas: scale to ``max(minReplicaCount,
  1)`` (KEDA does 0 -> 1 itself, the HPA never leaves 0). None active for ``cooldownPeriod``
  since the last active poll, with ``minReplicaCount`` 0: scale to 0.
* **The HPA, every sync period (15 s)**, only while replicas > 0: per metric (every trigger is
  an External metric with an ``AverageValue`` target), ``ceil(value / target)``, unless
  ``value / (target x current)`` is within the tolerance (0.1) of 1 (then ``current``); the
  largest over metrics; stabilized (scale up: the smallest recommendation of the up window;
  scale down: the largest of the down window, default 300 s); limited by the ``behavior``
  policies (per period, from the replicas at the period's start; ``selectPolicy: Max`` takes
  the policy allowing the largest change); clamped to ``[max(minReplicaCount, 1),
  maxReplicaCount]``.
* **A trigger that fails to read** (KEDA's scaler returns an error: a broker restarting, a
  metadata refresh after a stall, a topic not created yet): KEDA counts it inactive, and with
  no other trigger active it holds the replicas where they are (no scale to zero while any
  trigger errs; the rendered ScaledObject sets no ``fallback``). The HPA, given metrics it
  cannot read, still scales up on those it can, but skips a sync whose readable metrics would
  scale down, or when none is readable (Kubernetes' documented rule; its
  ``computeReplicasForMetrics``), recording no recommendation for it.

``LoopSpec.from_scaledobject`` reads every figure from a rendered ScaledObject; ``speedup``
divides every interval (polling, sync period, cooldown, windows, policy periods) so a test
can run KEDA's minutes in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: the HPA controller's defaults (kube-controller-manager flags)
HPA_SYNC_PERIOD_S = 15.0
HPA_TOLERANCE = 0.1
#: KEDA's ScaledObject defaults
KEDA_POLLING_INTERVAL_S = 30.0
KEDA_COOLDOWN_S = 300.0
#: the HPA's default behaviour when none is given
DEFAULT_SCALE_DOWN_WINDOW_S = 300.0


@dataclass(frozen=True)
class Policy:
    """One HPA scaling policy: ``type`` Pods or Percent, ``value`` per ``period`` seconds."""

    type: str
    value: int
    period: float


@dataclass(frozen=True)
class Direction:
    """One direction of the HPA's ``behavior``."""

    window: float
    policies: tuple[Policy, ...]
    select: str = "Max"


DEFAULT_UP = Direction(0.0, (Policy("Percent", 100, 15.0), Policy("Pods", 4, 15.0)))
DEFAULT_DOWN = Direction(DEFAULT_SCALE_DOWN_WINDOW_S, (Policy("Percent", 100, 15.0),))


@dataclass(frozen=True)
class Figure:
    """One trigger's reading: the metric KEDA hands the HPA, its ``AverageValue`` target, and
    whether KEDA judges the trigger active; or ``error``, the scaler's failure to read it
    (then ``value`` and ``active`` mean nothing: see ``ScalingLoop`` for what KEDA and the
    HPA do with it)."""

    name: str
    value: float
    target: float
    active: bool
    error: str | None = None


@dataclass(frozen=True)
class LoopSpec:
    polling_interval: float = KEDA_POLLING_INTERVAL_S
    cooldown: float = KEDA_COOLDOWN_S
    min_replicas: int = 0
    max_replicas: int = 100
    sync_period: float = HPA_SYNC_PERIOD_S
    tolerance: float = HPA_TOLERANCE
    up: Direction = DEFAULT_UP
    down: Direction = DEFAULT_DOWN

    @classmethod
    def from_scaledobject(cls, so: Mapping[str, Any], speedup: float = 1.0) -> LoopSpec:
        """The loop a rendered ScaledObject asks for, every interval divided by ``speedup``."""
        spec = so["spec"]
        behavior = (spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {})
                    .get("behavior", {}))

        def direction(raw: Mapping[str, Any] | None, default: Direction) -> Direction:
            if not raw:
                return Direction(default.window / speedup, tuple(
                    Policy(p.type, p.value, p.period / speedup) for p in default.policies),
                    default.select)
            window = float(raw.get("stabilizationWindowSeconds", default.window))
            policies = tuple(Policy(p["type"], int(p["value"]), float(p["periodSeconds"]) / speedup)
                             for p in raw.get("policies", ())) or tuple(
                Policy(p.type, p.value, p.period / speedup) for p in default.policies)
            return Direction(window / speedup, policies, str(raw.get("selectPolicy", "Max")))

        return cls(
            polling_interval=float(spec.get("pollingInterval", KEDA_POLLING_INTERVAL_S)) / speedup,
            cooldown=float(spec.get("cooldownPeriod", KEDA_COOLDOWN_S)) / speedup,
            min_replicas=int(spec.get("minReplicaCount", 0)),
            max_replicas=int(spec.get("maxReplicaCount", 100)),
            sync_period=HPA_SYNC_PERIOD_S / speedup,
            up=direction(behavior.get("scaleUp"), DEFAULT_UP),
            down=direction(behavior.get("scaleDown"), DEFAULT_DOWN),
        )


def metric_replicas(f: Figure, current: int, tolerance: float) -> int:
    """The HPA's replica count for one External metric with an AverageValue target."""
    if current > 0 and f.target > 0:
        ratio = f.value / (f.target * current)
        if abs(1.0 - ratio) <= tolerance:
            return current
    return math.ceil(f.value / f.target) if f.target > 0 else current


@dataclass
class Event:
    """A replica change the loop made: when, from, to, and who (``keda`` or ``hpa``)."""

    at: float
    before: int
    after: int
    by: str
    figures: tuple[Figure, ...] = ()


@dataclass
class ScalingLoop:
    """The loop's state: call ``advance(now, read)`` as often as you like; it runs KEDA's poll
    and the HPA's sync when each is due (``read()`` gives every trigger's figure at that
    moment) and returns the replica count the Deployment should have."""

    spec: LoopSpec
    replicas: int = 0
    events: list[Event] = field(default_factory=list)
    last_active: float | None = None
    next_poll: float | None = None
    next_sync: float | None = None
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    #: every figure read, with the time: (time, figures)
    readings: list[tuple[float, tuple[Figure, ...]]] = field(default_factory=list)

    def _set(self, now: float, after: int, by: str, figures: Sequence[Figure]) -> None:
        if after != self.replicas:
            self.events.append(Event(now, self.replicas, after, by, tuple(figures)))
            self.replicas = after

    def keda_poll(self, now: float, figures: Sequence[Figure]) -> int:
        """KEDA's activation step (0 <-> 1, and the floor ``minReplicaCount``)."""
        s = self.spec
        if any(f.active and f.error is None for f in figures):
            self.last_active = now
            if self.replicas == 0:
                self._set(now, max(s.min_replicas, 1), "keda", figures)
        elif any(f.error is not None for f in figures):
            pass  # none active, one unread: KEDA holds (no fallback rendered)
        elif self.replicas > 0 and s.min_replicas == 0:
            since = self.last_active if self.last_active is not None else -math.inf
            if now - since >= s.cooldown:
                self._set(now, 0, "keda", figures)
                self.recommendations.clear()
        if self.replicas < s.min_replicas:  # KEDA keeps the floor, from zero too
            self._set(now, s.min_replicas, "keda", figures)
        return self.replicas

    def _limit(self, now: float, current: int, desired: int) -> int:
        s = self.spec

        def changed(period: float, up: bool) -> int:
            return sum((e.after - e.before) for e in self.events
                       if e.by == "hpa" and e.at > now - period
                       and (e.after > e.before) == up)

        if desired > current:
            limits = []
            for p in s.up.policies:
                start = current - changed(p.period, True) - changed(p.period, False)
                limits.append(start + p.value if p.type == "Pods"
                              else math.ceil(start * (1 + p.value / 100)))
            limit = max(limits) if s.up.select != "Min" else min(limits)
            return min(desired, limit) if s.up.select != "Disabled" else current
        if desired < current:
            limits = []
            for p in s.down.policies:
                start = current - changed(p.period, False) - changed(p.period, True)
                limits.append(start - p.value if p.type == "Pods"
                              else math.floor(start * (1 - p.value / 100)))
            limit = min(limits) if s.down.select != "Min" else max(limits)
            return max(desired, limit) if s.down.select != "Disabled" else current
        return desired

    def hpa_sync(self, now: float, figures: Sequence[Figure]) -> int:
        """The HPA's step; nothing while the Deployment is at 0 (KEDA owns 0 <-> 1)."""
        s = self.spec
        current = self.replicas
        if current == 0:
            return 0
        lo, hi = max(s.min_replicas, 1), s.max_replicas
        readable = [f for f in figures if f.error is None]
        desired = max((metric_replicas(f, current, s.tolerance) for f in readable),
                      default=current)
        if len(readable) < len(figures) and (not readable or desired < current):
            return current  # a metric unread: no scale-down, no recommendation
        desired = min(max(desired, lo), hi)
        # stabilization: the windows' recommendations (the desired ones, unstabilized)
        self.recommendations.append((now, desired))
        keep = max(s.up.window, s.down.window)
        self.recommendations = [(t, r) for t, r in self.recommendations if t >= now - keep]
        up = min([r for t, r in self.recommendations if t >= now - s.up.window] + [desired])
        down = max([r for t, r in self.recommendations if t >= now - s.down.window] + [desired])
        stabilized = min(max(current, up), down)
        after = min(max(self._limit(now, current, stabilized), lo), hi)
        self._set(now, after, "hpa", figures)
        return self.replicas

    def advance(self, now: float, read: Callable[[], Sequence[Figure]]) -> int:
        """Runs whatever is due at ``now``: KEDA's poll first, then the HPA's sync."""
        if self.next_poll is None or now >= self.next_poll:
            figures = tuple(read())
            self.readings.append((now, figures))
            self.keda_poll(now, figures)
            self.next_poll = now + self.spec.polling_interval
        if self.next_sync is None or now >= self.next_sync:
            if self.replicas > 0:
                figures = tuple(read())
                self.readings.append((now, figures))
                self.hpa_sync(now, figures)
            self.next_sync = now + self.spec.sync_period
        return self.replicas

    def changes_within(self, start: float, end: float) -> int:
        """Replica changes in ``[start, end]`` (a flap count over a window)."""
        return sum(1 for e in self.events if start <= e.at <= end)

    @property
    def peak(self) -> int:
        return max([e.after for e in self.events] + [self.replicas])


#: a run may meet a scaler error now and then (a broker busy or restarting); more than this
#: share of its readings with one, and its verdicts rest on holds, not on the triggers
UNREAD_SHARE = 0.1


def unread_problems(readings: Sequence[tuple[float, Sequence[Figure]]]) -> list[str]:
    """What makes a run's readings too few to judge it by: none at all, or more than
    ``UNREAD_SHARE`` of them with a trigger the scaler failed to read (while any trigger errs
    the loop holds, so a "never zero" or "never more" verdict could pass on errors alone)."""
    if not readings:
        return ["no reading at all"]
    errs = [(t, f.name, f.error) for t, figs in readings for f in figs if f.error is not None]
    unread = sum(1 for _t, figs in readings if any(f.error is not None for f in figs))
    if unread > UNREAD_SHARE * len(readings):
        return [f"{unread} of {len(readings)} readings with a trigger unread, first: "
                f"{errs[:3]}"]
    return []


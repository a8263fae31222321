"""How a rendered pool scales: on drainable lag, woken from zero by any lag.

Why two kinds of trigger (docs/AUTOSCALING.md has the whole argument):

* **Growing the pool (1 -> N)** is a Prometheus trigger over the workers' own
  ``kworkers_drainable_lag`` (records) or ``kworkers_drainable_time_lag_seconds`` (seconds):
  lag that more replicas could drain (``kworkers.consumer.drainable``). Lag held on purpose (a
  breaker open, a pool-wide rate limit at its bound, a registry outage, a fenced member,
  retries and scheduled records not yet due) never grows the pool.
* **Waking it (0 -> 1)**: with no worker running nobody exports a metric (KEDA's Prometheus
  scaler then reads 0: ``ignoreNullValues`` is true by default), so one Kafka trigger per
  source topic (main group) and per tier topic (retry group) judges activation on the raw lag
  (KEDA: active when the lag, persistent lag included, exceeds ``activationLagThreshold`` 0).
  Its ``lagThreshold`` is ``ACTIVATION_ONLY_LAG_THRESHOLD``, above any lag a pool can have,
  so its metric asks the HPA for ``ceil(lag / threshold)`` = 1 replica at most: the HPA takes
  the largest of its metrics, so these triggers never grow the pool, and while any of them has
  lag (a retry waiting for its due time, a scheduled record) the pool keeps one replica, never
  zero. KEDA scales to zero ``cooldownPeriod`` after the last trigger went inactive.

  ``advanced.scalingModifiers`` could say the same in one formula, but KEDA then judges
  activation on the composite metric, every trigger must be named in it, and the formula
  (with its own ``activationTarget``) replaces each trigger's own semantics; the HPA's "largest
  metric wins" is the documented rule both KEDA and Kubernetes keep, and every trigger's
  figure stays visible in ``kubectl get hpa``.

Records or seconds: ``records`` wants ``ceil(drainable / lag_threshold)`` replicas (the sum over
partitions, each counted once: ``max by (topic, partition)``, so a partition shown by two
replicas for a scrape during a rebalance is not counted twice). ``seconds`` wants one replica
per partition whose drainable time lag exceeds ``time_lag_target``: more replicas than
partitions behind would own nothing behind. Both are capped by ``maxReplicaCount`` (at most
the partition count).

HPA behaviour (``advanced.horizontalPodAutoscalerConfig.behavior``), rendered with its
reasons: scale up at once (window 0; at most double, or +4 pods, per 15 s: the Kubernetes
defaults, written down) since the metric already leaves held lag out; scale down only after
``SCALE_DOWN_WINDOW_S`` of lower figures and by at most half the pods a minute, so steady load
that wobbles around a threshold does not flap and each removal's rebalance settles first.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from kworkers.errors import ConfigError
from kworkers.promql import quoted

ScaleOn = Literal["records", "seconds"]

#: the Kafka triggers' lagThreshold when they only wake the pool: a quadrillion records (31
#: years of backlog at a million records a second). Not int64's maximum: the HPA compares
#: milli-values (x 1000), and 10**15 x 1000 still fits in an int64
ACTIVATION_ONLY_LAG_THRESHOLD = 10**15
#: seconds of lower figures before the HPA removes replicas (the Kubernetes default)
SCALE_DOWN_WINDOW_S = 300
#: the time-lag target rendered unless told otherwise
DEFAULT_TIME_LAG_TARGET_S = 30.0

_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)?\s*")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``30``, ``30s``, ``2m``, ``1.5h``, ``500ms`` -> seconds; ``ConfigError`` unless a
    positive duration."""
    m = _DURATION.fullmatch(text)
    if m is None:
        raise ConfigError(f"time-lag target: a positive duration such as 30s or 2m, got "
                          f"{text!r}")
    seconds = float(m.group(1)) * _UNIT[m.group(2)]
    if not seconds > 0 or not math.isfinite(seconds):
        raise ConfigError(f"time-lag target: must be a positive duration, got {text!r}")
    return seconds


def check_server(url: str | None) -> str:
    """A Prometheus server address KEDA can query: ``http(s)://host[:port][/path]``."""
    if url is None or not url.strip():
        raise ConfigError("prometheus: pass the Prometheus server KEDA queries "
                          "(http://HOST:PORT), got none")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(
            c.isspace() for c in url):
        raise ConfigError(f"prometheus: {url!r} is not a server address KEDA can query: give "
                          "http://HOST:PORT or https://HOST:PORT (scheme and host)")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise ConfigError(f"prometheus: {url!r} has a port that is not a number from 1 to "
                          "65535") from None
    return url


@dataclass(frozen=True)
class Autoscale:
    """What the pool scales on: a Prometheus server and records or seconds."""

    prometheus: str
    scale_on: ScaleOn = "records"
    #: records of drainable lag per replica (``records``)
    lag_threshold: int = 100
    #: seconds a partition's drainable time lag may reach before it wants a replica
    time_lag_target: float = DEFAULT_TIME_LAG_TARGET_S

    def __post_init__(self) -> None:
        check_server(self.prometheus)
        if self.scale_on not in ("records", "seconds"):
            raise ConfigError(f"scale on: 'records' or 'seconds', got {self.scale_on!r}")
        if not isinstance(self.lag_threshold, int) or self.lag_threshold < 1:
            raise ConfigError(f"lag threshold: a whole number of records >= 1, got "
                              f"{self.lag_threshold!r}")
        t = self.time_lag_target
        if not isinstance(t, (int, float)) or not t > 0 or not math.isfinite(t):
            raise ConfigError(f"time-lag target: must be a positive duration, got {t!r}")

    def query(self, groups: tuple[str, ...]) -> str:
        """The PromQL of the trigger that grows the pool."""
        if self.scale_on == "records":
            return drainable_query(groups)
        return time_lag_query(groups, self.time_lag_target)

    @property
    def threshold(self) -> str:
        """The trigger's ``threshold``: records per replica, or 1 (a replica per partition
        behind its target)."""
        return str(self.lag_threshold) if self.scale_on == "records" else "1"


def _selector(metric: str, groups: tuple[str, ...]) -> str:
    return " or ".join(f"{metric}{{group={quoted(g)}}}" for g in groups)


def drainable_query(groups: tuple[str, ...]) -> str:
    """The pool's drainable records: each partition once (the largest any replica shows),
    summed; 0 when no worker exports any."""
    sel = _selector("kworkers_drainable_lag", groups)
    return f"sum(max by (topic, partition) ({sel})) or vector(0)"


def time_lag_query(groups: tuple[str, ...], target: float) -> str:
    """The partitions whose drainable time lag exceeds ``target`` seconds, counted."""
    sel = _selector("kworkers_drainable_time_lag_seconds", groups)
    return f"count(max by (topic, partition) ({sel}) > {target:g}) or vector(0)"


def hpa_behavior() -> dict[str, Any]:
    """``advanced.horizontalPodAutoscalerConfig.behavior`` (the module doc says why)."""
    return {
        "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15},
                                 {"type": "Pods", "value": 4, "periodSeconds": 15}]},
        "scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW_S,
                      "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}]},
    }

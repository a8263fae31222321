"""The circuit breaker's state as the workers export it: ``kworkers_breaker_state{group}``;
and, read from the same exposition, what each poll loop holds in memory against its bound
(``kworkers_in_flight_bytes`` and ``..._bound``, issue #45).

A breaker lives in a worker process, not in Kafka, so the only place to see it is the
worker's ``/metrics`` endpoint; so does what a worker holds. The console reads the endpoints
it was given (``--metrics-url``, repeatable) when a Groups page is shown; without any it says
the state is not exported rather than guessing "closed". An endpoint that does not answer is
shown as such, per endpoint, never fatal to the page.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

METRIC = "kworkers_breaker_state"
IN_FLIGHT, BOUND = "kworkers_in_flight_bytes", "kworkers_in_flight_bytes_bound"
#: The gauge's values (``kworkers.metrics``): 0 closed, 1 half-open, 2 open.
STATES = {0: "closed", 1: "half-open", 2: "open"}
#: An endpoint that takes longer than this is reported as not answering.
FETCH_TIMEOUT = 2.0
#: A larger exposition is not a worker's (and would hold the page).
MAX_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Endpoint:
    """One ``/metrics`` endpoint: the breaker state per group it exports, or why none."""

    url: str
    states: dict[str, str] = field(default_factory=dict)
    problem: str | None = None
    #: group (a loop's: ``<group>`` and ``<group>.retry``) -> bytes in flight, and its bound
    in_flight: dict[str, InFlight] = field(default_factory=dict)


@dataclass(frozen=True)
class InFlight:
    """What one loop holds in memory (bytes), against its ``max_in_flight_bytes``."""

    held: float
    bound: float | None = None

    def describe(self) -> str:
        held = show_size(self.held)
        return held if self.bound is None else (
            f"{held} of {show_size(self.bound)} ({self.held / self.bound:.0%})")


def show_size(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def states_of(exposition: str) -> dict[str, str]:
    """group -> breaker state, from a Prometheus text exposition (an unknown value is kept
    as its number, so nothing is hidden)."""
    out: dict[str, str] = {}
    for family in text_string_to_metric_families(exposition):
        if family.name != METRIC:
            continue
        for sample in family.samples:
            group = sample.labels.get("group")
            if group is None:
                continue
            level = int(sample.value) if float(sample.value).is_integer() else -1
            out[group] = STATES.get(level, f"unknown ({sample.value:g})")
    return out


def in_flight_of(exposition: str) -> dict[str, InFlight]:
    """group -> what its loop holds in bytes and its bound, from a Prometheus exposition
    (a pool parent's sums its processes': one series per process, added here)."""
    held: dict[str, float] = {}
    bound: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        into = held if family.name == IN_FLIGHT else bound if family.name == BOUND else None
        if into is None:
            continue
        for sample in family.samples:
            group = sample.labels.get("group")
            if group is not None:
                into[group] = into.get(group, 0.0) + float(sample.value)
    return {g: InFlight(n, bound.get(g)) for g, n in held.items()}


def fetch(url: str, timeout: float = FETCH_TIMEOUT) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body: bytes = resp.read(MAX_BYTES + 1)
    if len(body) > MAX_BYTES:
        raise ValueError(f"more than {MAX_BYTES} bytes: not a worker's /metrics")
    return body.decode("utf-8", "replace")


def read_endpoints(urls: Sequence[str], get: Callable[[str], str] = fetch) -> list[Endpoint]:
    """Every endpoint's breaker states; one that fails is reported with the reason."""
    out: list[Endpoint] = []
    for url in urls:
        try:
            text = get(url)
            out.append(Endpoint(url, states_of(text), in_flight=in_flight_of(text)))
        except (OSError, ValueError, urllib.error.URLError) as exc:
            out.append(Endpoint(url, problem=f"{type(exc).__name__}: {exc}"))
    return out

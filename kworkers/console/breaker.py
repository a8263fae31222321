"""The circuit breaker's state as the workers export it: ``kworkers_breaker_state{group}``.

A breaker lives in a worker process, not in Kafka, so the only place to see it is the
worker's ``/metrics`` endpoint. The console reads the endpoints it was given
(``--metrics-url``, repeatable) when a Groups page is shown; without any it says the state is
not exported rather than guessing "closed". An endpoint that does not answer is shown as such,
per endpoint, never fatal to the page.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

METRIC = "kworkers_breaker_state"
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
            out.append(Endpoint(url, states_of(get(url))))
        except (OSError, ValueError, urllib.error.URLError) as exc:
            out.append(Endpoint(url, problem=f"{type(exc).__name__}: {exc}"))
    return out

"""``observe_all``: a drain's handler durations applied one update per bucket, the same
histogram as one ``observe_many`` per report.

Why (issue #50): the poll loop applies every runner report it drains, and at thousands of
async handlers in flight a slow handler's runner reports once per record; one locked update
of the sum and one of a bucket per report became two per record. The aggregate must not move
an observation to another bucket: ``observe`` puts a value exactly on a bound into that
bound's bucket, which is where a one-off in the search would show, so values are drawn from
the bounds themselves as well as around them. The canary searches with ``bisect_right`` and is
seen to differ.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from kworkers import metrics
from kworkers.metrics import LATENCY_BUCKETS, observe_all, observe_many

_VALUES = st.one_of(st.sampled_from([b for b in LATENCY_BUCKETS if b != float("inf")]),
                    st.floats(0, 120, allow_nan=False))
_REPORTS = st.lists(st.tuples(_VALUES, st.integers(0, 50)), max_size=40)


def _histogram() -> Histogram:
    return Histogram("d_seconds", "durations", buckets=LATENCY_BUCKETS,
                     registry=CollectorRegistry())


def _state(h: Histogram) -> tuple[list[float], float]:
    return [b.get() for b in h._buckets], h._sum.get()


def _both(reports: list[tuple[float, int]],
          apply: Callable[[Histogram, list[tuple[float, int]]], None]
          ) -> tuple[tuple[list[float], float], tuple[list[float], float]]:
    one_by_one, at_once = _histogram(), _histogram()
    for value, n in reports:
        observe_many(one_by_one, value, n)
    apply(at_once, reports)
    return _state(one_by_one), _state(at_once)


@given(_REPORTS)
def test_a_drain_at_once_is_the_histogram_of_each_report(
        reports: list[tuple[float, int]]) -> None:
    (buckets, total), (buckets_all, total_all) = _both(reports, observe_all)
    assert buckets_all == buckets
    assert total_all == pytest.approx(total)


def test_a_value_on_a_bound_lands_in_that_bounds_bucket() -> None:
    h = _histogram()
    observe_all(h, [(LATENCY_BUCKETS[0], 3), (LATENCY_BUCKETS[2], 2)])
    buckets, total = _state(h)
    assert buckets[0] == 3 and buckets[2] == 2 and sum(buckets) == 5
    assert total == pytest.approx(3 * LATENCY_BUCKETS[0] + 2 * LATENCY_BUCKETS[2])


def test_canary_a_search_one_bucket_off_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "bisect_left", bisect_right)
    (buckets, _), (buckets_all, _) = _both([(LATENCY_BUCKETS[1], 4)], observe_all)
    assert buckets_all != buckets

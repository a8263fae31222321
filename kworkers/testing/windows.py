"""Rate-limit checks over start times read back: the worst window, not an average.

"At most ``burst + rate * T`` starts in every window of ``T >= min_window`` seconds" is checked
over every window at once: the windows that matter start and end at a start, and for the
starts ``i..j`` (sorted) the tightest window is ``[t_i, t_j]``, of length ``T = max(min_window,
t_j - t_i)``. With ``a_k = k - rate * t_k`` the excess of windows longer than ``min_window`` is
``a_j - a_i + 1 - burst``, whose maximum one pass with a running minimum finds; windows shorter
than ``min_window`` are held to the bound of ``min_window`` by a sliding count. An empty or a
single-start run has no window to judge and says so (``Windows.starts``), so a check can refuse
to pass on nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Windows:
    #: starts judged
    starts: int
    #: the most starts any window of ``min_window`` seconds held
    busiest: int
    #: the largest (starts - bound) over every window of ``min_window`` s or longer: > 0 is
    #: a window over its bound
    excess: float
    #: where the worst window begins and ends
    worst: tuple[float, float]


def judge(times: Iterable[float], rate: float, burst: float, min_window: float) -> Windows:
    ts = sorted(times)
    n = len(ts)
    if n == 0:
        return Windows(0, 0, float("-inf"), (0.0, 0.0))
    best = float("-inf")
    worst = (ts[0], ts[0])
    # windows of min_window or less: at most burst + rate * min_window starts
    short_bound = burst + rate * min_window
    busiest = 0
    lo = 0
    for hi in range(n):
        while ts[hi] - ts[lo] > min_window:
            lo += 1
        count = hi - lo + 1
        if count > busiest:
            busiest = count
        if count - short_bound > best:
            best, worst = count - short_bound, (ts[lo], ts[hi])
    # longer windows: starts i..j with t_j - t_i > min_window, bound burst + rate (t_j - t_i)
    min_a = float("inf")
    min_at = 0
    i = 0
    for j in range(n):
        while i < j and ts[j] - ts[i] > min_window:
            a_i = i - rate * ts[i]
            if a_i < min_a:
                min_a, min_at = a_i, i
            i += 1
        if min_a < float("inf"):
            e = (j - rate * ts[j]) - min_a + 1 - burst
            if e > best:
                best, worst = e, (ts[min_at], ts[j])
    return Windows(n, busiest, best, worst)

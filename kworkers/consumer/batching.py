"""How a batch handler's batches are cut: at most ``max_size`` records of one lane, waiting up
to ``max_wait_s`` for more when fewer are there.

Batches are cut per partition lane, also under ``ordering="key"``: a batch may then hold several
keys, each key's records in order, and no key is ever in two batches at once (one runner per
partition). Bulk sinks (a database ``COPY``, a search-index bulk request) are why batches exist;
per-key parallelism inside a partition is what a single-record handler is for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kworkers.clock import Seconds
from kworkers.errors import ConfigError


@dataclass(frozen=True)
class BatchPolicy:
    max_size: int = 500
    #: None: take what the lane holds now (lowest latency); else wait up to this long for more
    max_wait_s: Seconds | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_size, int) or isinstance(self.max_size, bool) \
                or self.max_size < 1:
            raise ConfigError(f"batch.max_size: a whole number >= 1, got {self.max_size!r}")
        w = self.max_wait_s
        if w is not None and (not isinstance(w, int | float) or not math.isfinite(w)
                              or not 0 < w <= 60):
            raise ConfigError(f"batch.max_wait_s: seconds from 0 to 60, or None, got {w!r}")

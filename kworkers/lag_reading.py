"""Reading a group's lag from the cluster, as ``kworkers lag`` prints it and the console shows it.

The arithmetic is ``kworkers.lag`` (pure, KEDA's rules); this module only reads what it needs
from the broker (``kworkers.kafka.offsets``): latest offsets, the group's committed offsets, and
for the retry tier group ``<group>.retry`` the records between its committed offset and the end
of each tier partition, to count how many are still waiting for their ``kw-due-at``. That read
is bounded (``WAITING_SCAN_LIMIT`` records per partition) and says so when it stops early.
For the time lag, the record at each lagging partition's committed position is read too (its
timestamp; a tier record's ``kw-due-at`` comes with the waiting count's read).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from kworkers.errors import ConfigError
from kworkers.kafka import clients
from kworkers.kafka.offsets import Row, group_offsets, group_topics
from kworkers.kafka.reader import scan
from kworkers.kafka.settings import ClientSettings, as_client
from kworkers.lag import WAITING_SCAN_LIMIT, GroupLag, ResetPolicy, count_waiting, group_lag
from kworkers.retry_tiers.headers import HeaderError, due_at_of
from kworkers.topic_names import is_tier_topic, retry_group, source_topic_of


def tier_topics_of(sources: Sequence[str], have: dict[str, int]) -> list[str]:
    """The retry tier topics of ``sources`` that exist (found by name, whatever the ladder)."""
    wanted = set(sources)
    return sorted(t for t in have
                  if is_tier_topic(t) and t not in wanted and source_topic_of(t) in wanted)


def head_times(client: ClientSettings | str, rows: Sequence[Row]
               ) -> dict[tuple[str, int], float | None]:
    """Per lagging partition: the timestamp of the record at its committed position (the
    first record from there: a transaction marker or a compacted gap holds none)."""
    out: dict[tuple[str, int], float | None] = {}
    by_topic: dict[str, dict[int, int]] = {}
    for topic, part, latest, committed in rows:
        start = committed if committed is not None and committed >= 0 else 0
        if start < latest:
            by_topic.setdefault(topic, {})[part] = start
    for topic, starts in by_topic.items():
        got = scan(client, topic, start=starts, partitions=list(starts), limit=1)
        for m in got.messages:
            out[(topic, m.partition)] = (None if m.timestamp_ms is None
                                         else m.timestamp_ms / 1000.0)
    return out


def waiting_counts(client: ClientSettings | str, rows: Sequence[Row], now: float,
                   limit: int = WAITING_SCAN_LIMIT,
                   heads: dict[tuple[str, int], float | None] | None = None,
                   ) -> dict[tuple[str, int], tuple[int, bool]]:
    """Per tier partition: records after the committed offset whose due time is ahead.

    A record with unreadable headers counts as due: the tier worker will run it (and
    dead-letter it) at once, it is not waiting. ``heads``, when given, gets each partition's
    first record's due time (what its time lag counts from).
    """
    out: dict[tuple[str, int], tuple[int, bool]] = {}
    by_topic: dict[str, dict[int, int]] = {}
    for topic, part, latest, committed in rows:
        start = committed if committed is not None else 0
        if start < latest:
            by_topic.setdefault(topic, {})[part] = start
    for topic, starts in by_topic.items():
        got = scan(client, topic, start=starts, partitions=list(starts), limit=limit)
        dues: dict[int, list[float | None]] = {p: [] for p in starts}
        for m in got.messages:
            try:
                dues[m.partition].append(due_at_of(m.headers))
            except HeaderError:
                dues[m.partition].append(None)
        for p, ds in dues.items():
            out[(topic, p)] = (count_waiting(ds, now), p in got.truncated)
            if heads is not None and ds:
                heads[(topic, p)] = ds[0]
    return out


def read_lag(client: ClientSettings | str, group: str, names: Sequence[str],
             reset_policy: ResetPolicy, scale_to_zero: bool,
             limit: int = WAITING_SCAN_LIMIT) -> tuple[GroupLag, GroupLag]:
    """(the group's lag, its retry tier group's lag with the waiting records counted)."""
    settings = as_client(client)
    have = clients.list_topics(settings)
    sources = list(dict.fromkeys(names)) or group_topics(settings, group)
    if not sources:
        raise ConfigError(f"group {group!r} has no committed offsets; name its topics with "
                          "--topic")
    for t in sources:
        if t not in have:
            raise ConfigError(f"topic {t!r} does not exist on {settings.bootstrap_servers}")
    rows = group_offsets(settings, group, sources, have)
    now = time.time()
    main = group_lag(group, rows, reset_policy, scale_to_zero, times=head_times(settings, rows),
                     now=now)
    tier_group = retry_group(group)
    tier_rows = group_offsets(settings, tier_group, tier_topics_of(sources, have), have)
    heads: dict[tuple[str, int], float | None] = {}
    waiting = waiting_counts(settings, tier_rows, now, limit, heads)
    retry = group_lag(tier_group, tier_rows, reset_policy, scale_to_zero, waiting, heads, now)
    return main, retry

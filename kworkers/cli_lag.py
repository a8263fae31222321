"""``kworkers lag``: read a group's offsets and its retry tiers' backlog (the adapter half).

The arithmetic is ``kworkers.lag`` (pure, KEDA's rules); this module only reads what it needs
from the broker: latest offsets, the group's committed offsets, and for the retry tier group
``<group>.retry`` the records between its committed offset and the end of each tier partition,
to count how many are still waiting for their ``kw-due-at``. That read is bounded
(``WAITING_SCAN_LIMIT`` records per partition) and says so when it stops early.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

from kworkers.errors import ConfigError
from kworkers.kafka import clients
from kworkers.kafka.clients import CONNECT_TIMEOUT
from kworkers.kafka.reader import scan
from kworkers.kafka.settings import ClientSettings, as_client
from kworkers.lag import WAITING_SCAN_LIMIT, GroupLag, ResetPolicy, count_waiting, group_lag
from kworkers.retry_tiers.headers import HeaderError, due_at_of
from kworkers.retry_tiers.tiers import source_topic_of

Row = tuple[str, int, int, int | None]


def committed_topics(client: ClientSettings | str, group: str) -> list[str]:
    """The topics ``group`` has committed offsets for (KEDA's choice when no topic is set)."""
    admin = clients.admin(client)
    try:
        fut = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
        res = fut.result(timeout=CONNECT_TIMEOUT)
    except KafkaException as exc:
        raise clients.unreachable(client, exc) from None
    return sorted({tp.topic for tp in res.topic_partitions or [] if tp.offset >= 0})


def offsets(client: ClientSettings | str, group: str, names: Sequence[str],
            have: dict[str, int]) -> list[Row]:
    """``(topic, partition, latest, committed)`` for every partition of ``names``."""
    if not names:
        return []
    c = clients.reader(client, group)
    try:
        tps = [TopicPartition(t, p) for t in names for p in range(have[t])]
        committed = {(tp.topic, tp.partition): tp.offset
                     for tp in c.committed(tps, timeout=CONNECT_TIMEOUT)}
        rows: list[Row] = []
        for tp in tps:
            _lo, hi = c.get_watermark_offsets(tp, timeout=CONNECT_TIMEOUT)
            off = committed.get((tp.topic, tp.partition), -1)
            rows.append((tp.topic, tp.partition, hi, off if off >= 0 else None))
        return rows
    except KafkaException as exc:
        raise clients.unreachable(client, exc) from None
    finally:
        c.close()


def tier_topics_of(sources: Sequence[str], have: dict[str, int]) -> list[str]:
    """The retry tier topics of ``sources`` that exist (found by name, whatever the ladder)."""
    wanted = set(sources)
    return sorted(t for t in have
                  if ".retry." in t and not t.endswith(".dlq") and t not in wanted
                  and source_topic_of(t) in wanted)


def waiting_counts(client: ClientSettings | str, rows: Sequence[Row], now: float,
                   limit: int = WAITING_SCAN_LIMIT) -> dict[tuple[str, int], tuple[int, bool]]:
    """Per tier partition: records after the committed offset whose due time is ahead.

    A record with unreadable headers counts as due: the tier worker will run it (and
    dead-letter it) at once, it is not waiting.
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
    return out


def read_lag(client: ClientSettings | str, group: str, names: Sequence[str],
             reset_policy: ResetPolicy, scale_to_zero: bool,
             limit: int = WAITING_SCAN_LIMIT) -> tuple[GroupLag, GroupLag]:
    """(the group's lag, its retry tier group's lag with the waiting records counted)."""
    settings = as_client(client)
    have = clients.list_topics(settings)
    sources = list(dict.fromkeys(names)) or committed_topics(settings, group)
    if not sources:
        raise ConfigError(f"group {group!r} has no committed offsets; name its topics with "
                          "--topic")
    for t in sources:
        if t not in have:
            raise ConfigError(f"topic {t!r} does not exist on {settings.bootstrap_servers}")
    main = group_lag(group, offsets(settings, group, sources, have), reset_policy,
                     scale_to_zero)
    retry_group = f"{group}.retry"
    tier_rows = offsets(settings, retry_group, tier_topics_of(sources, have), have)
    waiting = waiting_counts(settings, tier_rows, time.time(), limit)
    retry = group_lag(retry_group, tier_rows, reset_policy, scale_to_zero, waiting)
    return main, retry

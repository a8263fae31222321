"""``kworkers lag``: read a group's offsets and its retry tiers' backlog, and print them.

The arithmetic is ``kworkers.lag`` (pure, KEDA's rules); this module only reads what it needs
from the broker: latest offsets, the group's committed offsets, and for the retry tier group
``<group>.retry`` the records between its committed offset and the end of each tier partition,
to count how many are still waiting for their ``kw-due-at``. That read is bounded
(``WAITING_SCAN_LIMIT`` records per partition) and says so when it stops early.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import click
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from rich.table import Table

from kworkers.cli.options import client_options, console
from kworkers.errors import ConfigError
from kworkers.kafka import clients
from kworkers.kafka.clients import CONNECT_TIMEOUT
from kworkers.kafka.reader import scan
from kworkers.kafka.settings import ClientSettings, as_client
from kworkers.lag import WAITING_SCAN_LIMIT, GroupLag, ResetPolicy, count_waiting, group_lag
from kworkers.retry_tiers.headers import HeaderError, due_at_of
from kworkers.topic_names import is_tier_topic, retry_group, source_topic_of

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
                  if is_tier_topic(t) and t not in wanted and source_topic_of(t) in wanted)


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
    tier_group = retry_group(group)
    tier_rows = offsets(settings, tier_group, tier_topics_of(sources, have), have)
    waiting = waiting_counts(settings, tier_rows, time.time(), limit)
    retry = group_lag(tier_group, tier_rows, reset_policy, scale_to_zero, waiting)
    return main, retry


@click.command()
@client_options
@click.option("--group", "-g", required=True, help="The workers' consumer group.")
@click.option("--topic", "-t", "names", multiple=True,
              help="Source topic (default: the topics the group committed offsets for).")
@click.option("--offset-reset-policy", type=click.Choice(["latest", "earliest"]),
              default="latest", show_default=True,
              help="KEDA's offsetResetPolicy: the lag of a partition with no commit.")
@click.option("--scale-to-zero-on-invalid-offset", is_flag=True,
              help="KEDA's scaleToZeroOnInvalidOffset: no commit counts as lag 0.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
@click.option("--waiting-scan-limit", type=click.IntRange(min=1), default=None, hidden=True)
def lag(client: ClientSettings, group: str, names: tuple[str, ...], offset_reset_policy: str,
        scale_to_zero_on_invalid_offset: bool, as_json: bool,
        waiting_scan_limit: int | None) -> int:
    """Per-partition lag as KEDA's Kafka scaler computes it, with the retry tiers apart.

    The group's lag is what KEDA scales on. The retry tier group <group>.retry is shown
    separately, its lag split into records still waiting for their due time and records
    due now (read from the committed offset, at most 10,000 per partition).
    """
    policy: ResetPolicy = "earliest" if offset_reset_policy == "earliest" else "latest"
    main, retry = read_lag(client, group, names, policy, scale_to_zero_on_invalid_offset,
                           waiting_scan_limit or WAITING_SCAN_LIMIT)

    def rows(g: GroupLag) -> list[dict[str, Any]]:
        return [{"topic": p.topic, "partition": p.partition, "committed": p.committed,
                 "latest": p.latest, "lag": p.lag, "waiting": p.waiting, "due": p.due,
                 "truncated": p.truncated} for p in g.partitions]

    if as_json:
        click.echo(json.dumps({
            "group": main.group, "lag": main.total, "partitions": rows(main),
            "retry_group": retry.group, "retry_lag": retry.total,
            "retry_waiting": retry.waiting, "retry_truncated": retry.truncated,
            "retry_partitions": rows(retry)}, indent=2))
        return 0
    out = console()
    t = Table(title=f"group {main.group} (what KEDA scales on)", title_justify="left",
              header_style="bold")
    for col in ("topic", "partition", "committed", "latest", "lag"):
        t.add_column(col, justify="left" if col == "topic" else "right")
    for p in main.partitions:
        t.add_row(p.topic, str(p.partition), "-" if p.committed is None else str(p.committed),
                  str(p.latest), str(p.lag))
    out.print(t)
    out.print(f"lag group={main.group} total={main.total}")
    if retry.partitions:
        r = Table(title=f"retry tier group {retry.group} (not KEDA's lag)",
                  title_justify="left", header_style="bold")
        for col in ("topic", "partition", "committed", "latest", "lag", "waiting", "due"):
            r.add_column(col, justify="left" if col == "topic" else "right")
        for p in retry.partitions:
            waiting = f"≥{p.waiting}" if p.truncated else str(p.waiting)
            r.add_row(p.topic, str(p.partition),
                      "-" if p.committed is None else str(p.committed), str(p.latest),
                      str(p.lag), waiting, str(p.due))
        out.print(r)
        more = " (truncated: at least)" if retry.truncated else ""
        out.print(f"retry group={retry.group} lag={retry.total} waiting={retry.waiting}"
                  f"{more} due={retry.total - retry.waiting}")
    else:
        out.print(f"retry group={retry.group}: no retry tier topics found")
    return 0

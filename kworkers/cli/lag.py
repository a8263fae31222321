"""``kworkers lag``: a group's lag as KEDA's Kafka scaler computes it, its retry tiers apart
(read by ``kworkers.lag_reading``; this module only prints it).
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from kworkers.cli.options import client_options, console
from kworkers.kafka.settings import ClientSettings
from kworkers.lag import RENDERED_RESET_POLICY, WAITING_SCAN_LIMIT, GroupLag, ResetPolicy
from kworkers.lag_reading import read_lag


@click.command()
@client_options
@click.option("--group", "-g", required=True, help="The workers' consumer group.")
@click.option("--topic", "-t", "names", multiple=True,
              help="Source topic (default: the topics the group committed offsets for).")
@click.option("--offset-reset-policy", type=click.Choice(["latest", "earliest"]),
              default=RENDERED_RESET_POLICY, show_default=True,
              help="KEDA's offsetResetPolicy: the lag of a partition with no commit (the "
                   "default is what `kworkers deploy render` puts in the ScaledObject).")
@click.option("--scale-to-zero-on-invalid-offset", is_flag=True,
              help="KEDA's scaleToZeroOnInvalidOffset: no commit counts as lag 0.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
@click.option("--waiting-scan-limit", type=click.IntRange(min=1), default=None, hidden=True)
def lag(client: ClientSettings, group: str, names: tuple[str, ...], offset_reset_policy: str,
        scale_to_zero_on_invalid_offset: bool, as_json: bool,
        waiting_scan_limit: int | None) -> int:
    """Per-partition lag as KEDA's Kafka scaler computes it, with the retry tiers apart.

    The group's lag is what KEDA's Kafka scaler counts. The retry tier group <group>.retry
    is shown separately, its lag split into records still waiting for their due time and
    records due now (read from the committed offset, at most 10,000 per partition).

    time lag: seconds the record at the committed position has waited (its timestamp; a
    retry tier record: how late it is past its kw-due-at, 0 while not due); 0 with no lag.
    The group's time lag is its partitions' largest.
    """
    policy: ResetPolicy = "earliest" if offset_reset_policy == "earliest" else "latest"
    main, retry = read_lag(client, group, names, policy, scale_to_zero_on_invalid_offset,
                           waiting_scan_limit or WAITING_SCAN_LIMIT)

    def rows(g: GroupLag) -> list[dict[str, Any]]:
        return [{"topic": p.topic, "partition": p.partition, "committed": p.committed,
                 "latest": p.latest, "lag": p.lag, "waiting": p.waiting, "due": p.due,
                 "truncated": p.truncated, "time_lag_seconds": p.time_lag}
                for p in g.partitions]

    if as_json:
        click.echo(json.dumps({
            "group": main.group, "lag": main.total, "time_lag_seconds": main.time_lag,
            "partitions": rows(main), "retry_time_lag_seconds": retry.time_lag,
            "retry_group": retry.group, "retry_lag": retry.total,
            "retry_waiting": retry.waiting, "retry_truncated": retry.truncated,
            "retry_partitions": rows(retry)}, indent=2))
        return 0
    out = console()
    t = Table(title=f"group {main.group} (what KEDA scales on)", title_justify="left",
              header_style="bold")
    for col in ("topic", "partition", "committed", "latest", "lag", "time lag"):
        t.add_column(col, justify="left" if col == "topic" else "right")
    for p in main.partitions:
        t.add_row(p.topic, str(p.partition), "-" if p.committed is None else str(p.committed),
                  str(p.latest), str(p.lag), _secs(p.time_lag))
    out.print(t)
    out.print(f"lag group={main.group} total={main.total} time_lag={_secs(main.time_lag)}")
    if retry.partitions:
        r = Table(title=f"retry tier group {retry.group} (not KEDA's lag)",
                  title_justify="left", header_style="bold")
        for col in ("topic", "partition", "committed", "latest", "lag", "waiting", "due",
                    "late"):
            r.add_column(col, justify="left" if col == "topic" else "right")
        for p in retry.partitions:
            waiting = f"≥{p.waiting}" if p.truncated else str(p.waiting)
            r.add_row(p.topic, str(p.partition),
                      "-" if p.committed is None else str(p.committed), str(p.latest),
                      str(p.lag), waiting, str(p.due), _secs(p.time_lag))
        out.print(r)
        more = " (truncated: at least)" if retry.truncated else ""
        out.print(f"retry group={retry.group} lag={retry.total} waiting={retry.waiting}"
                  f"{more} due={retry.total - retry.waiting} late={_secs(retry.time_lag)}")
    else:
        out.print(f"retry group={retry.group}: no retry tier topics found")
    return 0


def _secs(t: float | None) -> str:
    return "-" if t is None else f"{t:.1f}s"

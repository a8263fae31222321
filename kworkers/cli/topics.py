"""``kworkers topics plan|create``: the retry tier and DLQ topics a source topic needs.

The plan is ``kworkers.topic_plan`` (pure, shared with a worker's own pre-flight), so ``plan``
and ``create`` can never disagree; this module reads what exists and prints or creates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click
from rich.table import Table

from kworkers.cli.options import client_options, console
from kworkers.kafka.settings import ClientSettings
from kworkers.topic_plan import PlannedTopic, plan_topics, specs

DEFAULT_TIERS = "1s,5s,30s,2m,10m"


@click.group()
def topics() -> None:
    """Create (or plan) the retry tier and DLQ topics of source topics."""


def _topics_options(fn: Any) -> Any:
    fn = click.option("--replication-factor", type=int, default=-1, show_default=True,
                      help="Replicas per new topic (-1: a tier or DLQ copies its existing "
                           "source's replicas and min.insync.replicas; a new source gets the "
                           "broker's default).")(fn)
    fn = click.option("--partitions", type=click.IntRange(min=1), default=None,
                      help="Create missing source topics with N partitions (tiers and the "
                           "DLQ always get the source's count).")(fn)
    fn = click.option("--tiers", default=DEFAULT_TIERS, show_default=True,
                      help="Retry tier delays, shortest first (500ms, 1s, 2m, 1h).")(fn)
    fn = click.option("--topic", "-t", "names", multiple=True, required=True,
                      help="Source topic; repeat for several.")(fn)
    return client_options(fn)


def _plan(client: ClientSettings, names: Sequence[str], tiers: str,
          partitions: int | None) -> list[PlannedTopic]:
    from kworkers.kafka.admin import source_shapes
    from kworkers.kafka.clients import list_topics
    from kworkers.settings import parse_tiers

    ladder = parse_tiers(tiers, "--tiers")
    have = list_topics(client)
    shapes = source_shapes(client, [n for n in names if n in have])
    return plan_topics(have, names, ladder, partitions, client.bootstrap_servers, shapes)


def _plan_table(plan: Sequence[PlannedTopic], title: str, replication_factor: int) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for col in ("topic", "role", "partitions", "action", "replicas", "note"):
        t.add_column(col, no_wrap=col != "note")
    for p in plan:
        replicas = p.durability(replication_factor) if p.action == "create" else ""
        t.add_row(p.name, p.role, str(p.partitions), p.action, replicas, p.note)
    return t


@topics.command("plan")
@_topics_options
def topics_plan(client: ClientSettings, names: tuple[str, ...], tiers: str,
                partitions: int | None, replication_factor: int) -> int:
    """Print the topics `topics create` would create; changes nothing."""
    plan = _plan(client, names, tiers, partitions)
    out = console()
    out.print(_plan_table(plan, f"topics plan on {client.bootstrap_servers}", replication_factor))
    todo = sum(p.action == "create" for p in plan)
    out.print(f"plan: create={todo} exists={len(plan) - todo} (nothing was changed)")
    return 0


@topics.command("create")
@_topics_options
def topics_create(client: ClientSettings, names: tuple[str, ...], tiers: str,
                  partitions: int | None, replication_factor: int) -> int:
    """Create missing source (with --partitions), retry tier and DLQ topics."""
    from kworkers.kafka.admin import admin_client, create_topics

    plan = _plan(client, names, tiers, partitions)
    made = set(create_topics(admin_client(client), specs(plan, replication_factor)))
    out = console()
    for p in plan:
        what = "created" if p.name in made else "exists " if p.action == "exists" else "raced  "
        note = f"  ({p.note})" if p.note else ""
        made_as = f", replicas {p.durability(replication_factor)}" if p.name in made else ""
        out.print(f"{what} {p.name} ({p.partitions} partitions, {p.role}{made_as}){note}")
    out.print(f"created={len(made)} exists={len(plan) - len(made)}")
    return 0

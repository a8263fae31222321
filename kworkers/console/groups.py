"""The Groups pages: each worker group with its retry group, lag, KEDA's answer and members.

The lag is ``kworkers lag``'s own reading (``kworkers.lag_reading.read_lag``: KEDA's rules, the
retry tier group apart, waiting vs due counted from a bounded read), the replica count is
``kworkers.keda.desired_replicas`` on those offsets, the members and their assignments come
from the admin client's ``describe_consumer_groups`` (read by ``kworkers.kafka.groups``), and
the breaker from the workers' ``/metrics`` (``kworkers.console.breaker``). Nothing here
computes a number of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kworkers.console.breaker import Endpoint, read_endpoints
from kworkers.console.settings import ConsoleSettings
from kworkers.kafka import clients
from kworkers.kafka import groups as kafka_groups
from kworkers.kafka.offsets import group_topics
from kworkers.keda import PartitionOffsets, ScaleDecision, ScalerSettings, desired_replicas
from kworkers.lag import RENDERED_RESET_POLICY, GroupLag
from kworkers.lag_reading import read_lag
from kworkers.topic_names import (
    DLQ_SUFFIX,
    RETRY_GROUP_SUFFIX,
    dlq_topic,
    retry_group,
    topic_order,
)


@dataclass(frozen=True)
class GroupListing:
    """A worker group on the index: its state, and its retry group when one exists."""

    group: str
    state: str
    kind: str
    retry_group: str | None
    retry_state: str | None


@dataclass(frozen=True)
class Member:
    member_id: str
    client_id: str
    host: str
    assignment: str  # "topic[0,1] other[2]"


@dataclass(frozen=True)
class Members:
    group: str
    state: str
    kind: str
    assignor: str
    coordinator: str
    members: list[Member]
    problem: str | None = None  # why the group could not be described (e.g. not authorised)


@dataclass(frozen=True)
class TierBacklog:
    """One retry tier topic's backlog in the retry group: lag, of which waiting and due."""

    topic: str
    lag: int
    waiting: int
    due: int
    truncated: bool


@dataclass(frozen=True)
class Scale:
    decision: ScaleDecision
    threshold: int
    min_replicas: int
    max_replicas: int
    current: int


@dataclass(frozen=True)
class GroupView:
    group: str
    main: GroupLag | None  # None: the group has no committed offsets yet
    retry: GroupLag | None
    tiers: list[TierBacklog]
    scale: Scale | None
    members: list[Members]
    breakers: list[Endpoint] | None  # None: no --metrics-url, the state is not exported
    dlqs: list[str]


def pair_groups(names: Iterable[str]) -> list[tuple[str, str | None]]:
    """(worker group, its retry group or None), sorted; a retry group whose worker group is
    gone is listed on its own."""
    have = set(names)
    out = []
    for g in sorted(have):
        if g.endswith(RETRY_GROUP_SUFFIX) and g[:-len(RETRY_GROUP_SUFFIX)] in have:
            continue
        r = retry_group(g)
        out.append((g, r if r in have else None))
    return out


def list_groups(s: ConsoleSettings) -> list[GroupListing]:
    """Every worker group on the cluster (only ``s.groups`` when the console was given some)."""
    listed = {g.group: g for g in kafka_groups.list_groups(s.client, s.connect_timeout)}
    names = [n for n in listed if not s.groups or n in s.groups
             or n.removesuffix(RETRY_GROUP_SUFFIX) in s.groups]
    out = []
    for g, r in pair_groups(names):
        listing = listed[g]
        retry = listed.get(r) if r else None
        out.append(GroupListing(g, listing.state, listing.kind, r,
                                None if retry is None else retry.state))
    return out


def describe(s: ConsoleSettings, groups: Sequence[str]) -> list[Members]:
    """Each group's members and assignments; a group the broker will not describe (unknown,
    not authorised) says why instead of failing the page."""
    out = []
    for d in kafka_groups.describe_groups(s.client, groups, s.connect_timeout):
        if d.missing:
            out.append(Members(d.group, "dead", "-", "-", "-", []))
            continue
        if d.problem is not None:
            out.append(Members(d.group, "unknown", "-", "-", "-", [], d.problem))
            continue
        members = []
        for m in d.members:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in m.assignment:
                by_topic.setdefault(topic, []).append(partition)
            members.append(Member(m.member_id, m.client_id, m.host, " ".join(
                f"{t}[{','.join(map(str, sorted(by_topic[t])))}]"
                for t in sorted(by_topic, key=topic_order)) or "(nothing assigned)"))
        out.append(Members(d.group, d.state, d.kind, d.assignor or "-", d.coordinator or "-",
                           sorted(members, key=lambda m: m.client_id)))
    return out


def tier_backlogs(retry: GroupLag) -> list[TierBacklog]:
    """Per tier topic: the retry group's lag, split into records waiting and records due."""
    out: dict[str, TierBacklog] = {}
    for p in retry.partitions:
        t = out.get(p.topic, TierBacklog(p.topic, 0, 0, 0, False))
        out[p.topic] = TierBacklog(p.topic, t.lag + p.lag, t.waiting + (p.waiting or 0),
                                   t.due + (p.due or 0), t.truncated or p.truncated)
    return [out[t] for t in sorted(out, key=topic_order)]


def scale_of(s: ConsoleSettings, main: GroupLag, current: int) -> Scale:
    """What KEDA's Kafka scaler would ask for, with the console's trigger settings; the
    maximum defaults to the partition count (more replicas than partitions sit idle)."""
    parts = [PartitionOffsets(p.topic, p.partition, p.latest, p.committed)
             for p in main.partitions]
    top = s.max_replicas if s.max_replicas is not None else max(1, len(parts))
    low = min(s.min_replicas, top)
    decision = desired_replicas(ScalerSettings(lag_threshold=s.lag_threshold,
                                               offset_reset_policy=RENDERED_RESET_POLICY),
                                parts, None, current, low, top)
    return Scale(decision, s.lag_threshold, low, top, current)


def group_view(s: ConsoleSettings, group: str) -> GroupView:
    have = clients.list_topics(s.client, timeout=s.connect_timeout)
    retry = retry_group(group)
    members = describe(s, [group, retry])
    sources = [t for t in group_topics(s.client, group) if t in have]
    main = tier = None
    if sources:
        main, tier = read_lag(s.client, group, sources, RENDERED_RESET_POLICY, False)
    current = len(members[0].members)
    breakers = read_endpoints(s.metrics_urls) if s.metrics_urls else None
    dlqs = sorted({dlq_topic(t) for t in sources} & {t for t in have if t.endswith(DLQ_SUFFIX)})
    return GroupView(group, main, tier, tier_backlogs(tier) if tier else [],
                     scale_of(s, main, current) if main else None,
                     [m for m in members if m.group == group or m.state != "dead"],
                     breakers, dlqs)

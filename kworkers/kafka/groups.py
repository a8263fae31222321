"""Consumer groups through the admin client (an adapter module): which groups the cluster has,
and each one's members and assignments, for the console's Groups pages.

The console reads these values and never the client: a cluster that does not answer is
``KafkaUnreachable`` (one line, secrets masked); a group the broker will not describe (unknown,
not authorised) is a value saying so, so one refused group never fails a page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException

from kworkers.kafka import clients
from kworkers.kafka.settings import ClientSettings, as_client

__all__ = ["GroupDescription", "GroupMember", "ListedGroup", "describe_groups", "list_groups"]


@dataclass(frozen=True)
class ListedGroup:
    """A group on the cluster's list: its state and type as words (``stable``, ``classic``)."""

    group: str
    state: str
    kind: str


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    client_id: str
    host: str
    #: the (topic, partition) pairs assigned to it, as the broker lists them
    assignment: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class GroupDescription:
    """One group as the broker describes it. ``missing``: the broker does not know the group;
    ``problem``: why it would not describe it (e.g. not authorised), secrets masked; in both
    cases only ``group`` says anything."""

    group: str
    state: str = ""
    kind: str = ""
    assignor: str = ""
    #: ``host:port (id n)`` of the group's coordinator; None when the broker names none
    coordinator: str | None = None
    members: tuple[GroupMember, ...] = ()
    missing: bool = False
    problem: str | None = None


def _name(value: object) -> str:
    """An enum from the admin API (``ConsumerGroupState.STABLE``) as ``stable``."""
    name = getattr(value, "name", None)
    return (name if isinstance(name, str) else str(value)).lower().replace("_", "-")


def list_groups(client: ClientSettings | str, timeout: float) -> list[ListedGroup]:
    """Every consumer group the cluster lists; ``KafkaUnreachable`` when it does not answer."""
    admin = clients.admin(client)
    try:
        res = admin.list_consumer_groups(request_timeout=timeout).result(timeout=timeout + 5)
    except KafkaException as exc:
        raise clients.unreachable(client, exc) from None
    return [ListedGroup(g.group_id, _name(g.state), _name(g.type)) for g in res.valid or []]


def describe_groups(client: ClientSettings | str, groups: Sequence[str],
                    timeout: float) -> list[GroupDescription]:
    """Each of ``groups`` (in that order) as the broker describes it; ``KafkaUnreachable`` when
    the cluster does not answer at all."""
    c = as_client(client)
    admin = clients.admin(c)
    try:
        futures = admin.describe_consumer_groups(list(groups), request_timeout=timeout)
    except KafkaException as exc:
        raise clients.unreachable(c, exc) from None
    out = []
    for g in groups:
        try:
            d = futures[g].result(timeout=timeout + 5)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.GROUP_ID_NOT_FOUND:
                out.append(GroupDescription(g, missing=True))
            else:
                out.append(GroupDescription(g, problem=c.redact(clients.reason(exc))))
            continue
        members = tuple(
            GroupMember(m.member_id, m.client_id, m.host, tuple(
                (tp.topic, tp.partition)
                for tp in (m.assignment.topic_partitions if m.assignment else []) or []))
            for m in d.members or [])
        node = d.coordinator
        out.append(GroupDescription(
            g, _name(d.state), _name(getattr(d, "type", "unknown")), d.partition_assignor or "",
            f"{node.host}:{node.port} (id {node.id})" if node else None, members))
    return out

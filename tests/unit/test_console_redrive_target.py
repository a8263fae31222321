"""The console's redrive chooses targets by the CLI's rule, through the same code.

One DLQ holds three dead letters: two whose recorded origin is the DLQ's source (``orders``
and its tier ``orders.retry.5s``) and one forged to name ``victim``. The console's plan page
and the CLI's redrive (a dry run, the same I/O seams faked) must replay the first two to
``orders``, refuse the forged one with the same reason, and replay all three to a target the
operator names; a tier or DLQ as that target is a 400 naming why. Without a broker: the DLQ,
ledger and topic list are what the functions would read back (the DLQ's one pass, its span and
the ledger's bits).
"""

from __future__ import annotations

import html
import re
import warnings
from collections.abc import Iterator

import pytest

from kworkers.console import redrive as console_redrive
from kworkers.console.dlq_filter import ConsoleFilter
from kworkers.console.settings import ConsoleSettings
from kworkers.dlq import redrive as cli_redrive
from kworkers.dlq import sweep
from kworkers.dlq.reader import Unreadable
from kworkers.dlq.record import DeadLetter
from kworkers.dlq.replayed import ReplayedOffsets
from kworkers.kafka import clients
from kworkers.kafka.settings import ClientSettings
from kworkers.message import Message
from kworkers.retry_tiers.headers import dead_letter_headers
from kworkers.retry_tiers.routing import DeadLetterDecision

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

    from kworkers.console.app import create_app

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

DLQ = "orders.dlq"
TOPICS = {"orders": 3, "orders.retry.5s": 3, DLQ: 1, "victim": 3, "victim.dlq": 1}


def _dead(offset: int, origin: str) -> DeadLetter:
    src = Message(origin, 1, 40 + offset, f"k{offset}".encode(), b"v", (), 1_700_000_000_000)
    hs = dead_letter_headers(src, "g1", DeadLetterDecision(3, "exhausted", "Timeout", "slow"),
                             1_700_000_100.0)
    return DeadLetter.from_message(Message(DLQ, 0, offset, src.key, src.value, hs))


DEAD = [_dead(0, "orders"), _dead(1, "orders.retry.5s"), _dead(2, "victim")]


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reads both redrives make (one pass: ``kworkers.dlq.sweep``), answered from ``DEAD``
    and ``TOPICS``."""
    def topics(*_a: object, **_k: object) -> dict[str, int]:
        return dict(TOPICS)

    def dlq(*_a: object, **_k: object) -> Iterator[list[DeadLetter | Unreadable]]:
        yield list(DEAD)

    spans = {0: (0, len(DEAD))}
    monkeypatch.setattr(clients, "list_topics", topics)
    monkeypatch.setattr(sweep, "stream_dlq", dlq)
    monkeypatch.setattr(cli_redrive, "watermarks", lambda *_a, **_k: spans)
    monkeypatch.setattr(cli_redrive, "read_replayed",
                        lambda *_a, **_k: ReplayedOffsets(spans))


@pytest.fixture
def console(broker: None) -> Iterator[TestClient]:
    s = ConsoleSettings(ClientSettings.of("127.0.0.1:1", {}), connect_timeout=0.5)
    with TestClient(create_app(s, secret=b"s" * 32), base_url="http://127.0.0.1:8080") as c:
        yield c


def _cells(page: str, table: str) -> list[list[str]]:
    body = page.split(f'id="{table}"', 1)[1].split("</table>", 1)[0].split("<tbody>", 1)[1]
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
             for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def _replay_to(page: str) -> list[str]:
    return [c[3] for c in _cells(page, "plan-rows")]


def test_plan_page_replays_to_the_dlqs_source_and_refuses_a_forged_origin(
        console: TestClient) -> None:
    r = console.get(f"/dlq/{DLQ}/plan")
    assert r.status_code == 200, r.text
    assert [c[0] for c in _cells(r.text, "plan-rows")] == ["0@0", "0@1"]
    assert _replay_to(r.text) == ["orders/1", "orders (by key)"]
    refused = _cells(r.text, "plan-refused")
    assert [c[0] for c in refused] == ["0@2"]
    assert "'victim' is not 'orders'" in refused[0][2]
    assert 'id="plan-pending">2<' in r.text


def test_a_named_target_replays_everything_there(console: TestClient) -> None:
    r = console.get(f"/dlq/{DLQ}/plan", params={"to": "victim"})
    assert r.status_code == 200, r.text
    # the one whose origin is the target keeps its partition; the others go by key
    assert _replay_to(r.text) == ["victim (by key)", "victim (by key)", "victim/1"]
    assert 'id="plan-refused"' not in r.text


@pytest.mark.parametrize(("to", "why"), [("orders.retry.5s", "is a retry tier or a DLQ"),
                                         ("victim.dlq", "is a retry tier or a DLQ"),
                                         ("bad topic!", "is not a legal topic name")])
def test_a_named_tier_dlq_or_illegal_target_is_refused_up_front(
        console: TestClient, to: str, why: str) -> None:
    r = console.get(f"/dlq/{DLQ}/plan", params={"to": to})
    assert r.status_code == 400
    assert why in r.text


def test_console_plan_and_cli_redrive_agree(broker: None) -> None:
    client = ClientSettings.of("127.0.0.1:1", {})
    for to in (None, "victim"):
        page = console_redrive.plan_redrive(client, DLQ, ConsoleFilter(), to)
        cli = cli_redrive.redrive(client, DLQ, to, dry_run=True)
        assert cli.targets == page.targets
        assert cli.pending == page.pending and cli.selected == page.selected
        assert list(cli.refused) == [(f"{DLQ}/0/{r.dead.dlq_offset}", r.reason)
                                     for r in page.refused]
        assert cli.refused_total == page.refused_total == len(page.refused)
    assert len(page.refused) == 0 and page.targets == {"victim": 3}


def test_canary_a_planner_that_trusts_headers_sends_the_forged_one_to_victim(
        console: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan-page check above, against the old rule (target = recorded origin): the forged
    dead letter is planned to ``victim`` and nothing is refused, which that check rejects."""
    from kworkers.dlq import redrive_plan
    from kworkers.topic_names import source_topic_of  # what redrive_plan uses

    monkeypatch.setattr(redrive_plan, "redrive_target",
                        lambda dlq, d, to=None: to or source_topic_of(d.original_topic))
    r = console.get(f"/dlq/{DLQ}/plan")
    assert r.status_code == 200, r.text
    assert "victim/1" in _replay_to(r.text) and 'id="plan-refused"' not in r.text

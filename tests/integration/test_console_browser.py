"""``kworkers console`` in a real browser (Debian's Chromium, driven by Playwright) on a real
broker, with dead letters a real Worker wrote and a "fixed" Worker running beside it.

What the browser proves: every page loads; filters select what they say; a record shows its
headers, failure and envelope; a redrive of a selection arrives in the source topic exactly
once, read back by a fresh consumer, even when the operator confirms the same plan twice from
two tabs; a read-only console refuses the redrive; a form posted from another site is refused;
off loopback the console wants its token. Each page's screenshot goes to
``$KWORKERS_CONSOLE_SCREENSHOTS`` when set (``docs/console/`` is made that way).
"""

from __future__ import annotations

import contextlib
import http.server
import os
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from kworkers import Message, RetryableError, RetryPolicy, TierLadder, Worker
from kworkers.consumer.breaker import BreakerPolicy
from kworkers.dlq.reader import read_dlq
from kworkers.metrics import MetricsServer
from kworkers.retry_tiers.headers import dead_letter_headers
from kworkers.retry_tiers.policy import no_jitter
from kworkers.retry_tiers.routing import DeadLetterDecision
from kworkers.testing import Broker
from kworkers.testing.netns import NetnsLink, netns_available
from kworkers.testing.workload import make_topic, produce, unique
from tests.integration.conftest import running, wait_for
from tests.integration.test_cli_support import ROOT, DeadLetters, cli, make_dead_letters
from tests.unit.test_console_workflows import fill

if TYPE_CHECKING:
    from playwright.sync_api import APIResponse, Response

try:  # imported here, not skipped at collection: a missing Playwright fails the tests in CI
    from playwright.sync_api import Browser, Page, expect, sync_playwright
    from playwright.sync_api import Error as PlaywrightError
    NO_PLAYWRIGHT = ""
except ImportError as exc:  # each test that needs the browser skips, which CI fails
    NO_PLAYWRIGHT = f"Playwright cannot be imported ({exc}): pip install -e '.[dev]'"

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
#: What Chromium needs here: root (no sandbox), no GPU, and no calls to Google's services,
#: which a closed network refuses many at a time.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TOKEN = "console-test-token-0123456789"


# --- the console as an operator starts it ---------------------------------------------------


@contextlib.contextmanager
def console(*args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``kworkers console --port 0 ARGS`` as a subprocess; yields the URL it announced."""
    p = subprocess.Popen(
        [sys.executable, "-m", "kworkers.cli", "console", "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(env or {})})
    assert p.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    line = p.stdout.readline() if sel.select(timeout=60) else ""
    try:
        if not line.startswith("kworkers console: "):
            p.kill()
            raise AssertionError(f"console did not start: {line!r} {p.communicate()[1]}")
        yield line.split()[2].rstrip("/")
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def shot(page: Page, name: str) -> None:
    where = os.environ.get("KWORKERS_CONSOLE_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(where) / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if NO_PLAYWRIGHT:
        pytest.skip(NO_PLAYWRIGHT)
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (scripts/test installs Debian's chromium)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        yield ctx.new_page()
    finally:
        ctx.close()


# --- the cluster: dead letters, a fixed worker, a large DLQ ----------------------------------


@dataclass(frozen=True)
class Stage:
    bs: str
    dead: DeadLetters
    metrics_url: str
    big_dlq: str
    big: int
    coordinates: dict[str, tuple[int, int]]  # key -> (DLQ partition, offset)


def _forge_dead_letters(bs: str, n: int) -> str:
    """A 2-partition DLQ of ``n`` dead letters (error types alternate), as a worker writes
    them, produced directly: enough records to page through."""
    source = unique("big")
    dlq = make_topic(bs, f"{source}.dlq", 2)
    producer = Producer({"bootstrap.servers": bs, "enable.idempotence": True})
    now = time.time()
    for i in range(n):
        kind = "Timeout" if i % 3 == 0 else "Malformed"
        trace = f"00-{i + 1:032x}-{i + 1:016x}-01".encode()
        msg = Message(source, i % 4, i, f"b{i}".encode(), f"value {i}".encode(),
                      (("traceparent", trace),))
        hs = dead_letter_headers(msg, "g-big", DeadLetterDecision(
            4, "exhausted", kind, f"record {i} failed"), now - n + i)
        producer.produce(dlq, key=msg.key, value=msg.value, headers=list(hs), partition=i % 2)
    assert producer.flush(30) == 0
    return dlq


@pytest.fixture(scope="module")
def stage(kafka_broker: Broker) -> Iterator[Stage]:
    """4 dead letters (k0, k6: Malformed; k3, k9: Expired; k3 a task envelope) and then the
    same group's worker, fixed: it handles every record, except two it retries 10 minutes
    later, unjittered (so a tier holds records that are waiting), with a breaker and
    /metrics."""
    bs = kafka_broker.bootstrap_servers
    dead = make_dead_letters(bs)
    w = Worker(topics=[dead.topic], group_id=dead.group, bootstrap_servers=bs,
               retry=RetryPolicy(initial=600.0, max_attempts=3), tiers=TierLadder((600.0,)),
               # the backoff as it is: full jitter would make a retry due anywhere in [0, 600)
               # s, and one drawn small ran within seconds (ci102: a tier showed 1 waiting, the
               # DLQ 5 dead letters; reproduced with draws of 3 s)
               breaker=BreakerPolicy(), jitter=no_jitter)
    w.create_topics()

    @w.handler
    def handle(msg: Message) -> None:
        if (msg.key or b"").startswith(b"slow"):
            raise RetryableError("Upstream503", "the ledger service answered 503")

    metrics = MetricsServer(w.metrics, 0, "127.0.0.1").start()
    big = 60
    big_dlq = _forge_dead_letters(bs, big)
    coordinates = {(d.key or b"").decode(): (d.dlq_partition, d.dlq_offset)
                   for d in read_dlq(bs, dead.dlq).dead_letters}
    with running(w):
        produce(bs, dead.topic, [(b"slow-1", b"s1"), (b"slow-2", b"s2")])
        tier = f"{dead.topic}.retry.10m"
        wait_for(lambda: len(read_back(bs, tier)) >= 2, 60, "two records waiting in a tier")
        try:
            yield Stage(bs, dead, f"http://127.0.0.1:{metrics.port}/metrics", big_dlq, big,
                        coordinates)
        finally:
            metrics.close()


@pytest.fixture(scope="module")
def url(stage: Stage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = fill(tmp_path_factory.mktemp("wf") / "wf.db")  # workflow runs, as an engine writes
    with console("-b", stage.bs, "--metrics-url", stage.metrics_url,
                 "--workflow-store", store) as u:
        yield u


def _coordinates(stage: Stage, key: str) -> tuple[int, int]:
    """(DLQ partition, offset) of the dead letter with ``key``, read back from the DLQ."""
    return stage.coordinates[key]


def read_back(bs: str, topic: str) -> list[dict[str, bytes]]:
    """The headers of every committed record of ``topic``: a fresh consumer of its own (not
    the console's reader), assigned every partition and read to the end it saw at start."""
    c = Consumer({"bootstrap.servers": bs, "group.id": unique("check"),
                  "enable.auto.commit": False, "isolation.level": "read_committed",
                  "enable.partition.eof": True, "log_level": 0})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in parts}
        pending = {p for p, end in ends.items() if end > 0}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in pending])
        out: list[dict[str, bytes]] = []
        deadline = time.monotonic() + 60  # bounds a hang only
        while pending and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error() is not None:
                    if cast(KafkaError, m.error()).code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition())
                    continue
                # a consumed record's headers: a list of (name, bytes) pairs
                out.append({k: v or b"" for k, v in cast("list[tuple[str, bytes | None]]",
                                                         m.headers() or [])})
                if (m.offset() or 0) >= ends[m.partition() or 0] - 1:
                    pending.discard(m.partition())
        assert not pending, f"{topic}: partitions {pending} not read to their end"
        return out
    finally:
        c.close()


def _replays(stage: Stage) -> Counter[str]:
    """``kw-redrive-of`` of every replay in the source topic, read by a fresh consumer."""
    return Counter(h["kw-redrive-of"].decode() for h in read_back(stage.bs, stage.dead.topic)
                   if "kw-redrive-of" in h)


# --- pages ---------------------------------------------------------------------------------


def test_groups_pages(page: Page, url: str, stage: Stage) -> None:
    group = stage.dead.group
    page.goto(f"{url}/groups")
    row = page.locator("#groups tr", has_text=group)
    expect(row).to_contain_text(f"{group}.retry")
    shot(page, "groups")
    row.get_by_role("link", name=group).click()
    expect(page.locator("h1")).to_contain_text(group)
    parts = page.locator("#partitions tbody tr")
    expect(parts).to_have_count(3)
    for i in range(3):
        cells = parts.nth(i).locator("td")
        assert cells.nth(0).inner_text() == stage.dead.topic
        committed, latest, lag = (int(cells.nth(j).inner_text()) for j in (2, 3, 4))
        assert lag == latest - committed
    expect(page.locator("#keda-replicas")).to_have_text(
        str(min(3, -(-int(page.locator("#total-lag").inner_text().replace(",", "")) // 10))))
    tier = page.locator("#tiers tr", has_text=f"{stage.dead.topic}.retry.10m")
    expect(tier.locator("td").nth(2)).to_have_text("2")  # waiting, not due
    lag, waiting, due = (int(tier.locator("td").nth(j).inner_text()) for j in (1, 2, 3))
    assert due == lag - waiting  # (a partition never committed on counts 1, as in KEDA)
    expect(page.locator("#breaker")).to_contain_text("closed")
    # what each loop holds against its byte bound (issue #45): the tier's two records, waiting
    expect(page.locator("#in-flight")).to_contain_text("retry loop")
    expect(page.locator("#in-flight")).to_contain_text("of 64.0 MiB")
    members = page.locator("table.members").first
    expect(members).to_contain_text(stage.dead.topic)
    shot(page, "group")


def test_dead_letters_filter_and_record(page: Page, url: str, stage: Stage) -> None:
    dlq = stage.dead.dlq
    page.goto(f"{url}/dlq")
    page.get_by_role("link", name=dlq, exact=True).click()
    rows = page.locator("#dead-letters tbody tr")
    expect(rows).to_have_count(4)
    expect(page.locator("#scan-bound")).to_contain_text("scan bound per request")
    expect(page.locator("#scan-bound")).to_contain_text("It reached the end of the DLQ")
    shot(page, "dead-letters")

    page.fill("input[name=error_type]", "Malformed")
    page.click("#filters button[type=submit]")
    expect(rows).to_have_count(2)
    assert sorted(rows.nth(i).locator("td").nth(3).inner_text() for i in range(2)) == [
        "k0", "k6"]
    page.goto(f"{url}/dlq/{dlq}")
    page.fill("input[name=q]", "record 9 cannot")
    page.click("#filters button[type=submit]")
    expect(rows).to_have_count(1)
    expect(rows).to_contain_text("k9")
    origin = rows.locator("td").nth(2).inner_text().split("/")[1].split("@")[0]
    page.goto(f"{url}/dlq/{dlq}?origin_partition={origin}")
    assert all(rows.nth(i).locator("td").nth(2).inner_text().split("/")[1].startswith(
        f"{origin}@") for i in range(rows.count()))
    page.goto(f"{url}/dlq/{dlq}?since=2000-01-01T00:00&until=2000-01-02T00:00")
    expect(rows).to_have_count(1)
    expect(rows).to_contain_text("No record on this page matches")

    p3, o3 = _coordinates(stage, "k3")
    page.goto(f"{url}/dlq/{dlq}")
    page.get_by_role("link", name=f"{p3}@{o3}", exact=True).click()
    expect(page.locator("#error-type")).to_have_text("Expired")
    expect(page.locator("#error-message")).to_have_text("record 3 cannot be handled")
    expect(page.locator("#attempts")).to_have_text("1")
    expect(page.locator("#value-envelope")).to_contain_text("idempotency_key: wf-3/act-3")
    headers = page.locator("#headers")
    expect(headers.locator("tr", has_text="kafka_dlt-original-offset")).to_contain_text(
        "(binary int64)")
    expect(headers.locator("tr", has_text="kw-error-type")).to_contain_text("Expired")
    history = page.locator("#failure-history li")
    expect(history.first).to_contain_text(f"produced to {stage.dead.topic}/")
    expect(history.last).to_contain_text(f"dead-lettered to {dlq}/{p3}@{o3}")
    expect(page.locator("#trace-id")).to_be_visible()
    expect(page.locator("#value-hex")).to_be_attached()
    shot(page, "record")


def test_workflow_pages(page: Page, url: str) -> None:
    page.goto(f"{url}/workflows")
    expect(page.locator("#runs tbody tr")).to_have_count(3)
    expect(page.locator("#workflow-counts")).to_contain_text("failed")
    shot(page, "workflows")
    page.get_by_role("link", name="doc-2", exact=True).click()
    expect(page.locator("#run-status")).to_have_text("failed")
    expect(page.locator("#steps tbody tr")).to_have_count(2)
    expect(page.locator("#run-error")).to_contain_text("Expired: model gone")
    shot(page, "workflow-run")


def test_paging_a_large_dlq(page: Page, stage: Stage) -> None:
    """60 dead letters, at most 40 read per request and 15 shown per page: following "next
    page" shows each exactly once, every page stating its bound."""
    with console("-b", stage.bs, "--scan-bound", "40", "--page-size", "15") as u:
        page.goto(f"{u}/dlq/{stage.big_dlq}")
        seen: list[str] = []
        for _ in range(50):
            scan = page.locator("#scan-bound").inner_text()
            assert "20 per partition × 2 partitions = 40" in scan
            read = int(scan.split("This page read ")[1].split()[0])
            assert 0 < read <= 40
            cells = page.locator("#dead-letters tbody tr td:nth-child(4)")
            seen += cells.all_inner_texts()
            if page.locator("#next-page").count() == 0:
                break
            page.click("#next-page")
        assert sorted(seen) == sorted(f"b{i}" for i in range(stage.big))
        assert len(seen) == len(set(seen)) == stage.big
        # a filter pages the same way: each Timeout exactly once
        page.goto(f"{u}/dlq/{stage.big_dlq}?error_type=Timeout")
        timeouts: list[str] = []
        for _ in range(50):
            timeouts += page.locator("#dead-letters tbody tr td:nth-child(4)").all_inner_texts()
            if page.locator("#next-page").count() == 0:
                break
            page.click("#next-page")
        assert sorted(timeouts) == sorted(f"b{i}" for i in range(0, stage.big, 3))
        # b4 is the third record of DLQ partition 0; its trace id is i + 1 = 5
        page.goto(f"{u}/dlq/{stage.big_dlq}/record/0/2")
        expect(page.locator("#trace-id")).to_have_text(f"{5:032x}")
        expect(page.locator("#value-text")).to_have_text("value 4")


def test_redrive_a_selection_exactly_once(browser: Browser, page: Page, url: str,
                                          stage: Stage) -> None:
    """Select k0 and k9, plan, confirm; the same plan confirmed again from a second tab
    replays nothing: the source topic holds each replay once."""
    dlq = stage.dead.dlq
    chosen = {f"{dlq}/{p}/{o}" for p, o in (_coordinates(stage, "k0"), _coordinates(stage, "k9"))}
    before = _replays(stage)
    assert not set(before) & chosen
    page.goto(f"{url}/dlq/{dlq}")
    for key in ("k0", "k9"):
        page.locator("#dead-letters tbody tr", has_text=key).locator(
            "input[type=checkbox]").check()
    page.click("#plan-selected")
    expect(page.locator("#plan-selected")).to_have_text("2")
    expect(page.locator("#plan-pending")).to_have_text("2")
    expect(page.locator("#plan-rows tbody tr")).to_have_count(2)
    shot(page, "redrive-plan")
    second = page.context.new_page()  # the same plan, open in a second tab
    second.goto(page.url)
    expect(second.locator("#confirm")).to_be_enabled()

    page.click("#confirm")
    expect(page.locator("#job-state")).to_have_text("done", timeout=60_000)
    expect(page.locator("#job-summary")).to_have_text(
        "redriven=2 skipped_already=0 selected=2")
    shot(page, "redrive-done")
    second.click("#confirm")
    expect(second.locator("#job-state")).to_have_text("done", timeout=60_000)
    expect(second.locator("#job-summary")).to_have_text(
        "redriven=0 skipped_already=2 selected=2")

    after = _replays(stage)
    assert {k: after[k] - before[k] for k in chosen} == dict.fromkeys(chosen, 1)
    assert after - before == Counter(dict.fromkeys(chosen, 1))  # and nothing else replayed

    # the DLQ table marks the two as redriven (from the ledger), and only them
    page.goto(f"{url}/dlq/{dlq}")
    for key in ("k0", "k9"):
        expect(page.locator("#dead-letters tbody tr", has_text=key).locator(
            "td.redriven")).to_contain_text(f" to {stage.dead.topic}")
    marks = page.locator("#dead-letters tbody tr td.redriven").all_inner_texts()
    assert sorted(m == "no" for m in marks).count(False) == 2, marks

    # a fresh plan of the same selection has nothing left to do
    sel = "&".join(f"sel={p}:{o}" for p, o in (_coordinates(stage, "k0"),
                                               _coordinates(stage, "k9")))
    page.goto(f"{url}/dlq/{dlq}/plan?{sel}")
    expect(page.locator("#nothing-to-do")).to_contain_text("replayed already")
    page.goto(f"{url}/dlq/{dlq}/history")
    ledger = page.locator("#ledger tbody tr")
    expect(ledger).to_have_count(2)
    expect(page.locator("#jobs tbody tr")).to_have_count(2)
    shot(page, "redrive-history")
    second.close()


def test_canary_the_exactly_once_count_sees_a_duplicate(stage: Stage) -> None:
    """The count the redrive test relies on, fed a replay produced twice by hand."""
    topic = make_topic(stage.bs, unique("dup"), 1)
    mark: list[tuple[str, str | bytes | None]] = [("kw-redrive-of", b"x.dlq/0/1")]
    producer = Producer({"bootstrap.servers": stage.bs})
    for _ in range(2):
        producer.produce(topic, key=b"k", value=b"v", headers=mark)
    assert producer.flush(30) == 0
    seen = Counter(h["kw-redrive-of"].decode() for h in read_back(stage.bs, topic)
                   if "kw-redrive-of" in h)
    assert seen == Counter({"x.dlq/0/1": 2})  # read back: both copies, so != 1 is caught
    assert seen != Counter(dict.fromkeys(["x.dlq/0/1"], 1))


def test_read_only_refuses_a_redrive(page: Page, stage: Stage) -> None:
    dlq = stage.dead.dlq
    p, o = _coordinates(stage, "k6")
    before = _replays(stage)
    with console("-b", stage.bs, "--read-only") as u:
        page.goto(f"{u}/dlq/{dlq}/plan?sel={p}:{o}")
        expect(page.locator("#read-only-badge")).to_be_visible()
        expect(page.locator("#read-only-note")).to_be_visible()
        expect(page.locator("#confirm")).to_be_disabled()
        shot(page, "read-only-plan")
        page.locator("#confirm").evaluate("b => { b.disabled = false }")
        page.click("#confirm")
        expect(page.locator("#error")).to_contain_text("Read-only console")
        expect(page.locator("#error-message")).to_contain_text("Nothing was replayed")
    assert f"{dlq}/{p}/{o}" not in _replays(stage)
    assert _replays(stage) == before


class _Attacker(http.server.BaseHTTPRequestHandler):
    form = ""

    def do_GET(self) -> None:
        body = self.form.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


def test_a_form_from_another_site_is_refused(page: Page, url: str, stage: Stage) -> None:
    """The operator has the console open; a page on another origin posts a redrive to it
    (the browser sends the console's cookie: same host, other port = same site)."""
    dlq = stage.dead.dlq
    p, o = _coordinates(stage, "k6")
    fields = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in (
        ("sel", f"{p}:{o}"), ("upto", f"{p}:{o + 1}"), ("csrf_token", "0" * 64)))
    _Attacker.form = (f'<html><body><form method="post" action="{url}/dlq/{dlq}/redrive">'
                      f'{fields}<button id="prize">Claim your prize</button></form></body></html>')
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Attacker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page.goto(f"{url}/dlq/{dlq}")  # has the session cookie now
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        page.click("#prize")
        expect(page.locator("#error")).to_contain_text("CSRF check failed")
        expect(page.locator("#error-message")).to_contain_text("came from another site")
        shot(page, "csrf-refused")
    finally:
        server.shutdown()
        server.server_close()
    assert f"{dlq}/{p}/{o}" not in _replays(stage)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_error_pages(page: Page, url: str, stage: Stage) -> None:
    r = page.goto(f"{url}/dlq/no-such-topic.dlq")
    assert r is not None and r.status == 404
    expect(page.locator("#error-message")).to_contain_text(
        "topic 'no-such-topic.dlq' does not exist")
    r = page.goto(f"{url}/dlq/{stage.dead.dlq}/record/0/999999")
    assert r is not None and r.status == 400
    expect(page.locator("#error-message")).to_contain_text("no record at")
    with console("-b", f"127.0.0.1:{_closed_port()}", "--connect-timeout", "1") as down:
        r = page.goto(f"{down}/groups")
        assert r is not None and r.status == 503
        expect(page.locator("#error")).to_contain_text("Kafka is unreachable")
        expect(page.locator("#error-message")).to_contain_text("cannot reach Kafka at 127.0.0.1:")
        shot(page, "broker-unreachable")


def test_token_required_off_loopback(browser: Browser, stage: Stage) -> None:
    """Bound to a veth address of a namespace this test makes: no token, no start; with one,
    the browser gets 401 until it signs in with the token as the password."""
    why = netns_available()
    if why is not None or shutil.which("ip") is None:
        pytest.skip(f"no network namespace here: {why}")
    with NetnsLink() as link:
        refused = cli("console", "-b", stage.bs, "--host", link.host_ip, "--port", "0",
                      timeout=60, env={"KWORKERS_CONSOLE_TOKEN": ""})
        assert refused.returncode == 2
        assert "set a token" in refused.stderr and "Traceback" not in refused.stderr
        with console("-b", stage.bs, "--host", link.host_ip,
                     env={"KWORKERS_CONSOLE_TOKEN": TOKEN}) as u:
            assert u.startswith(f"http://{link.host_ip}:")
            port = int(u.rsplit(":", 1)[1])
            with pytest.raises(ConnectionRefusedError):  # not on loopback at all
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
            for creds in (None, {"username": "ops", "password": "not-the-token-at-all"}):
                ctx = browser.new_context(http_credentials=creds)  # type: ignore[arg-type]
                try:  # the browser shows the 401, or gives up on the credentials it has
                    status = ctx.new_page().goto(f"{u}/groups").status  # type: ignore[union-attr]
                except PlaywrightError as exc:
                    assert "ERR_INVALID_AUTH_CREDENTIALS" in str(exc)
                    status = 401
                assert status == 401
                r: APIResponse | Response | None  # an API response here, a page's below
                r = ctx.request.get(f"{u}/groups")
                assert r.status == 401 and "Token required" in r.text()
                assert r.headers["www-authenticate"].startswith("Basic")
                ctx.close()
            ops = browser.new_context(http_credentials={"username": "ops", "password": TOKEN})
            pg = ops.new_page()
            r = pg.goto(f"{u}/groups")
            assert r is not None and r.status == 200
            expect(pg.locator("#groups")).to_contain_text(stage.dead.group)
            assert TOKEN not in pg.content()
            ops.close()

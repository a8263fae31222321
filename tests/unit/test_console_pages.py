"""The console without a broker: paging never skips a record, record views, breaker metrics,
and the guard every request passes (token, loopback Host, CSRF, read-only, error pages)."""

from __future__ import annotations

import base64
import json
import re
import struct
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kworkers.console import auth
from kworkers.console.breaker import InFlight, in_flight_of, read_endpoints, states_of
from kworkers.console.dlq_filter import ConsoleFilter
from kworkers.console.dlq_pages import Row, cursor_text, cut, parse_cursor
from kworkers.console.record_view import decode_avro, hex_dump, record_view
from kworkers.console.settings import ConsoleSettings
from kworkers.dlq.ledger import parse_marker
from kworkers.dlq.record import DeadLetter
from kworkers.errors import ConfigError
from kworkers.kafka.settings import ClientSettings
from kworkers.message import Message
from kworkers.retry_tiers.headers import dead_letter_headers
from kworkers.retry_tiers.routing import DeadLetterDecision

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

    from kworkers.console.app import create_app

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# --- paging ------------------------------------------------------------------------------

Log = dict[int, list[Message]]  # partition -> records in offset order (gaps allowed)
Cut = Callable[..., tuple[list[Row], dict[int, int]]]


def _fake_scan(log: Log, start: Mapping[int, int], limit: int
               ) -> tuple[list[Message], dict[int, int], set[int]]:
    """What ``kworkers.kafka.reader.scan`` returns for ``log`` (ends = last offset + 1)."""
    read: list[Message] = []
    ends: dict[int, int] = {}
    truncated: set[int] = set()
    for p, s in start.items():
        records = log[p]
        ends[p] = records[-1].offset + 1 if records else 0
        got = [m for m in records if m.offset >= s]
        if len(got) > limit:
            got = got[:limit]
            if got[-1].offset < ends[p] - 1:
                truncated.add(p)
        read += got
    return read, ends, truncated


def _walk(log: Log, flt: ConsoleFilter, page_size: int, per_partition: int,
          cutter: Cut = cut) -> list[tuple[int, int]]:
    """Every row a reader following "next page" sees, in order."""
    cursor = dict.fromkeys(log, 0)
    seen: list[tuple[int, int]] = []
    for _ in range(10_000):
        read, ends, truncated = _fake_scan(log, cursor, per_partition)
        rows, nxt = cutter(read, cursor, ends, truncated, flt, page_size)
        seen += [(r.message.partition, r.message.offset) for r in rows]
        if all(nxt[p] >= ends[p] for p in nxt):
            return seen
        assert nxt != cursor or rows, "a page that neither shows nor advances: no progress"
        cursor = nxt
    raise AssertionError("paging did not end")


logs = st.dictionaries(
    st.integers(0, 3),
    st.lists(st.tuples(st.integers(1, 3), st.booleans()), max_size=40),
    min_size=1, max_size=4)


def _build(spec: dict[int, list[tuple[int, bool]]]) -> Log:
    log: Log = {}
    for p, entries in spec.items():
        offset, records = 0, []
        for gap, hit in entries:
            offset += gap  # compaction, transaction markers: offsets have holes
            records.append(Message("t.dlq", p, offset, b"k", b"needle" if hit else b"hay"))
        log[p] = records
    return log


def _check(seen: list[tuple[int, int]], want: list[tuple[int, int]]) -> None:
    """Every match exactly once, each partition in offset order (partitions interleave:
    a page shows what its bounded read found, partition by partition)."""
    assert sorted(seen) == sorted(want)
    assert len(seen) == len(set(seen))
    for p in {p for p, _ in want}:
        mine = [o for q, o in seen if q == p]
        assert mine == sorted(mine)


@settings(max_examples=200, deadline=None)
@given(logs, st.integers(1, 7), st.integers(1, 9), st.booleans())
def test_paging_shows_every_match_once(spec: dict[int, list[tuple[int, bool]]],
                                       page_size: int, per_partition: int,
                                       filtered: bool) -> None:
    log = _build(spec)
    flt = ConsoleFilter(text="needle") if filtered else ConsoleFilter()
    want = [(m.partition, m.offset) for p in sorted(log) for m in log[p]
            if not filtered or m.value == b"needle"]
    _check(_walk(log, flt, page_size, per_partition), want)


def _skipping_cut(read: Sequence[Message], start: Mapping[int, int], ends: Mapping[int, int],
                  truncated: set[int], flt: ConsoleFilter, page_size: int
                  ) -> tuple[list[Row], dict[int, int]]:
    """A broken cut: moves past everything read, forgetting the matches it did not show."""
    rows, _ = cut(read, start, ends, truncated, flt, page_size)
    nxt = {p: (max((m.offset for m in read if m.partition == p), default=s - 1) + 1
               if p in truncated else ends[p]) for p, s in start.items()}
    return list(rows), nxt


def test_canary_the_paging_check_sees_a_skipped_record() -> None:
    log = _build({0: [(1, True)] * 5, 1: [(1, True)] * 3})
    want = [(m.partition, m.offset) for p in sorted(log) for m in log[p]]
    _check(_walk(log, ConsoleFilter(), 2, 4), want)
    with pytest.raises(AssertionError):
        _check(_walk(log, ConsoleFilter(), 2, 4, _skipping_cut), want)


def test_cursor_round_trip_and_bad_cursors() -> None:
    assert parse_cursor(cursor_text({0: 12, 2: 0, 1: 5}), 3) == {0: 12, 1: 5, 2: 0}
    for bad in ("", "0-1.", "a-1", "0:1", "0-1.1-x"):
        with pytest.raises(ConfigError, match="page cursor"):
            parse_cursor(bad, 3)
    with pytest.raises(ConfigError, match=r"partitions 0..1, not \[5\]"):
        parse_cursor("0-1.5-0", 2)


# --- one record ----------------------------------------------------------------------------


def _dead_message(value: bytes, extra: tuple[tuple[str, bytes], ...] = ()) -> Message:
    src = Message("orders", 2, 41, b"k1", value,
                  (("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
                   *extra), 1_700_000_000_000)
    hs = dead_letter_headers(src, "g1", DeadLetterDecision(3, "exhausted", "Timeout",
                                                           "upstream timed out"), 1_700_000_100.0)
    return Message("orders.dlq", 0, 7, b"k1", value, hs)


def test_record_view_shows_everything_the_headers_prove() -> None:
    msg = _dead_message(b"plain text value", (("kw-redrive-of", b"orders.dlq/1/3"),))
    view = record_view(msg, DeadLetter.from_message(msg), None)
    assert view.text == "plain text value"
    assert view.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    shown = {h.name: (h.shown, h.kind) for h in view.headers}
    assert shown["kafka_dlt-original-offset"] == ("41 (binary int64)", "spring")
    assert shown["kafka_dlt-original-partition"] == ("2 (binary int32)", "spring")
    assert shown["kw-error-type"] == ("Timeout", "kworkers")
    assert shown["kw-dead-lettered-at"][0] == "1700000100000 (2023-11-14T22:15:00.000Z)"
    assert shown["traceparent"][1] == "user"
    what = [e.what for e in view.history]
    assert what[0].startswith("a replay of dead letter orders.dlq/1/3")
    assert view.history[0].link == ("orders.dlq", 1, 3)
    assert "produced to orders/2@41" in what[1]
    assert view.history[1].at == 1_700_000_000.0
    assert what[-2].startswith("last failure (attempt 3): Timeout: upstream timed out")
    assert "dead-lettered to orders.dlq/0@7 (exhausted) by group g1" in what[-1]
    replayed = record_view(msg, DeadLetter.from_message(msg), None, replayed=(5.0, "orders/2"))
    assert replayed.history[-1].what == "replayed by a redrive to orders/2"


def test_record_values_as_hex_and_avro() -> None:
    import io

    from fastavro import parse_schema, schemaless_writer

    schema = parse_schema({"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"}, {"name": "note", "type": "string"}]})
    buf = io.BytesIO()
    schemaless_writer(buf, schema, {"id": 42, "note": "ünïcode"})
    bare = buf.getvalue()
    for framed in (bare, b"\x00" + struct.pack(">i", 7) + bare,
                   b"\xc3\x01" + b"\x11" * 8 + bare):
        assert decode_avro(framed, schema) == {"id": 42, "note": "ünïcode"}
        view = record_view(_dead_message(framed), None, "not checked", schema)
        assert view.avro is not None and json.loads(view.avro) == {"id": 42, "note": "ünïcode"}
    bad = record_view(_dead_message(b"\xff\xfe\xfd"), None, "x", schema)
    assert bad.avro is None and bad.avro_problem
    assert bad.text is None  # not printable UTF-8: shown as hex only
    lines, cut_ = hex_dump(bytes(range(40)), limit=32)
    assert cut_ and len(lines) == 2 and lines[0].startswith("00000000  00 01 02")


def test_ledger_markers_parse_or_say_why() -> None:
    ok = parse_marker(Message("d.redriven", 0, 9, b"d.dlq/2/17", json.dumps(
        {"target": "d", "partition": 2, "at_ms": 1_700_000_000_000,
         "original": "d/2/5"}).encode()))
    assert (ok.dlq_partition, ok.dlq_offset, ok.target, ok.target_partition, ok.at) == (
        2, 17, "d", 2, 1_700_000_000.0)
    bad = parse_marker(Message("d.redriven", 0, 10, b"junk", b"{not json"))
    assert bad.problem and bad.dlq_partition is None


# --- breaker ---------------------------------------------------------------------------------

EXPOSITION = """# HELP kworkers_breaker_state Circuit breaker: 0 closed, 1 half-open, 2 open
# TYPE kworkers_breaker_state gauge
kworkers_breaker_state{group="orders"} 2.0
kworkers_breaker_state{group="billing"} 0.0
kworkers_breaker_state{group="odd"} 7.0
# TYPE kworkers_processed_total counter
kworkers_processed_total{group="orders"} 5.0
"""


def test_breaker_states_from_an_exposition() -> None:
    assert states_of(EXPOSITION) == {"orders": "open", "billing": "closed", "odd": "unknown (7)"}
    assert states_of("") == {}

    def get(url: str) -> str:
        if "down" in url:
            raise OSError("connection refused")
        return EXPOSITION

    up, down = read_endpoints(["http://w1/metrics", "http://down/metrics"], get)
    assert up.states["orders"] == "open" and up.problem is None
    assert down.states == {} and "connection refused" in (down.problem or "")


IN_FLIGHT = """# TYPE kworkers_in_flight_bytes gauge
kworkers_in_flight_bytes{group="orders"} 1.2582912e+07
kworkers_in_flight_bytes{group="orders.retry"} 512.0
# TYPE kworkers_in_flight_bytes_bound gauge
kworkers_in_flight_bytes_bound{group="orders"} 6.7108864e+07
kworkers_in_flight_bytes_bound{group="orders.retry"} 6.7108864e+07
"""


def test_what_each_loop_holds_in_memory_from_an_exposition() -> None:
    """Issue #45's console line: a loop's bytes in flight against its bound, per endpoint,
    read from the same /metrics as the breaker (a pool's processes summed)."""
    got = in_flight_of(IN_FLIGHT)
    assert got["orders"] == InFlight(12 * 2**20, 64 * 2**20)
    assert got["orders"].describe() == "12.0 MiB of 64.0 MiB (19%)"
    assert got["orders.retry"].describe() == "512 B of 64.0 MiB (0%)"
    pool = IN_FLIGHT + 'kworkers_in_flight_bytes{group="orders",pid="2"} 1048576.0\n'
    assert in_flight_of(pool)["orders"].held == 13 * 2**20
    assert InFlight(100.0).describe() == "100 B"  # a worker from before the bound's gauge
    (up,) = read_endpoints(["http://w1/metrics"], lambda _u: EXPOSITION + IN_FLIGHT)
    assert up.states["orders"] == "open" and up.in_flight["orders.retry"].held == 512


# --- the guard --------------------------------------------------------------------------------

TOKEN = "console-token-0123456789"
SECRET = b"s" * 32


def _client(base: str = "http://127.0.0.1:8080", **kw: object) -> TestClient:
    props = {"sasl.username": "ops", "sasl.password": "hunter2-very-secret"}
    s = ConsoleSettings(ClientSettings.of("127.0.0.1:1", props), connect_timeout=0.5,
                        **kw)  # type: ignore[arg-type]
    return TestClient(create_app(s, secret=SECRET), base_url=base)


@pytest.fixture
def loopback() -> Iterator[TestClient]:
    with _client() as c:
        yield c


def _error(r: object) -> str:
    m = re.search(r'id="error-message">([^<]*)<', r.text)  # type: ignore[attr-defined]
    assert m, r.text  # type: ignore[attr-defined]
    return m.group(1)


def test_an_unreachable_broker_is_a_503_page_without_secrets(loopback: TestClient) -> None:
    for path in ("/groups", "/dlq", "/dlq/orders.dlq", "/groups/g1"):
        r = loopback.get(path)
        assert r.status_code == 503, path
        assert "cannot reach Kafka at 127.0.0.1:1" in _error(r)
        assert "hunter2" not in r.text
        assert "sasl.password=****" in r.text
        assert "script" not in r.headers["content-security-policy"]
        assert r.headers["x-frame-options"] == "DENY"


def test_a_page_without_a_token_answers_only_loopback_hosts() -> None:
    with _client("http://evil.example:8080") as c:
        r = c.get("/groups")
        assert r.status_code == 403 and "answers only requests addressed to" in _error(r)


def test_a_token_is_required_when_set() -> None:
    with _client("http://10.213.0.1:8080", host="0.0.0.0", token=TOKEN) as c:
        r = c.get("/dlq/x.dlq/history")
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Basic realm=")
        assert c.get("/groups", headers={"Authorization": "Bearer wrong-token-xxxxxxxx"}
                     ).status_code == 401
        basic = base64.b64encode(f"ops:{TOKEN}".encode()).decode()
        for header in (f"Bearer {TOKEN}", f"Basic {basic}"):
            # past the guard: the page then reports the broker (absent here), not a 401
            assert c.get("/groups", headers={"Authorization": header}).status_code == 503
        assert TOKEN not in c.get("/groups", headers={"Authorization": f"Bearer {TOKEN}"}).text


def _csrf(c: TestClient) -> str:
    c.get("/static/console.css")
    session = c.cookies.get(auth.SESSION_COOKIE)
    assert session
    return auth.csrf_token(SECRET, session)


def test_a_redrive_without_the_csrf_token_is_refused(loopback: TestClient) -> None:
    form = {"sel": "0:1", "upto": "0:2"}
    r = loopback.post("/dlq/orders.dlq/redrive", data=form)
    assert r.status_code == 403 and "no CSRF token" in _error(r)
    r = loopback.post("/dlq/orders.dlq/redrive", data={**form, "csrf_token": "0" * 64})
    assert r.status_code == 403 and "does not match" in _error(r)
    token = _csrf(loopback)
    r = loopback.post("/dlq/orders.dlq/redrive", data={**form, "csrf_token": token},
                      headers={"Origin": "http://127.0.0.1:9999"})
    assert r.status_code == 403 and "another site" in _error(r)
    # canary: the same form with the token passes the check and goes on to the broker
    r = loopback.post("/dlq/orders.dlq/redrive", data={**form, "csrf_token": token},
                      headers={"Origin": "http://127.0.0.1:8080"})
    assert r.status_code == 503


def test_read_only_refuses_a_redrive_that_passes_csrf() -> None:
    with _client(read_only=True) as c:
        r = c.post("/dlq/orders.dlq/redrive",
                   data={"sel": "0:1", "upto": "0:2", "csrf_token": _csrf(c)})
        assert r.status_code == 403 and "read-only" in _error(r)


def test_a_redrive_needs_its_plan(loopback: TestClient) -> None:
    r = loopback.post("/dlq/orders.dlq/redrive", data={"sel": "0:1",
                                                       "csrf_token": _csrf(loopback)})
    assert r.status_code == 400 and "confirmed from its dry-run plan" in _error(r)


def test_only_get_and_post(loopback: TestClient) -> None:
    assert loopback.delete("/groups").status_code == 405
    assert loopback.get("/nowhere").status_code == 404


# --- groups and jobs, pure parts -----------------------------------------------------------


def test_groups_pair_with_their_retry_group() -> None:
    from kworkers.console.groups import pair_groups

    assert pair_groups(["b", "a.retry", "a", "orphan.retry"]) == [
        ("a", "a.retry"), ("b", None), ("orphan.retry", None)]


def test_tier_backlogs_and_keda_from_the_lag_rows() -> None:
    from kworkers.console.groups import scale_of, tier_backlogs
    from kworkers.lag import group_lag

    retry = group_lag("g.retry", [("t.retry.1s", 0, 10, 4), ("t.retry.1s", 1, 5, 5),
                                  ("t.retry.1m", 0, 3, 0)],
                      waiting={("t.retry.1s", 0): (2, False), ("t.retry.1m", 0): (3, True)})
    assert [(b.topic, b.lag, b.waiting, b.due, b.truncated) for b in tier_backlogs(retry)] == [
        ("t.retry.1s", 6, 2, 4, False), ("t.retry.1m", 3, 3, 0, True)]  # by delay
    main = group_lag("g", [("t", 0, 100, 40), ("t", 1, 100, 100), ("t", 2, 5, None)])
    s = ConsoleSettings(ClientSettings(), lag_threshold=20)
    scale = scale_of(s, main, current=1)
    # 60 + 0 + 5 (no commit, offsetResetPolicy earliest, as rendered: the whole partition)
    # = 65 -> ceil(65 / 20) = 4, capped at 3
    assert (scale.decision.lag, scale.decision.replicas, scale.max_replicas) == (65, 3, 3)
    assert scale_of(ConsoleSettings(ClientSettings(), lag_threshold=20, max_replicas=2), main,
                    1).decision.replicas == 2
    # the default is the rendered ScaledObject's threshold (100): 65 behind is one replica
    assert scale_of(ConsoleSettings(ClientSettings()), main, 1).decision.replicas == 1


def test_a_second_redrive_of_one_dlq_waits_and_failures_are_redacted() -> None:
    import threading

    from kworkers.console.jobs import Busy, Jobs
    from kworkers.dlq.redrive import RedriveSummary

    release = threading.Event()

    def slow(progress: Callable[[int, int], None]) -> RedriveSummary:
        progress(0, 2)
        release.wait(30)
        return RedriveSummary("d.dlq", 2, 2, 0, 0, False)

    def broken(progress: Callable[[int, int], None]) -> RedriveSummary:
        raise RuntimeError("auth failed for password hunter2")

    jobs = Jobs()
    first = jobs.start("d.dlq", "all", slow, str)
    with pytest.raises(Busy, match="already running"):
        jobs.start("d.dlq", "again", slow, str)
    other = jobs.start("e.dlq", "x", broken, lambda t: t.replace("hunter2", "****"))
    release.set()
    deadline = time.monotonic() + 30  # bounds a hang only
    while time.monotonic() < deadline and any(
            j.state == "running" for j in jobs.recent()):
        time.sleep(0.01)
    done, failed = jobs.get(first.id), jobs.get(other.id)
    assert done is not None and done.state == "done" and done.done == 2
    assert failed is not None and failed.state == "failed"
    assert failed.error == "RuntimeError: auth failed for password ****"

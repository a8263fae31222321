"""A schema registry that accepts a connection and never answers (issue #46, bug 1).

confluent-kafka's registry client has no timeout unless told one, so before kworkers bounded a
decode itself such a registry kept the record's runner waiting for ever: the partition was
taken for a stall ("nothing running and nothing holding it") and the worker exited after three
stall bounds, into the same hang. Now:

- through the front door, with confluent-kafka's own ``AvroDeserializer`` on a client given no
  timeout: each try ends at the bound (the registry sees a second connection), the partition
  waits for the registry (the waiting gauge, ``/readyz`` naming the registry, one log line per
  outage and one per recovery, the HTTP client's per-request lines not at INFO), nothing is
  committed past the waiting record, the worker stays healthy, and once the registry answers
  every record is handled once;
- a try still unanswered past the bound (a deserializer kworkers cannot bound) holds its
  partition for the registry; its canary, the decoder with the bound taken off (the code
  before the fix), leaves the partition unexplained and is caught.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from fastavro import parse_schema, schemaless_writer

from kworkers import Message, Worker
from kworkers.consumer.ports import TP
from kworkers.kafka.serialization import context
from kworkers.payloads.decode import DecodeBackoff, RecordDecoder
from tests.unit.test_batch_handlers import _final, _run
from tests.unit.test_loop_with_fake_consumer import ScriptedConsumer
from tests.unit.test_payload_decode import Sender

SCHEMA = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]}


def avro(value: dict[str, Any], schema_id: int = 1) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(SCHEMA), value)
    return b"\x00" + schema_id.to_bytes(4, "big") + buf.getvalue()


class HangingRegistry:
    """A socket that accepts every connection and never answers, until ``answer()``: then a
    schema registry that knows schema id 1 (404 for anything else)."""

    def __init__(self) -> None:
        self._srv = socket.socket()
        self._srv.bind(("127.0.0.1", 0))
        self._srv.listen(64)
        self.url = f"http://127.0.0.1:{self._srv.getsockname()[1]}"
        self._answer = threading.Event()
        self._lock = threading.Lock()
        self.held: list[socket.socket] = []
        self.answered = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def accepted(self) -> int:
        with self._lock:
            return len(self.held)

    def answer(self) -> None:
        self._answer.set()
        with self._lock:
            for c in self.held:  # those still waiting learn the connection is gone
                c.close()

    def close(self) -> None:
        self.answer()
        self._srv.close()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self._srv.accept()
            except OSError:
                return
            if not self._answer.is_set():
                with self._lock:
                    self.held.append(c)
                continue
            threading.Thread(target=self._reply, args=(c,), daemon=True).start()

    def _reply(self, c: socket.socket) -> None:
        with c:
            try:
                while True:
                    head = c.recv(65536)
                    if not head:
                        return
                    path = head.split(b" ", 2)[1].decode()
                    body: dict[str, object]
                    if path.startswith("/schemas/ids/1"):
                        status, body = b"200 OK", {"schema": json.dumps(SCHEMA)}
                    else:
                        status, body = b"404 Not Found", {"error_code": 40401,
                                                          "message": "not found"}
                    data = json.dumps(body).encode()
                    c.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json"
                              b"\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
                    with self._lock:
                        self.answered += 1
            except OSError:
                return


@pytest.fixture
def registry() -> Any:
    r = HangingRegistry()
    yield r
    r.close()


def _gauge(w: Worker) -> float | None:
    return w.metrics.registry.get_sample_value("kworkers_payload_waiting_partitions",
                                               {"group": "g"})


def test_a_registry_that_accepts_and_never_answers_holds_the_partition(
        registry: HangingRegistry, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    # the user's client as a new user writes it: no timeout, confluent-kafka's defaults
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry.url,
                                                          "max.retries": 0}))
    values = [avro({"id": f"o{i}"}) for i in range(3)]
    consumer = ScriptedConsumer([Message("t", 0, i, b"k%d" % i, v)
                                 for i, v in enumerate(values)], [])
    idle = ScriptedConsumer([], [], "g.retry")
    idle.go.set()
    w = Worker(topics=["t"], group_id="g", concurrency=2, sender=Sender(),
               consumer=lambda g: consumer if g == "g" else idle,
               value_deserializer=deserializer,
               decode_backoff=DecodeBackoff(0.05, 0.2, timeout=0.3))
    assert _gauge(w) == 0  # the gauge is there before any outage
    seen: list[Any] = []

    @w.handler
    def handle(msg: Message) -> None:
        seen.append(msg.value)

    during: dict[str, Any] = {}

    def held_then_answered() -> bool:
        if not during:
            # each try ended at the bound: the registry saw the next one come
            if registry.accepted() < 3 or _gauge(w) != 1 or w.unready_reason is None:
                return False
            during.update(reason=w.unready_reason, healthy=w.fault is None,
                          committed=dict(_final(consumer)), seen=list(seen))
            registry.answer()
        return _final(consumer).get(("t", 0)) == 3

    _run(w, consumer, held_then_answered)
    assert during, "the partition never waited for the registry"
    assert during["reason"].startswith("schema registry: records of 1 partition(s) wait for "
                                       "it: "), during["reason"]
    assert during["healthy"] and w.fault is None  # the worker stayed up
    assert during["committed"].get(("t", 0), 0) == 0 and during["seen"] == []
    assert seen == [{"id": f"o{i}"} for i in range(3)]  # each once, after the registry came back
    assert w.unready_reason is None and _gauge(w) == 0
    lines = [r.getMessage() for r in caplog.records]
    assert sum("records wait for the schema registry" in m for m in lines) == 1, lines
    assert sum("schema registry answers again" in m for m in lines) == 1, lines
    assert registry.answered >= 1
    assert not [r for r in caplog.records
                if r.getMessage().startswith("HTTP Request:") and r.levelno >= logging.INFO]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Unbounded(RecordDecoder):
    """The canary: the decoder as it was before the fix, nothing bounding a try."""

    def _bound(self, fn: Any) -> None:
        pass

    def _begin(self, tp: TP) -> int:
        return -1


def _unanswered_try_is_a_registry_hold(make: Callable[..., RecordDecoder],
                                       registry: HangingRegistry) -> None:
    """The check: once the registry holds the first try's connection and the decoder's clock
    is past the bound, the partition waits for the registry and readiness is told why."""
    clock, told = FakeClock(), cast("list[str | None]", [])
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry.url,
                                                          "max.retries": 0}))
    # a bound the real time of this test never reaches: only the decoder's clock passes it
    d = make(deserializer, context=context, backoff=DecodeBackoff(0.05, 0.1, timeout=60),
             clock=clock, on_outage=told.append)
    halted = threading.Event()
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(
        d.decode(Message("t", 3, 0, None, avro({"id": "x"})), halted.is_set)), daemon=True)
    t.start()
    try:
        while registry.accepted() < 1:  # a sync point: the try is under way and unanswered
            time.sleep(0.01)
        assert d.waiting() == set()  # not yet past the bound
        clock.now += 61
        assert d.waiting() == {("t", 3)}, "an unanswered try left its partition unexplained"
        assert told and told[-1] is not None and "no answer within 60s" in told[-1]
    finally:
        halted.set()
        registry.answer()
        t.join(30)
    assert not t.is_alive()


@pytest.mark.parametrize("canary", [False, True], ids=["decoder", "canary"])
def test_a_try_unanswered_past_the_bound_is_a_registry_hold(
        registry: HangingRegistry, canary: bool) -> None:
    if not canary:
        _unanswered_try_is_a_registry_hold(RecordDecoder, registry)
        return
    with pytest.raises(AssertionError, match="unexplained"):
        _unanswered_try_is_a_registry_hold(_Unbounded, registry)


def test_a_client_timeout_the_user_chose_is_kept_and_none_gets_the_bound() -> None:
    none = AvroDeserializer(SchemaRegistryClient({"url": "http://127.0.0.1:9"}))
    chosen = AvroDeserializer(SchemaRegistryClient({"url": "http://127.0.0.1:9",
                                                    "timeout": 42}))
    RecordDecoder(none, context=context, backoff=DecodeBackoff(timeout=7))
    RecordDecoder(chosen, context=context, backoff=DecodeBackoff(timeout=7))
    assert none._registry._rest_client.session.timeout.read == 7
    assert chosen._registry._rest_client.session.timeout.read == 42


def test_the_http_clients_request_lines_are_debug(caplog: pytest.LogCaptureFixture) -> None:
    RecordDecoder(lambda d, c: d, context=context)  # installs the filter
    for name in ("httpx", "httpx2"):
        logger = logging.getLogger(name)
        caplog.clear()
        caplog.set_level(logging.INFO)
        logger.info('HTTP Request: %s %s "%s %d %s"', "GET", "http://r/x", "HTTP/1.1", 200, "OK")
        logger.warning("something else")
        assert [r.getMessage() for r in caplog.records] == ["something else"]
        caplog.clear()
        caplog.set_level(logging.DEBUG)
        logger.info('HTTP Request: %s', "GET")
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            ("DEBUG", "HTTP Request: GET")]

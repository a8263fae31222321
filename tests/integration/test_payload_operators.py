"""Operators see a dead letter's value through the real schema registry.

A Worker dead-letters an Avro, a JSON Schema and a Protobuf record (its handler rejects them);
``kworkers dlq show --schema-registry URL`` and the console's record page then show each value
decoded, with its schema id and subject, read back from the DLQ on the real broker and decoded
through the real registry. Without a registry the same records are hex, as before; a registry
that does not answer is said in one line, never with the credentials it was given.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kworkers import Message, NonRetryableError, Worker
from kworkers.dlq.reader import read_dlq
from kworkers.kafka.settings import MASK
from kworkers.testing import Broker
from kworkers.testing.broker import free_port
from kworkers.testing.registry import SchemaRegistryServer
from kworkers.testing.workload import make_topic, produce, unique
from tests.integration.conftest import running, wait_for
from tests.integration.test_cli_support import cli, one_error_line
from tests.payload_schemas import ORDER_AVRO, ORDER_JSON_SCHEMA, OrderProto, client

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Typed:
    topic: str
    dlq: str
    #: key -> (dlq partition, dlq offset, schema id, the value's bytes)
    where: dict[str, tuple[int, int, int, bytes]]


@pytest.fixture(scope="module")
def typed(kafka_broker: Broker, schema_registry: SchemaRegistryServer) -> Iterator[Typed]:
    bs = kafka_broker.bootstrap_servers
    topic = make_topic(bs, unique("typed"), 1)
    c = client(schema_registry.url)
    ctx = SerializationContext(topic, MessageField.VALUE)
    values = {
        "avro": AvroSerializer(c, ORDER_AVRO)({"id": "a-1", "qty": 2}, ctx),
        # JSON Schema and Protobuf under their own subjects: one topic, three schemas
        "json": JSONSerializer(ORDER_JSON_SCHEMA, c, conf={
            "subject.name.strategy": lambda _c, _n: f"{topic}-json"})({"id": "j-1", "qty": 3},
                                                                     ctx),
        "proto": ProtobufSerializer(OrderProto, c, {
            "use.deprecated.format": False,
            "subject.name.strategy": lambda _c, _n: f"{topic}-proto"})(
                OrderProto(id="p-1", qty=4), ctx),
    }
    w = Worker(topics=[topic], group_id=unique("g"), bootstrap_servers=bs)
    w.create_topics()
    produce(bs, topic, ((k.encode(), v) for k, v in values.items()))

    @w.handler
    def handle(msg: Message) -> None:
        raise NonRetryableError("Rejected", "the handler refuses every order")

    dlq = w.config.tiers.dlq_topic(topic)
    with running(w):
        wait_for(lambda: len(read_dlq(bs, dlq).dead_letters) == 3, 90, "3 dead letters")
    dead = read_dlq(bs, dlq).dead_letters
    where = {(d.key or b"").decode(): (d.dlq_partition, d.dlq_offset,
                                      int.from_bytes(values[(d.key or b"").decode()][1:5], "big"),
                                      values[(d.key or b"").decode()]) for d in dead}
    yield Typed(topic, dlq, where)


def _show(bs: str, typed: Typed, key: str, *extra: str,
          env: dict[str, str] | None = None) -> str:
    p, o, _sid, _v = typed.where[key]
    run = cli("dlq", "show", "-b", bs, "--dlq", typed.dlq, "-p", str(p), "-o", str(o), *extra,
              env=env)
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.mark.parametrize(("key", "kind", "subject", "decoded"), [
    ("avro", "AVRO", "{topic}-value", {"id": "a-1", "qty": 2}),
    ("json", "JSON", "{topic}-json", {"id": "j-1", "qty": 3}),
    ("proto", "PROTOBUF", "{topic}-proto", {"id": "p-1", "qty": 4}),
])
def test_dlq_show_decodes_through_the_registry(
        kafka_broker: Broker, schema_registry: SchemaRegistryServer, typed: Typed, key: str,
        kind: str, subject: str, decoded: dict[str, object]) -> None:
    bs = kafka_broker.bootstrap_servers
    sid = typed.where[key][2]
    out = _show(bs, typed, key, "--schema-registry", schema_registry.url)
    # the schema's every subject is named (another test may register the same schema)
    subjects = ", ".join(client(schema_registry.url).get_subjects_by_schema_id(sid))
    assert subject.format(topic=typed.topic) in subjects.split(", ")
    head = f"value: {kind} through the schema registry (schema id {sid}, subject " \
           f"{subjects}, {len(typed.where[key][3])} bytes)"
    # the console wraps a long line: the subjects other tests registered make it longer
    flat = " ".join(out.split())
    assert head in flat, out
    body = flat[flat.index(head) + len(head):]
    assert json.loads(body) == decoded
    assert "0x" not in body  # decoded, not hex

    if key != "avro":
        return  # one CLI run per format above; the two below once (each costs a process)
    # without a registry: hex, as before
    plain = _show(bs, typed, key, env={"KWORKERS_SCHEMA_REGISTRY_URL": ""})
    assert f"0x{typed.where[key][3].hex()}" in plain
    assert "schema registry" not in plain

    # the environment names the registry as well as the flag
    assert head in " ".join(_show(bs, typed, key, env={"KWORKERS_SCHEMA_REGISTRY_URL":
                                                        schema_registry.url}).split())


def test_an_unreachable_registry_is_one_line_without_its_secrets(
        kafka_broker: Broker, typed: Typed) -> None:
    bs = kafka_broker.bootstrap_servers
    sid = typed.where["avro"][2]
    down = f"http://127.0.0.1:{free_port()}"
    for args, env in (
            (["--schema-registry", down.replace("//", "//admin:url-secret-1@")], {}),
            (["--schema-registry", down, "-S", "basic.auth.user.info=ops:user-info-secret-2"],
             {}),
            ([], {"KWORKERS_SCHEMA_REGISTRY_URL": down,
                  "KWORKERS_SCHEMA_REGISTRY_USER_INFO": "ops:env-secret-3"})):
        out = _show(bs, typed, "avro", *args, env=env)
        flat = " ".join(out.split())  # the console wraps long lines
        assert re.search(rf"value: schema id {sid} \(unknown type, subject \(none found\)\) "
                         r"not decoded through the registry: .*did not answer", flat), out
        assert f"0x{typed.where['avro'][3].hex()}" in out  # falls back to hex
        assert "secret" not in out, out

    # settings the client refuses: one line, exit 2, the secret masked
    both = cli("dlq", "show", "-b", bs, "--dlq", typed.dlq, "-p", "0", "-o", "0",
               "--schema-registry", down.replace("//", "//admin:url-secret-1@"), "-S",
               "basic.auth.user.info=ops:user-info-secret-2")
    assert both.returncode == 2
    line = one_error_line(both)
    assert "userinfo credentials in the URL" in line and "secret" not in line, line


def test_the_console_record_page_decodes_through_the_registry(
        kafka_broker: Broker, schema_registry: SchemaRegistryServer, typed: Typed) -> None:
    from starlette.testclient import TestClient

    from kworkers.console.app import create_app
    from kworkers.console.settings import ConsoleSettings
    from kworkers.kafka.settings import ClientSettings
    from kworkers.payloads.settings import RegistrySettings

    bs = kafka_broker.bootstrap_servers
    with_registry = ConsoleSettings(ClientSettings(bs), registry=RegistrySettings(
        schema_registry.url, {"basic.auth.user.info": "ops:console-secret-3"}))
    for settings, decoded in ((with_registry, True), (ConsoleSettings(ClientSettings(bs)), False)):
        with TestClient(create_app(settings), base_url="http://127.0.0.1") as http:
            p, o, sid, value = typed.where["json"]
            page = http.get(f"/dlq/{typed.dlq}/record/{p}/{o}")
            assert page.status_code == 200, page.text
            if decoded:
                assert f'<span id="value-schema-id">{sid}</span>' in page.text
                shown = re.search(r'<span id="value-subject">(.*?)</span>', page.text)
                assert shown is not None and f"{typed.topic}-json" in shown.group(1).split(", ")
                pre = re.search(r'<pre id="value-registry">(.*?)</pre>', page.text, re.S)
                assert pre is not None and json.loads(html.unescape(pre.group(1))) == {
                    "id": "j-1", "qty": 3}
                assert "console-secret-3" not in page.text and MASK not in page.text
            else:
                assert "No schema registry configured" in page.text
                assert 'id="value-registry"' not in page.text
            assert " ".join(f"{b:02x}" for b in value[:12]) in page.text  # the hex dump too

"""`kworkers run`: settings from flags, env and TOML; one or N processes; clean SIGTERM."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kworkers.kafka.clients import list_topics
from kworkers.testing import Broker
from kworkers.testing.broker import free_port
from kworkers.testing.effects import Ledger
from kworkers.testing.processes import children, running
from kworkers.testing.workload import committed_total, make_topic, produce_numbered, unique
from tests.integration.conftest import wait_for
from tests.integration.test_cli_support import ROOT, cli, one_error_line

pytestmark = pytest.mark.integration

APP = '''
import gc
import os
from kworkers import TierLadder, Worker
from kworkers.testing.effects import Ledger
from kworkers.testing.processes import children, running

# placeholders: kworkers.toml, KWORKERS_* and flags supply the real settings
worker = Worker(topics=["placeholder"], group_id="placeholder", tiers=TierLadder((0.25,)))
_ledger = Ledger(os.environ["KW_TEST_LEDGER"])


@worker.handler
def handle(msg):
    v = (msg.value or b"").decode()
    _ledger.delivered(v, msg.topic, msg.partition, msg.offset, msg.attempt)
    _ledger.apply_once(v, v)
    # the collector as the handler runs, per process (kworkers run sets it: kworkers.cli.collector)
    with open(os.environ["KW_TEST_LEDGER"] + f".gc-{os.getpid()}", "w") as f:
        f.write(str(gc.get_threshold()[0]))


def make():
    return worker
'''


def _app(tmp_path: Path, topic: str, group: str) -> Path:
    (tmp_path / "cliapp.py").write_text(APP)
    (tmp_path / "kworkers.toml").write_text(
        f'topics = ["{topic}"]\n'
        f'group_id = "{group}"\n'
        "drain_timeout = 10\n"
        "[consumer_config]\n"
        '"session.timeout.ms" = 6000\n'
        '"heartbeat.interval.ms" = 500\n'
    )
    return tmp_path


def _start(tmp_path: Path, bs: str, *args: str, path: str = "") -> subprocess.Popen[str]:
    """``kworkers run ARGS`` in the background; its output goes to run.log (a pipe nobody
    reads could fill up and block the workers' logging). ``path``: a directory put before
    the project on ``PYTHONPATH``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, str(ROOT)) if p),
           "KWORKERS_BOOTSTRAP_SERVERS": bs,
           "KWORKERS_CONCURRENCY": "2", "KW_TEST_LEDGER": str(tmp_path / "ledger.db")}
    with open(tmp_path / "run.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "kworkers.cli", "run", *args],
                                cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                text=True)


def _young_thresholds(tmp_path: Path) -> dict[int, int]:
    """Each process that handled a record: its collector's young threshold as it did."""
    return {int(f.name.rsplit("-", 1)[1]): int(f.read_text())
            for f in tmp_path.glob("ledger.db.gc-*")}


def _log(tmp_path: Path) -> str:
    return (tmp_path / "run.log").read_text()[-3000:]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _stop(p: subprocess.Popen[str], tmp_path: Path) -> int:
    p.send_signal(signal.SIGTERM)
    try:
        return p.wait(timeout=90)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise AssertionError(f"kworkers run did not stop on SIGTERM:\n{_log(tmp_path)}"
                             ) from None


def test_one_process_with_settings_from_toml_env_and_flags(kafka_broker: Broker,
                                                           tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("run"), 3), unique("g")
    _app(tmp_path, topic, "group-from-toml")  # the flag below must win over this
    made = cli("topics", "create", "-b", bs, "-t", topic, "--tiers", "250ms")
    assert made.returncode == 0, made.stderr
    port = free_port()
    p = _start(tmp_path, bs, "cliapp:worker", "--config", "kworkers.toml", "--group", group,
               "--metrics-port", str(port))
    try:
        wait_for(lambda: _ready(port) or p.poll() is not None, 60, "/readyz")
        assert p.poll() is None, _log(tmp_path)
        produce_numbered(bs, topic, 60)
        ledger = Ledger(tmp_path / "ledger.db")
        wait_for(lambda: ledger.counts()[1] >= 60, 60, "60 effects")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert b"kworkers_records_total" in r.read()
    finally:
        code = _stop(p, tmp_path)
    assert code == 0, _log(tmp_path)
    assert sorted(int(v) for v in ledger.effect_values()) == list(range(60))
    assert committed_total(bs, group, topic, 3) == 60  # committed as the flag's group
    assert committed_total(bs, "group-from-toml", topic, 3) == 0
    # kworkers run's own collector setting, not the interpreter's 700
    assert _young_thresholds(tmp_path) == {p.pid: 20_000}


def test_processes_fork_a_pool_and_sigterm_stops_all(kafka_broker: Broker,
                                                     tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("pool"), 6), unique("g")
    _app(tmp_path, topic, group)
    assert cli("topics", "create", "-b", bs, "-t", topic, "--tiers", "250ms").returncode == 0
    port = free_port()
    p = _start(tmp_path, bs, "cliapp:make", "--processes", "2", "--config", "kworkers.toml",
               "--metrics-port", str(port), "--gc-young-threshold", "5000")
    kids: list[int] = []
    try:
        # one port for the pool: ready only when both children report ready
        wait_for(lambda: _ready(port) or p.poll() is not None, 90,
                 "both worker processes ready")
        assert p.poll() is None, _log(tmp_path)
        produce_numbered(bs, topic, 100)
        ledger = Ledger(tmp_path / "ledger.db")
        wait_for(lambda: ledger.counts()[1] >= 100, 60, "100 effects")

        def handled() -> float:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("kworkers_records_total{")
                       and 'outcome="ok"' in line and f'group="{group}"' in line)

        # the pool's /metrics sums both processes (prometheus multiprocess mode)
        wait_for(lambda: handled() >= 100, 30, "records summed over the pool")
        # the pool's flags are flags (every process ready, none failed), the count a count;
        # the pool answers on PORT alone, as --help says
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            flags = {line.split(" ")[0]: float(line.split(" ")[1])
                     for line in r.read().decode().splitlines()
                     if line.startswith(("kworkers_worker_ready ", "kworkers_worker_healthy ",
                                         "kworkers_worker_processes_ready "))}
        assert flags == {"kworkers_worker_ready": 1.0, "kworkers_worker_healthy": 1.0,
                         "kworkers_worker_processes_ready": 2.0}, flags
        assert not _ready(port + 1)
        kids = children(p.pid)
    finally:
        code = _stop(p, tmp_path)
    assert code == 0, _log(tmp_path)
    assert not _ready(port)  # the pool is gone
    assert committed_total(bs, group, topic, 6) == 100
    # the pool's flag reached its children: each that handled a record ran at 5,000
    seen = _young_thresholds(tmp_path)
    assert seen and set(seen) <= set(kids) and set(seen.values()) == {5000}, (seen, kids)


def _members(bs: str, group: str) -> int:
    """The group's members, read back from the broker."""
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bs})  # held: its futures end with it
    found = admin.describe_consumer_groups([group], request_timeout=20)[group].result(30)
    return len(found.members)


#: an interpreter start-up hook that turns the children's parent watch off: the canary's pool
#: is the pool before the watch (its children run on after their parent is SIGKILLed)
_NO_WATCH = """
import threading
import kworkers.cli.parent_watch as w
w.start = lambda parent: threading.Event()
"""


def _orphans_after_a_sigkilled_pool(bs: str, tmp_path: Path, watch: bool,
                                    bound: float) -> tuple[list[int], int]:
    """A pool of two, working; its parent SIGKILLed (no signal forwarded: an OOM kill). Its
    children still running once they had ``bound`` seconds to notice, and the group's members
    then, read back from the broker."""
    topic, group = make_topic(bs, unique("orphan"), 4), unique("g")
    _app(tmp_path, topic, group)
    assert cli("topics", "create", "-b", bs, "-t", topic, "--tiers", "250ms").returncode == 0
    hooks = tmp_path / "hooks"
    if not watch:
        hooks.mkdir()
        (hooks / "sitecustomize.py").write_text(_NO_WATCH)
    port = free_port()
    p = _start(tmp_path, bs, "cliapp:make", "--processes", "2", "--config", "kworkers.toml",
               "--metrics-port", str(port), path="" if watch else str(hooks))
    kids: list[int] = []
    try:
        wait_for(lambda: _ready(port) or p.poll() is not None, 90,
                 "both worker processes ready")
        assert p.poll() is None, _log(tmp_path)
        kids = children(p.pid)
        assert len(kids) == 2, (kids, _log(tmp_path))
        produce_numbered(bs, topic, 40)
        ledger = Ledger(tmp_path / "ledger.db")
        wait_for(lambda: ledger.counts()[1] >= 40, 60, "40 effects")
        assert _members(bs, group) == 2
        p.kill()
        p.wait()
        with contextlib.suppress(AssertionError):  # the verdict: what still runs, below
            wait_for(lambda: not any(running(k) for k in kids), bound,
                     "the orphaned worker processes to stop")
        left = [k for k in kids if running(k)]
        members = _members(bs, group) if not left else -1
        return left, members
    finally:
        for k in kids:  # whatever the verdict, nothing of this test outlives it
            with contextlib.suppress(ProcessLookupError):
                os.kill(k, signal.SIGKILL)
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_pool_sigkilled_leaves_no_worker_behind(kafka_broker: Broker, tmp_path: Path
                                                  ) -> None:
    """Each child sees its parent gone and stops as a forwarded SIGTERM stops it: both gone,
    and the group empty read back from the broker (they left it, not just died: a member
    that dies stays in the group until its session times out, 6 s here). Seen before the
    watch: every CI run left this suite's SIGKILLed pool's two children polling a broker that
    was gone."""
    left, members = _orphans_after_a_sigkilled_pool(kafka_broker.bootstrap_servers, tmp_path,
                                                    watch=True, bound=60)
    assert left == [] and members == 0, (left, members, _log(tmp_path))


def test_canary_a_pool_without_the_watch_leaves_its_children_running(
        kafka_broker: Broker, tmp_path: Path) -> None:
    """The pool before the watch: its children outlive it. A bound, not a threshold: given 5
    of the watch's one-second periods, both are still running (a broken watch can only pass
    the real test above by exiting for another reason, which this canary would show too)."""
    left, _ = _orphans_after_a_sigkilled_pool(kafka_broker.bootstrap_servers, tmp_path,
                                              watch=False, bound=5)
    print(f"canary: still running {left}")
    assert len(left) == 2, left


def test_missing_topics_and_bad_targets_are_one_line(kafka_broker: Broker,
                                                     tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    topic = unique("no-such-topic-kw")
    _app(tmp_path, topic, "g")
    toml = tmp_path / "kworkers.toml"  # a ladder of its own, not the command's default
    toml.write_text('tiers = "2s,1m"\n' + toml.read_text())
    env = {"KW_TEST_LEDGER": str(tmp_path / "ledger.db"), "KWORKERS_BOOTSTRAP_SERVERS": bs}
    p = cli("run", "cliapp:worker", "--config", "kworkers.toml", cwd=tmp_path, env=env)
    assert p.returncode == 2
    line = one_error_line(p)  # the tiers and DLQ are not "missing": the worker creates them
    assert "source topic missing on" in line and topic in line
    assert f"{topic}.retry" not in line and f"{topic}.dlq" not in line
    assert "the worker would create its retry tiers and DLQ itself" in line
    # issue #46: the hint is a command that works as printed, with the worker's own ladder
    command = shlex.split(line.split("`")[1])
    assert command[:3] == ["kworkers", "topics", "create"], command
    made = cli(*command[1:])
    assert made.returncode == 0, made.stderr
    have = list_topics(bs)
    assert {topic, f"{topic}.retry.2s", f"{topic}.retry.1m", f"{topic}.dlq"} <= set(have)
    assert f"{topic}.retry.1s" not in have
    p = cli("run", "cliapp:nothing", cwd=tmp_path, env=env)
    assert p.returncode == 2
    assert "has no attribute 'nothing'" in one_error_line(p)
    p = cli("run", "cliapp:worker", "--config", "missing.toml", cwd=tmp_path, env=env)
    assert p.returncode == 2
    assert "cannot read config file" in one_error_line(p)
    p = cli("run", "cliapp:worker", cwd=tmp_path, env={**env, "KWORKERS_CONCURRENCY": "lots"})
    assert p.returncode == 2
    assert "KWORKERS_CONCURRENCY: expected a whole number" in one_error_line(p)
    p = cli("run", "cliapp:worker", "--topic", "x", cwd=tmp_path,
            env={**env, "KWORKERS_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert p.returncode == 2
    assert "cannot reach Kafka at 127.0.0.1:1" in one_error_line(p)

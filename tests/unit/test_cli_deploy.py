"""`kworkers deploy render` through its real entry point (no broker needed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = str(Path(__file__).resolve().parents[2])
BARE = [sys.executable, "-m", "kworkers.cli", "deploy", "render",
        "kworkers.deploy.example:worker", "--image", "img:1", "--app", "orders",
        "--partitions", "6"]
ARGS = [*BARE, "-b", "kafka.example:9092"]


def test_render_prints_every_manifest_as_one_multi_document_stream(tmp_path: Path) -> None:
    """Issue #46, bug 4: stdout is what `kubectl apply -f -` reads, so `safe_load_all` must
    see each file as a document of its own, equal to the file `--out` writes (before the fix
    the files were separated by comments only: one document, the ConfigMap's and the
    Deployment's keys overwritten by the ScaledObject's)."""
    out = subprocess.run(ARGS, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    written = subprocess.run([*ARGS, "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
    assert written.returncode == 0, written.stderr
    files = sorted(p for p in tmp_path.rglob("*.yaml"))
    assert docs == [yaml.safe_load(p.read_text()) for p in
                    sorted(files, key=lambda p: str(p.relative_to(tmp_path)))]
    kinds = [d["kind"] for d in docs]
    assert {"ConfigMap", "Deployment", "ScaledObject"} <= set(kinds), kinds
    for name in ("k8s/configmap.yaml", "k8s/deployment.yaml", "keda/scaledobject.yaml"):
        assert f"# {name}" in out.stdout


def test_render_writes_files(tmp_path: Path) -> None:
    out = subprocess.run([*ARGS, "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "maxReplicaCount: 6" in (tmp_path / "keda" / "scaledobject.yaml").read_text()


def test_more_replicas_than_partitions_is_one_clear_error() -> None:
    out = subprocess.run([*ARGS, "--max-replicas", "9"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "partition" in lines[0], out.stderr


def _render(*extra: str, env: dict[str, str] | None = None,
            base: list[str] = ARGS) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KWORKERS_")}
    return subprocess.run([*base, *extra], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**clean, **(env or {})})


def _one_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, out.stdout
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_render_takes_the_client_settings_kworkers_run_takes(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("bootstrap.servers=file:9093\nsasl.mechanism=SCRAM-SHA-256\n")
    out = _render("--config", str(props), "-X", "security.protocol=SASL_SSL",
                  "--sasl-secret", "kafka-creds", base=BARE,
                  env={"KWORKERS_SSL_CA_LOCATION": "/ca.pem", "KWORKERS_CONCURRENCY": "3"})
    assert out.returncode == 0, out.stderr
    for line in ("KWORKERS_BOOTSTRAP_SERVERS: file:9093", "KWORKERS_SECURITY_PROTOCOL: SASL_SSL",
                 "KWORKERS_SASL_MECHANISM: SCRAM-SHA-256", "KWORKERS_SSL_CA_LOCATION: /ca.pem",
                 'KWORKERS_CONCURRENCY: "3"', "sasl: scram_sha256", "tls: enable"):
        assert line in out.stdout, line


@pytest.mark.parametrize(("extra", "env", "needle"), [
    ([], {"KWORKERS_SASL_USERNAME": "u", "KWORKERS_SASL_PASSWORD": "s3cret-pw"},
     "pass sasl_secret"),
    (["-X", "client.id=w1"], {}, "client_config: client.id cannot travel"),
])
def test_render_refuses_what_would_not_reach_the_pods(extra: list[str], env: dict[str, str],
                                                      needle: str) -> None:
    out = _render(*extra, env=env)
    assert out.returncode == 2, out.stdout
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert "s3cret-pw" not in out.stdout + out.stderr


def test_render_requires_the_cluster_s_bootstrap_address() -> None:
    line = _one_line(_render(base=BARE))  # the example worker's default: 127.0.0.1:9092
    assert "the worker's config names none" in line and "pass --bootstrap" in line
    line = _one_line(_render(base=[*BARE, "-b", "127.0.0.1:19092"]))
    assert "a loopback address in a pod is the pod itself" in line
    out = _render(base=BARE, env={"KWORKERS_BOOTSTRAP_SERVERS": "k1:9092,k2:9092"})
    assert out.returncode == 0 and "bootstrapServers: \"k1:9092,k2:9092\"" in out.stdout, (
        out.stderr)


def test_sasl_goes_over_tls_unless_plaintext_is_asked_for_explicitly() -> None:
    out = _render("--sasl-secret", "creds")
    assert out.returncode == 0, out.stderr
    assert "KWORKERS_SECURITY_PROTOCOL: SASL_SSL" in out.stdout and "tls: enable" in out.stdout
    line = _one_line(_render("--sasl-secret", "creds", "-X", "security.protocol=SASL_PLAINTEXT"))
    assert "sends the SASL password over the network in clear" in line
    assert "--allow-plaintext-sasl" in line
    out = _render("--sasl-secret", "creds", "--allow-plaintext-sasl")
    assert out.returncode == 0, out.stderr
    assert "KWORKERS_SECURITY_PROTOCOL: SASL_PLAINTEXT" in out.stdout
    assert "tls: enable" not in out.stdout
    assert "SASL_PLAINTEXT was asked for explicitly" in out.stdout  # the comments stay true


def test_tls_secrets_are_mounted_as_files() -> None:
    out = _render("--sasl-secret", "creds", "--tls-secret", "kafka-ca", "--tls-client-cert",
                  "-X", "sasl.mechanism=SCRAM-SHA-512")
    assert out.returncode == 0, out.stderr
    for line in ("KWORKERS_SSL_CA_LOCATION: /etc/kworkers/tls/ca.crt",
                 "KWORKERS_SSL_CERTIFICATE_LOCATION: /etc/kworkers/tls/tls.crt",
                 "KWORKERS_SSL_KEY_LOCATION: /etc/kworkers/tls/tls.key",
                 "mountPath: /etc/kworkers/tls", "secretName: kafka-ca", "sasl: scram_sha512",
                 "parameter: cert", "parameter: key", "parameter: ca", "fsGroup: 10001"):
        assert line in out.stdout, line
    assert "mechanism SCRAM-SHA-512" in out.stdout
    assert "plaintext" not in out.stdout.lower().replace("sasl_plaintext", "")
    line = _one_line(_render("--tls-client-cert"))
    assert "--tls-client-cert reads tls.crt and tls.key from the TLS Secret" in line
    line = _one_line(_render("--tls-secret", "kafka-ca", "-X", "security.protocol=PLAINTEXT"))
    assert "certificates need SSL or SASL_SSL" in line


@pytest.mark.parametrize(("bootstrap", "why"), [
    ("kafka", "has no port"), ("kafka:notaport", "has port 'notaport'"),
    ("http://kafka:9092", "has a scheme"), ("kafka:99999", "has port '99999'"),
    ("kafka:0", "has port '0'"), ("::1:9092", "write it as [addr]:port"),
    ("k1:9092,,k2:9092", "is empty"), (":9092", "has no host"), ("ka fka:9092", "host name"),
    ("[zz]:9092", "not an IPv6 address")])
def test_a_broken_bootstrap_entry_is_named(bootstrap: str, why: str) -> None:
    """Issue #46, bug 5: each entry HOST:PORT ([addr]:port for IPv6), port 1-65535, no
    scheme: what KEDA's scaler needs (librdkafka alone would have taken `kafka` as :9092)."""
    from kworkers.deploy.manifests import bootstrap_hosts
    from kworkers.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(why)):
        bootstrap_hosts(bootstrap)


def test_good_bootstrap_lists_pass_and_a_broken_one_is_one_line_exit_2() -> None:
    from kworkers.deploy.manifests import bootstrap_hosts

    assert bootstrap_hosts("k1:9092, k2.ns.svc:19092,[fe80::1]:9093") == [
        ("k1", 9092), ("k2.ns.svc", 19092), ("fe80::1", 9093)]
    line = _one_line(_render(base=[*BARE, "-b", "kafka"]))
    assert "'kafka' has no port" in line, line


def test_the_pods_memory_is_the_workers_worst_case_from_every_entrance() -> None:
    """Issue #45: request and limit from the formula (``WorkerConfig.memory_bound``) for the
    settings the pods run with: the default, a bound given as a variable (which the ConfigMap
    then carries), and ``--brokers``."""
    def memory(*extra: str, env: dict[str, str] | None = None) -> tuple[str, str, str]:
        out = _render(*extra, env=env)
        assert out.returncode == 0, out.stderr
        docs = {d["kind"]: d for d in yaml.safe_load_all(out.stdout)}
        res = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["resources"]
        carried = docs["ConfigMap"]["data"]["KWORKERS_MAX_IN_FLIGHT_BYTES"]
        assert res["requests"]["memory"] == res["limits"]["memory"]
        return res["limits"]["memory"], carried, out.stdout

    default, carried, text = memory()
    assert (default, carried) == ("288Mi", "64MiB") and "worst case, 288 MiB" in text
    big, carried, _ = memory(env={"KWORKERS_MAX_IN_FLIGHT_BYTES": "256MiB"})
    assert carried == "256MiB" and int(big[:-2]) > 2 * 256 + 96  # two loops and the rest
    nine, _c, _t = memory("--brokers", "9")
    assert int(nine[:-2]) > 288
    bad = _render("--brokers", "0")
    assert bad.returncode == 2 and "--brokers" in bad.stderr


@pytest.mark.parametrize(("extra", "says"), [
    (["--prometheus", "prometheus:9090"], "not a server address KEDA can query"),
    (["--prometheus", "http://"], "not a server address KEDA can query"),
    (["--prometheus", "/api/v1"], "not a server address KEDA can query"),
    (["--prometheus", "http://p:9090", "--scale-on", "seconds", "--time-lag-target", "0"],
     "positive duration"),
    (["--prometheus", "http://p:9090", "--scale-on", "seconds", "--time-lag-target", "-5s"],
     "positive duration"),
    (["--prometheus", "http://p:9090", "--time-lag-target", "soon"], "positive duration"),
    (["--scale-on", "seconds"], "pass --prometheus"),
    (["--prometheus", "http://p:9090", "--lag-threshold", "0"], "--lag-threshold"),
], ids=["no-scheme", "no-host", "path-only", "zero-target", "negative-target", "not-a-duration",
        "seconds-without-prometheus", "zero-threshold"])
def test_a_trigger_that_cannot_work_is_one_line_exit_2_and_writes_nothing(
        tmp_path: Path, extra: list[str], says: str) -> None:
    """Issue #47, bad input: refused in one line, exit 2, nothing written."""
    out_dir = tmp_path / "out"
    line = _one_line(_render(*extra, "--out", str(out_dir)))
    assert says in line, line
    assert not out_dir.exists()


def test_render_scales_on_seconds_when_asked() -> None:
    out = _render("--prometheus", "https://prom.monitoring:9090/", "--scale-on", "seconds",
                  "--time-lag-target", "2m")
    assert out.returncode == 0, out.stderr
    [so] = [d for d in yaml.safe_load_all(out.stdout) if d["kind"] == "ScaledObject"]
    [drain] = [t for t in so["spec"]["triggers"] if t["type"] == "prometheus"]
    assert drain["metadata"]["query"].startswith(
        "count(max by (topic, partition) (kworkers_drainable_time_lag_seconds{")
    assert "> 120)" in drain["metadata"]["query"] and drain["metadata"]["threshold"] == "1"

"""A real Prometheus server for tests (Debian's ``prometheus`` package: ``ensure_prometheus`` in
scripts/lib.sh), scraping the replicas' metrics ports and evaluating a rendered query as KEDA's
Prometheus scaler would.

Targets are a ``file_sd_configs`` file the test rewrites as replicas come and go (Prometheus
watches it; a target removed gets staleness markers, so its series leave the query at once, as
a deleted pod's do). ``query`` returns the result's single value, or 0.0 for an empty result
(KEDA's ``ignoreNullValues`` default).

``job`` and ``rule_files``: a scrape job taken from a Prometheus config (its name, metrics
path and static labels; the dashboard and alert tests pass ``deploy/prometheus/prometheus.yml``'s
job, its fixed target replaced by the test's) and rule files to evaluate (``rules`` reads back
how each rule evaluated).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kworkers.testing.broker import free_port


def prometheus_binary(name: str = "prometheus") -> str:
    """A program of Debian's prometheus package (``prometheus``, ``promtool``); the calling
    test skips (fails under CI) without it."""
    found = shutil.which(name)
    if found is None:
        import pytest

        pytest.skip(f"{name} is not installed: run `bash -c 'source scripts/lib.sh; "
                    "ensure_prometheus'` (Debian's prometheus package)")
    return found


class PrometheusServer:
    def __init__(self, workdir: Path, scrape_interval: float = 1.0,
                 job: Mapping[str, Any] | None = None,
                 rule_files: Sequence[Path] = ()) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.targets_path = self.dir / "targets.json"
        #: the job's own static labels, given to every target (the fixed target is dropped)
        self.labels: dict[str, str] = {}
        name, path = "replicas", "/metrics"
        if job is not None:
            name, path = str(job["job_name"]), str(job.get("metrics_path", "/metrics"))
            for static in job.get("static_configs", ()):
                self.labels.update({str(k): str(v) for k, v in static.get("labels", {}).items()})
        self.set_targets([])
        ms = max(int(scrape_interval * 1000), 100)
        rules = "".join(f"- {json.dumps(str(p))}\n" for p in rule_files)
        (self.dir / "prometheus.yml").write_text(
            "global:\n"
            f"  scrape_interval: {ms}ms\n"
            f"  scrape_timeout: {ms}ms\n"
            f"  evaluation_interval: {ms}ms\n"
            + (f"rule_files:\n{rules}" if rules else "") +
            "scrape_configs:\n"
            f"- job_name: {json.dumps(name)}\n"
            f"  metrics_path: {json.dumps(path)}\n"
            "  file_sd_configs:\n"
            f"  - files: ['{self.targets_path}']\n"
            "    refresh_interval: 1s\n", encoding="utf-8")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.dir / "prometheus.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [prometheus_binary(), f"--config.file={self.dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("prometheus not ready in 60 s")
            time.sleep(0.2)

    def set_targets(self, ports: Iterable[int]) -> None:
        """The replicas' metrics ports to scrape from now on (written atomically)."""
        self.set_groups([(ports, {})])

    def set_groups(self, groups: Iterable[tuple[Iterable[int], Mapping[str, str]]]) -> None:
        """Target groups: ports on loopback, each group with labels of its own beside the
        job's (a Kubernetes scrape's ``namespace``, say)."""
        tmp = self.targets_path.with_suffix(".tmp")
        tmp.write_text(json.dumps([
            {"targets": [f"127.0.0.1:{p}" for p in sorted(ports)],
             "labels": {**self.labels, **labels}} for ports, labels in groups]),
            encoding="utf-8")
        os.replace(tmp, self.targets_path)

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        q = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{q}", timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus: {body}")
        return body["data"]

    def series(self, promql: str, at: float | None = None
               ) -> list[tuple[dict[str, str], float]]:
        """Every series of an instant vector query (now, or at epoch second ``at``), with its
        labels."""
        params = {"query": promql, **({} if at is None else {"time": f"{at:.3f}"})}
        data = self._get("/api/v1/query", params)
        return [(dict(x["metric"]), float(x["value"][1])) for x in data["result"]]

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule as ``/api/v1/rules`` reports it (its health, last error, alerts)."""
        return [r for g in self._get("/api/v1/rules", {})["groups"] for r in g["rules"]]

    def query(self, promql: str) -> float:
        """The query's value now: a one-element vector's (or a scalar's) value, 0.0 when empty;
        more than one element is an error (a trigger's query must give one number)."""
        q = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus: {body}")
        data = body["data"]
        if data["resultType"] == "scalar":
            return float(data["result"][1])
        result = data["result"]
        if not result:
            return 0.0
        if len(result) > 1:
            raise RuntimeError(f"the query gave {len(result)} series, KEDA wants one: {promql}")
        return float(result[0]["value"][1])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

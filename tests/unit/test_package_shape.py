"""The package's shape: a light root, no test support in shipped code, one place for names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import kworkers

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kworkers"
HEAVY = ("confluent_kafka", "prometheus_client")

#: modules of pure logic: importing one (and so the package root) loads no client library
PURE = ["kworkers.keda", "kworkers.lag", "kworkers.settings", "kworkers.config",
        "kworkers.errors", "kworkers.message", "kworkers.topic_names", "kworkers.topic_plan",
        "kworkers.kafka.settings", "kworkers.retry_tiers", "kworkers.consumer.offsets",
        "kworkers.consumer.commit", "kworkers.dlq", "kworkers.deploy"]


def _loaded(module: str) -> set[str]:
    """The heavy libraries importing ``module`` loads, in a fresh interpreter."""
    code = (f"import sys, {module}; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True)
    return {m for m in out.stdout.strip().split(",") if m}


@pytest.mark.parametrize("module", PURE)
def test_a_pure_module_loads_no_client_library(module: str) -> None:
    assert _loaded(module) == set()


def test_the_check_can_fail() -> None:
    # canary: the worker does load librdkafka and the metrics, and the check sees it
    assert _loaded("kworkers.worker") == set(HEAVY)


def test_the_root_exports_every_public_name_on_demand() -> None:
    assert kworkers.__all__ == sorted(kworkers._WHERE)
    for name in kworkers.__all__:
        assert getattr(kworkers, name) is not None, name
    assert kworkers.Worker.__module__ == "kworkers.worker"
    assert kworkers.activity.__name__ == "kworkers.activity"
    with pytest.raises(AttributeError, match="no attribute 'Wroker'"):
        _ = kworkers.Wroker  # type: ignore[attr-defined]
    names: dict[str, object] = {}
    exec("from kworkers import *", names)
    assert set(kworkers.__all__) <= set(names)


#: shipped modules on their way out of the package (``examples/``), still importing test support
_LEAVING: set[str] = set()


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_shipped_code_never_imports_test_support() -> None:
    shipped = [p for p in PACKAGE.rglob("*.py")
               if "testing" not in p.relative_to(PACKAGE).parts
               and str(p.relative_to(ROOT)) not in _LEAVING]
    assert len(shipped) > 40
    offenders = {str(p.relative_to(ROOT)): sorted(m for m in _imports(p)
                                                  if m.startswith("kworkers.testing"))
                 for p in shipped}
    assert {k: v for k, v in offenders.items() if v} == {}
    # canary: the scan finds test support where it is imported
    assert "kworkers.testing.broker" in _imports(PACKAGE / "testing" / "pytest_plugin.py")

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
        "kworkers.consumer.commit", "kworkers.dlq", "kworkers.deploy", "kworkers.envelope",
        "kworkers.payloads", "kworkers.payloads.failures", "kworkers.properties",
        "kworkers.kafka.serialization"]


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
        _ = kworkers.Wroker
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


# --- the engine is closed, the client lives in one package ----------------------------------

#: the client library's exception types: only ``kworkers/kafka/`` names them (issue #48: what
#: is above it catches kworkers' own errors, ``kworkers.kafka.errors``)
_CLIENT_ERRORS = frozenset({"KafkaException", "KafkaError"})


def _import_nodes(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for every import in ``path``, nested ones too."""
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    return out


def _package_of(path: Path, root: Path) -> str:
    return ".".join(("kworkers", *path.relative_to(root).parts[:-1]))


def _client_error_uses(path: Path) -> list[str]:
    """The client's exception types ``path`` imports or names as an attribute
    (``clients.KafkaException``), whatever module it takes them from."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom):
            out += [a.name for a in node.names if a.name in _CLIENT_ERRORS]
        elif isinstance(node, ast.Attribute) and node.attr in _CLIENT_ERRORS:
            out.append(node.attr)
    return out


def _shape_findings(root: Path) -> list[str]:
    """Every import that breaks the engine's rules, as ``path: what``."""
    findings: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root.parent))
        parts = path.relative_to(root).parts
        client_side = parts[0] in ("kafka", "testing")
        if not client_side:
            findings += [f"{rel}: names the client's {name} outside kworkers/kafka/"
                         for name in _client_error_uses(path)]
        for module, names in _import_nodes(path):
            if parts[0] == "consumer" and (
                    module in ("kworkers.config", "kworkers.worker", "kworkers.wiring")
                    or module.startswith("kworkers.retry_tiers.handoff")):
                findings.append(f"{rel}: the engine imports {module}")
            if parts[0] == "payloads" and module.startswith("kworkers.kafka"):
                findings.append(f"{rel}: payloads imports {module} (the client's adapters "
                                "import payloads, never the reverse)")
            if module.split(".")[0] == "confluent_kafka" and not client_side:
                findings.append(f"{rel}: imports {module} outside kworkers/kafka/")
            if module.startswith("kworkers."):
                own = _package_of(path, root)
                theirs = module.rsplit(".", 1)[0] if module.count(".") > 1 else module
                for name in names:
                    if name.startswith("_") and not module.startswith(own) \
                            and theirs != own:
                        findings.append(f"{rel}: imports the private {module}.{name}")
    return findings


def test_the_engine_is_closed_and_the_client_lives_in_one_package() -> None:
    assert _shape_findings(PACKAGE) == []


def test_the_shape_check_can_fail(tmp_path: Path) -> None:
    """The canary: a copy of the rules' five breaches, each found (and the client's own
    package left alone)."""
    pkg = tmp_path / "kworkers"
    (pkg / "consumer").mkdir(parents=True)
    (pkg / "share").mkdir()
    (pkg / "consumer" / "loop.py").write_text(
        "from kworkers.config import WorkerConfig\nfrom confluent_kafka import Consumer\n")
    (pkg / "share" / "x.py").write_text("from kworkers.kafka.consumer import _headers\n")
    (pkg / "console").mkdir()
    (pkg / "console" / "page.py").write_text(
        "from kworkers.kafka import clients\nfrom kworkers.kafka.errors import KafkaError\n"
        "try:\n    pass\nexcept clients.KafkaException:\n    pass\n")
    (pkg / "payloads").mkdir()
    (pkg / "payloads" / "serde.py").write_text(
        "def context():\n    from kworkers.kafka.serialization import context\n")
    (pkg / "kafka").mkdir()  # the client's own package may name them
    (pkg / "kafka" / "admin.py").write_text("from confluent_kafka import KafkaException\n")
    found = _shape_findings(pkg)
    assert "kworkers/console/page.py: names the client's KafkaError outside kworkers/kafka/" \
        in found, found
    assert "kworkers/console/page.py: names the client's KafkaException outside " \
        "kworkers/kafka/" in found, found
    assert not any(f.startswith("kworkers/kafka/") for f in found), found
    assert any(f.startswith("kworkers/payloads/serde.py: payloads imports kworkers.kafka.")
               for f in found), found
    assert any("the engine imports kworkers.config" in f for f in found), found
    assert any("imports confluent_kafka outside" in f for f in found), found
    assert any("private kworkers.kafka.consumer._headers" in f for f in found), found


def test_the_client_package_root_imports_no_adapter() -> None:
    init = PACKAGE / "kafka" / "__init__.py"
    mods = [m for m, _names in _import_nodes(init)]
    assert all(m in ("kworkers.kafka.settings", "__future__") for m in mods), mods

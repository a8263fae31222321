"""The dependency audit's policy (scripts/audit.py) and the lock it audits
(requirements/constraints.txt): what fails, and that the lock covers every dependency."""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _audit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kw_audit", ROOT / "scripts" / "audit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


audit = _audit()
CLEAN = {"name": "rich", "version": "15.0.0", "vulns": []}
#: the canary: a locked package with a known vulnerability
VULNERABLE = {"name": "urllib3", "version": "1.26.4", "vulns": [
    {"id": "PYSEC-2021-108", "fix_versions": ["1.26.5"], "aliases": ["CVE-2021-33503"]}]}
SKIPPED = {"name": "anyio", "skip_reason": "Dependency not found on PyPI and could not be "
                                           "audited: anyio (4.16.0)"}


def _report(*deps: dict[str, Any]) -> dict[str, Any]:
    return {"dependencies": list(deps), "fixes": []}


def test_a_known_vulnerability_fails_the_audit_the_canary() -> None:
    v = audit.verdict(_report(CLEAN, VULNERABLE), {}, strict=False)
    assert v.failed
    assert "VULNERABLE urllib3 1.26.4: PYSEC-2021-108 (fixed in 1.26.5)" in v.lines
    assert audit.verdict(_report(CLEAN), {}, strict=False) == audit.Verdict(
        False, ["audited 1 of 1 locked packages; 0 known vulnerabilities"])


def test_an_accepted_vulnerability_needs_a_reason_and_then_passes() -> None:
    accepted = audit.ignored("# comment\nCVE-2021-33503  not reachable: no proxy use\n")
    v = audit.verdict(_report(VULNERABLE), accepted, strict=False)
    assert not v.failed and v.lines[0].startswith("accepted urllib3 1.26.4 PYSEC-2021-108")
    with pytest.raises(ValueError, match=r"audit-ignore\.txt:1: CVE-1 needs a reason"):
        audit.ignored("CVE-1\n")


def test_an_incomplete_audit_is_said_and_fails_only_when_strict() -> None:
    v = audit.verdict(_report(CLEAN, SKIPPED), {}, strict=False)
    assert not v.failed and any(line.startswith("INCOMPLETE: 1 packages") for line in v.lines)
    assert audit.verdict(_report(CLEAN, SKIPPED), {}, strict=True).failed
    assert audit.verdict(_report(SKIPPED, VULNERABLE), {}, strict=False).failed


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line.strip())
        assert m, f"not an exact pin: {line!r}"
        name = canonicalize_name(m[1])
        assert name not in pins, f"pinned twice: {name}"
        pins[name] = m[2]
    return pins


def test_the_lock_pins_every_dependency_of_the_test_environment() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in (*project["dependencies"],
                                       *project["optional-dependencies"]["test"])]
    pins = _pins()
    missing = sorted({canonicalize_name(r.name) for r in wanted} - set(pins))
    assert not missing, (f"{missing} are not in requirements/constraints.txt: regenerate it "
                         "(its header says how)")
    for r in wanted:  # each pin satisfies what pyproject asks
        assert r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True), r
    assert "pip" in pins and "pip-audit" in pins

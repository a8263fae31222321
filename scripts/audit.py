"""The dependency audit scripts/test runs: pip-audit over the locked test environment.

    .venv/bin/python scripts/audit.py [--strict]

What it checks: every pinned package of requirements/constraints.txt (the lock scripts/test
installs from) against the vulnerability service pip-audit asks (PyPI's advisory data).

What fails (exit 1), as the README says:
- a known vulnerability in any locked package, unless its ID is listed in
  requirements/audit-ignore.txt with a reason (one ``ID  reason`` per line);
- with ``--strict`` or ``KWORKERS_AUDIT_STRICT=1``: an audit that could not check every
  package (the service did not answer for some), because an audit that checked nothing
  passes for the wrong reason.

Without strict, an incomplete audit prints how many packages went unchecked and why, loudly,
and passes: on a machine whose package index has no advisory API the tests must still run.
The verdict is a pure function of pip-audit's JSON (``verdict``), tested in
tests/unit/test_audit_policy.py with a vulnerable canary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "constraints.txt"
IGNORE = ROOT / "requirements" / "audit-ignore.txt"


@dataclass(frozen=True)
class Verdict:
    failed: bool
    lines: list[str] = field(default_factory=list)


def ignored(text: str) -> dict[str, str]:
    """The audit-ignore file: vulnerability ID -> the reason it is accepted (both required)."""
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        vid, _, reason = line.partition(" ")
        if not reason.strip():
            raise ValueError(f"audit-ignore.txt:{n}: {vid} needs a reason after the ID")
        out[vid] = reason.strip()
    return out


def verdict(report: Mapping[str, Any], accepted: Mapping[str, str], strict: bool) -> Verdict:
    """What pip-audit's JSON report means for this project (see the module docstring)."""
    deps = report.get("dependencies", [])
    found, skipped, lines = [], [], []
    for dep in deps:
        if "skip_reason" in dep:
            skipped.append(dep)
            continue
        for vuln in dep.get("vulns", []):
            ids = {vuln["id"], *vuln.get("aliases", [])}
            known = sorted(ids & set(accepted))
            if known:
                lines.append(f"accepted {dep['name']} {dep['version']} {vuln['id']}: "
                             f"{accepted[known[0]]}")
                continue
            fix = ", ".join(vuln.get("fix_versions", [])) or "no fixed version yet"
            found.append(f"{dep['name']} {dep['version']}: {vuln['id']} (fixed in {fix})")
    checked = len(deps) - len(skipped)
    lines.append(f"audited {checked} of {len(deps)} locked packages; "
                 f"{len(found)} known vulnerabilities")
    lines += [f"VULNERABLE {line}" for line in found]
    if skipped:
        why = skipped[0]["skip_reason"]
        lines.append(f"INCOMPLETE: {len(skipped)} packages could not be checked (e.g. {why})"
                     + ("" if strict else "; not a failure without --strict"))
    return Verdict(bool(found) or (strict and bool(skipped)), lines)


def main(argv: list[str]) -> int:
    strict = "--strict" in argv or os.environ.get("KWORKERS_AUDIT_STRICT") == "1"
    out = subprocess.run(
        [sys.executable, "-m", "pip_audit", "-r", str(LOCK), "--no-deps", "--disable-pip",
         "--progress-spinner", "off", "-f", "json"],
        capture_output=True, text=True, timeout=600)
    try:
        report = json.loads(out.stdout)
    except ValueError:
        print(f"audit: pip-audit failed (exit {out.returncode}): "
              f"{out.stderr.strip().splitlines()[-1:] or ['no output']}", file=sys.stderr)
        return 1
    accepted = ignored(IGNORE.read_text()) if IGNORE.exists() else {}
    result = verdict(report, accepted, strict)
    for line in result.lines:
        print(f"audit: {line}", file=sys.stderr)
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

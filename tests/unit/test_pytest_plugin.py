"""The plugin's no-silent-skips rule, shown on a suite that skips at collection: under CI it
fails the run (a missing library or browser must not pass as green); outside CI it skips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HIDDEN = '''
import pytest
pytest.importorskip("no_such_module_kworkers")


def test_never_runs():
    assert False
'''


def _run(tmp: Path, ci: str) -> subprocess.CompletedProcess[str]:
    (tmp / "test_hidden.py").write_text(HIDDEN)
    env = {**os.environ, "KWORKERS_CI": ci, "PYTHONPATH": str(Path(__file__).parents[2])}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "kworkers.testing.pytest_plugin",
         "-p", "no:cacheprovider", "-q", "test_hidden.py"],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=120)


def test_a_suite_skipped_at_collection_fails_under_ci(tmp_path: Path) -> None:
    hidden = _run(tmp_path, "1")
    assert hidden.returncode != 0, hidden.stdout
    assert "skipped at collection under CI" in hidden.stdout
    assert "no_such_module_kworkers" in hidden.stdout


def test_outside_ci_it_is_a_skip(tmp_path: Path) -> None:
    quiet = _run(tmp_path, "0")
    assert quiet.returncode == 5, quiet.stdout  # pytest's "no tests ran": the suite hid
    assert "1 skipped" in quiet.stdout

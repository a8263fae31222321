import os

pytest_plugins = ["kworkers.testing.pytest_plugin", "tests.ci_timing"]

if "PYTEST_XDIST_WORKER" in os.environ:
    # pytest-xdist sets COLUMNS=80 in its workers: the CLI's rich tables then wrap and the
    # tests reading them fail (8 did). The tests' terminal width is the one they set.
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

pytest_plugins = ["kworkers.testing.pytest_plugin"]

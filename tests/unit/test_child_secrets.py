"""What ``kworkers run --processes`` keeps off its children's command lines and environments
(the broker test reads /proc: tests/faults/test_security.py)."""

from __future__ import annotations

import os

import pytest

from kworkers.cli import child_secrets
from kworkers.errors import ConfigError


def test_secret_flags_and_variables_are_split_off() -> None:
    shown, secret = child_secrets.split_properties(
        ["security.protocol=SASL_SSL", "sasl.password=p1", "ssl.key.password=k1",
         "sasl.oauthbearer.client.secret=c1", "sasl.username=alice"])
    assert shown == ["security.protocol=SASL_SSL", "sasl.username=alice"]
    assert secret == {"sasl.password": "p1", "ssl.key.password": "k1",
                      "sasl.oauthbearer.client.secret": "c1"}
    env = {"KWORKERS_SASL_PASSWORD": "p2", "KWORKERS_SSL_KEY_PASSWORD": "k2",
           "KWORKERS_SASL_USERNAME": "alice", "KWORKERS_SASL_OAUTHBEARER_CLIENT_SECRET": " ",
           "PATH": "/bin"}
    assert child_secrets.child_environment(env) == {
        "KWORKERS_SASL_USERNAME": "alice", "KWORKERS_SASL_OAUTHBEARER_CLIENT_SECRET": " ",
        "PATH": "/bin"}
    # -X wins over the environment, as in the parent's own resolution
    assert child_secrets.secrets_for_children(env, {"sasl.password": "p1"}) == {
        "sasl.password": "p1", "ssl.key.password": "k2"}


def test_the_pipe_carries_the_secrets_once() -> None:
    args, fd = child_secrets.attach(["run", "x:w"], {"sasl.password": "s3cret"})
    assert fd is not None and args == ["run", "x:w", "--secrets-fd", str(fd)]
    assert child_secrets.read(fd) == {"sasl.password": "s3cret"}
    with pytest.raises(OSError):
        os.fstat(fd)  # read closes it
    assert child_secrets.attach(["run"], {}) == (["run"], None)


def test_a_bad_pipe_is_one_line() -> None:
    read, write = os.pipe()
    os.write(write, b'["not", "a", "table"]')
    os.close(write)
    with pytest.raises(ConfigError, match="not a table of client properties"):
        child_secrets.read(read)
    with pytest.raises(ConfigError, match="cannot read the secrets"):
        child_secrets.read(999)

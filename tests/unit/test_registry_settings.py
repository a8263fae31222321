"""Schema registry settings for operators: flags over the environment, secrets never shown."""

from __future__ import annotations

import pytest

from kworkers.errors import ConfigError
from kworkers.kafka.settings import MASK
from kworkers.payloads.settings import RegistrySettings, registry_settings


def test_no_url_no_registry() -> None:
    assert registry_settings(None, [], {}) is None
    assert registry_settings(None, [], {"KWORKERS_SCHEMA_REGISTRY_USER_INFO": "u:p"}) is None
    with pytest.raises(ConfigError, match="need --schema-registry"):
        registry_settings(None, ["basic.auth.user.info=u:p"], {})


def test_flags_over_the_environment() -> None:
    env = {"KWORKERS_SCHEMA_REGISTRY_URL": "http://env:8081",
           "KWORKERS_SCHEMA_REGISTRY_USER_INFO": "envuser:envpass"}
    s = registry_settings(None, [], env)
    assert s is not None and s.client_config() == {
        "url": "http://env:8081", "basic.auth.user.info": "envuser:envpass"}
    s = registry_settings("https://flag:8081", ["basic.auth.user.info=me:pw",
                                                "ssl.ca.location=/ca.pem"], env)
    assert s is not None and s.client_config() == {
        "url": "https://flag:8081", "basic.auth.user.info": "me:pw",
        "ssl.ca.location": "/ca.pem"}


@pytest.mark.parametrize("url", ["", " , ", "ftp://x", "registry:8081", "http://"])
def test_a_url_that_is_not_http_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="schema registry"):
        RegistrySettings(url)


def test_secrets_are_masked_everywhere() -> None:
    s = RegistrySettings("https://admin:hunter2pw@reg.example:8081,https://b.example",
                         {"basic.auth.user.info": "ops:s3cret-pass",
                          "bearer.auth.token": "tok-123", "ssl.ca.location": "/ca.pem"})
    text = repr(s) + s.shown_url + str(s.masked())
    for secret in ("hunter2pw", "s3cret-pass", "tok-123"):
        assert secret not in text
        assert s.redact(f"error near {secret}!") == f"error near {MASK}!"
    assert s.shown_url == f"https://{MASK}@reg.example:8081,https://b.example"
    assert "/ca.pem" in repr(s)  # not a secret
    # the user name alone is not the secret, the password is (and the pair as a whole)
    assert s.redact("ops:s3cret-pass") == MASK


def test_the_url_is_not_a_property() -> None:
    with pytest.raises(ConfigError, match="not -S url="):
        registry_settings("http://a:1", ["url=http://b:2"], {})
    with pytest.raises(ConfigError, match="-S"):
        registry_settings("http://a:1", ["no-equals-sign"], {})

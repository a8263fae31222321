"""The one-line causes of TLS and SASL failures, from the texts librdkafka 2.16 really prints
(captured against the security test's broker: tests/faults/test_security.py)."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from kworkers.kafka import diagnose
from kworkers.kafka.diagnose import Probe
from kworkers.kafka.settings import ClientSettings
from kworkers.kafka.tls_probe import expired_on

VERIFY = ("sasl_ssl://127.0.0.1:35081/bootstrap: SSL handshake failed: error:0A000086:SSL "
          "routines::certificate verify failed: broker certificate could not be verified, "
          "verify that ssl.ca.location is correctly configured or root CA certificates are "
          "installed (install ca-certificates package) (after 164ms in state SSL_HANDSHAKE)")
REQUIRED = ("ssl://127.0.0.1:57869/bootstrap: Receive failed: error:0A00045C:SSL routines::"
            "tlsv13 alert certificate required: SSL alert number 116 (after 2ms in state "
            "APIVERSION_QUERY)")
UNKNOWN = ("ssl://127.0.0.1:57869/bootstrap: Receive failed: error:0A000416:SSL routines::"
           "ssl/tls alert certificate unknown: SSL alert number 46 (after 15ms in state "
           "APIVERSION_QUERY)")
SCRAM = ("sasl_ssl://127.0.0.1:35081/bootstrap: SASL authentication error: Authentication "
         "failed during authentication due to invalid credentials with SASL mechanism "
         "SCRAM-SHA-512 (after 379ms in state AUTH_REQ)")
MECHANISM = ("sasl_ssl://127.0.0.1:35081/bootstrap: SASL SCRAM-SHA-256 mechanism handshake "
             "failed: Broker: Unsupported SASL mechanism: broker's supported mechanisms: "
             "SCRAM-SHA-512 (after 301ms in state AUTH_HANDSHAKE)")
TOKEN = 'Failed to acquire SASL OAUTHBEARER token: {"error": "invalid_client"}'
KEY = ("Failed to create admin client: ssl.key.location failed: error:0A080009:SSL routines::"
       "PEM lib")

TLS = ClientSettings.of("127.0.0.1:9093", {"security.protocol": "SSL",
                                           "ssl.ca.location": "/etc/kafka/ca.pem"})
MTLS = ClientSettings.of("127.0.0.1:9093", {
    "security.protocol": "SSL", "ssl.ca.location": "/etc/kafka/ca.pem",
    "ssl.certificate.location": "/etc/kafka/me.pem", "ssl.key.location": "/etc/kafka/me.key",
    "ssl.key.password": "k3y-s3cret"})
SASL = ClientSettings.of("127.0.0.1:9093", {
    "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
    "sasl.username": "alice", "sasl.password": "s3cret", "ssl.ca.location": "/ca.pem"})


def test_the_broker_address_and_the_bare_message_are_taken_apart() -> None:
    assert diagnose.broker_address(VERIFY) == ("127.0.0.1", 35081)
    assert diagnose.broker_address(TOKEN) is None
    assert diagnose.tidy(SCRAM).startswith("SASL authentication error: Authentication")
    assert "after" not in diagnose.tidy(SCRAM)


@pytest.mark.parametrize(("verdict", "says"), [
    ("IP address mismatch, certificate is not valid for '127.0.0.1'.",
     "not valid for 127.0.0.1 (IP address mismatch): connect to a name"),
    ("Hostname mismatch, certificate is not valid for 'kafka'.",
     "not valid for 127.0.0.1 (Hostname mismatch)"),
    ("unable to get local issuer certificate",
     "not signed by a CA in the CA file ssl.ca.location (/etc/kafka/ca.pem)"),
    ("self-signed certificate in certificate chain", "not signed by a CA in the CA file"),
    ("certificate has expired", "the broker's certificate has expired"),
    (None, "could not be verified with the CA file ssl.ca.location (/etc/kafka/ca.pem)"),
])
def test_certificate_verify_failed_is_told_apart_by_the_probe(verdict: str | None,
                                                              says: str) -> None:
    line = diagnose.from_error(TLS, VERIFY, Probe("127.0.0.1", True, verdict))
    assert line is not None and says in line, line
    assert "identification.algorithm" not in line  # never the advice to stop verifying


def test_without_a_ca_file_the_system_store_is_named() -> None:
    bare = ClientSettings.of("b:1", {"security.protocol": "SSL"})
    line = diagnose.from_error(bare, VERIFY, Probe("b", True, "unable to get local issuer"))
    assert line is not None and "system's CA certificates (ssl.ca.location is not set)" in line


def test_a_refused_client_certificate_names_it_or_its_absence() -> None:
    assert diagnose.from_error(TLS, REQUIRED) == (
        "TLS: the broker requires a client certificate (mTLS): set ssl.certificate.location "
        "and ssl.key.location")
    line = diagnose.from_error(MTLS, UNKNOWN)
    assert line is not None and line.startswith(
        "TLS: the broker refused the client certificate /etc/kafka/me.pem (TLS alert: "
        "certificate unknown); likely causes: it is not signed by a CA the broker trusts")
    assert diagnose.from_error(MTLS, UNKNOWN, expired_on="2020-01-02 00:00 UTC") == (
        "TLS: the broker refused the client certificate /etc/kafka/me.pem: it expired on "
        "2020-01-02 00:00 UTC")


def test_sasl_failures_name_the_mechanism_and_never_the_password() -> None:
    assert diagnose.from_error(SASL, SCRAM) == (
        "authentication failed: wrong user name or password for SASL mechanism SCRAM-SHA-256")
    line = diagnose.from_error(SASL, MECHANISM)
    assert line == ("authentication failed: the listener does not offer SASL mechanism "
                    "SCRAM-SHA-256 (it offers SCRAM-SHA-512): set sasl.mechanism")
    oauth = ClientSettings.of("b:1", {"sasl.oauthbearer.token.endpoint.url": "https://idp/t",
                                      "sasl.oauthbearer.client.secret": "x"})
    line = diagnose.from_error(oauth, TOKEN)
    assert line is not None and line.startswith(
        "authentication failed: the token endpoint https://idp/t issued no token")
    assert line.endswith('{"error": "invalid_client"}')


def test_unreadable_files_name_the_file() -> None:
    line = diagnose.from_error(MTLS, KEY)
    assert line is not None and line.startswith(
        "TLS: cannot use the private key ssl.key.location (/etc/kafka/me.key): a wrong "
        "ssl.key.password")
    assert "k3y-s3cret" not in line
    ca = diagnose.from_error(TLS, "ssl.ca.location failed: error:05880020:x509 certificate "
                                  "routines::BIO lib")
    assert ca == ("TLS: cannot read the CA file ssl.ca.location (/etc/kafka/ca.pem): a "
                  "missing or non-PEM file")


def test_no_answer_says_which_protocol_the_listener_speaks() -> None:
    plain = ClientSettings("127.0.0.1:9093")
    line = diagnose.no_answer(plain, Probe("127.0.0.1", tls=True))
    assert line is not None and "speaks TLS but security.protocol is PLAINTEXT" in line
    line = diagnose.no_answer(TLS, Probe("127.0.0.1", tls=False))
    assert line is not None and "does not speak TLS but security.protocol is SSL" in line
    line = diagnose.no_answer(TLS, Probe("127.0.0.1", tls=True))
    assert line is not None and "listener wants SASL" in line
    assert diagnose.no_answer(plain, None) is None  # nobody there: the caller's own words
    assert diagnose.no_answer(plain, Probe("127.0.0.1", tls=False)) is None
    assert diagnose.from_error(plain, "Connection refused") is None


def test_expiry_is_read_from_the_certificate_file(tmp_path: Path) -> None:
    from kworkers.testing.tls import make_pki

    pki = make_pki(tmp_path / "pki")
    old, fresh = pki.expired("carol"), pki.client("dave")
    assert expired_on(str(old.cert)) == "2020-01-02 00:00 UTC"
    assert expired_on(str(fresh.cert)) is None
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=30)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", expired_on(str(fresh.cert), later)
                        or "")
    assert expired_on(str(tmp_path / "missing.pem")) is None

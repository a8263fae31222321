"""Why a client cannot talk to the cluster, in one line an operator can act on (pure).

librdkafka reports a failed TLS or SASL connection in words meant for its developers ("SSL
handshake failed: error:0A000086:SSL routines::certificate verify failed"), the same words for
a wrong CA and for a host name the certificate does not carry, and a client certificate the
broker refused only as a TLS alert (or, where TLS 1.3 closes first, as a disconnect). Each
function here takes what was seen (the client's error text, the settings, and where it helps
what ``kworkers.kafka.tls_probe`` found on the wire) and names the cause:

    TLS: the broker's certificate is not valid for 127.0.0.1 (IP address mismatch) ...
    TLS: the broker requires a client certificate: set ssl.certificate.location ...
    authentication failed: wrong user name or password for SASL mechanism SCRAM-SHA-512

Never a secret (the texts quoted come from the client or the broker, and every caller masks
the settings' secrets too), and never the advice to switch host name verification off (an
identification algorithm of "none"): kworkers never does that, nor suggests it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kworkers.kafka.settings import ClientSettings

#: a broker address inside a librdkafka error ("sasl_ssl://127.0.0.1:9093/bootstrap: ...")
_BROKER = re.compile(r"^[a-z_]+://(?P<host>\[[^\]]+\]|[^:/\s]+):(?P<port>\d+)(?:/\S*)?:\s*")
_AFTER = re.compile(r"\s*\(after \d+ms in state [A-Z_]+(?:, \d+ identical error\(s\) "
                    r"suppressed)?\)\s*$")
#: the TLS alert in an OpenSSL error ("tlsv13 alert certificate required: SSL alert number 116")
_ALERT = re.compile(r"alert (?P<alert>[a-z ]+?)\s*(?::|$)")


@dataclass(frozen=True)
class Probe:
    """What a direct TLS handshake with the broker showed (``tls_probe.probe``).

    ``tls``: the port answered a TLS handshake at all; ``verify``: OpenSSL's verdict on the
    broker's certificate with the client's CA file and host name (None: it verified);
    ``host``: the name or address that was checked."""

    host: str
    tls: bool
    verify: str | None = None
    detail: str = ""


def broker_address(text: str) -> tuple[str, int] | None:
    """The broker a librdkafka error names, as (host, port)."""
    m = _BROKER.match(text)
    return (m["host"].strip("[]"), int(m["port"])) if m else None


def tidy(text: str) -> str:
    """A librdkafka error without its broker prefix and "(after 12ms in state ...)" tail."""
    return _AFTER.sub("", _BROKER.sub("", text.strip(), count=1))


def _ssl(c: ClientSettings, key: str) -> str | None:
    value = c.security.get(key)
    return str(value) if value not in (None, "") else None


def _ca(c: ClientSettings) -> str:
    ca = _ssl(c, "ssl.ca.location")
    return f"the CA file ssl.ca.location ({ca})" if ca else (
        "the system's CA certificates (ssl.ca.location is not set)")


def server_certificate(c: ClientSettings, probe: Probe | None) -> str:
    """The cause of "certificate verify failed" (the broker's certificate), from the probe."""
    why = (probe.verify or "") if probe is not None else ""
    low = why.lower()
    host = probe.host if probe is not None else "the broker"
    if "mismatch" in low:
        return (f"TLS: the broker's certificate is not valid for {host} "
                f"({why.split(',')[0].strip()}): connect to a "
                "name or address the certificate carries, or have the certificate reissued "
                "with this one in its subjectAltName")
    if "expired" in low:
        return "TLS: the broker's certificate has expired; the broker must renew it"
    if "not yet valid" in low:
        return "TLS: the broker's certificate is not valid yet (check the clocks)"
    if any(s in low for s in ("issuer", "self-signed", "self signed", "first certificate")):
        return (f"TLS: the broker's certificate is not signed by a CA in {_ca(c)} ({why}); "
                "point ssl.ca.location at the CA that signed the broker's certificate")
    tail = f" ({why})" if why else ""
    return (f"TLS: the broker's certificate could not be verified with {_ca(c)}{tail}")


def client_certificate(c: ClientSettings, alert: str, expired_on: str | None) -> str:
    """The cause of a TLS alert the broker sent about the client's certificate (or its
    absence)."""
    cert = _ssl(c, "ssl.certificate.location")
    if cert is None and _ssl(c, "ssl.certificate.pem") is None and _ssl(
            c, "ssl.keystore.location") is None:
        return ("TLS: the broker requires a client certificate (mTLS): set "
                "ssl.certificate.location and ssl.key.location")
    mine = f"the client certificate {cert}" if cert else "the client certificate"
    if expired_on is not None:
        return f"TLS: the broker refused {mine}: it expired on {expired_on}"
    return (f"TLS: the broker refused {mine} (TLS alert: {alert}); likely causes: it is not "
            "signed by a CA the broker trusts, it expired or is not valid yet, or it is not "
            "for client authentication")


def from_error(c: ClientSettings, text: str, probe: Probe | None = None,
               expired_on: str | None = None) -> str | None:
    """The cause of one client error, or None when it names nothing specific (a plain
    disconnect, a timeout: see ``no_answer``)."""
    low = text.lower()
    body = tidy(text)
    if "certificate verify failed" in low:
        return server_certificate(c, probe)
    m = _ALERT.search(low)
    if m is not None and "ssl" in low:
        alert = m["alert"].strip()
        if alert in ("certificate required", "certificate unknown", "bad certificate",
                     "certificate expired", "certificate revoked", "unknown ca",
                     "unsupported certificate", "access denied"):
            return client_certificate(c, alert, expired_on)
        if alert in ("handshake failure", "protocol version", "insufficient security"):
            return (f"TLS: the broker and this client share no TLS version or cipher "
                    f"(TLS alert: {alert})")
    if "wrong version number" in low or "packet length too long" in low or (
            "http request" in low):
        return (f"TLS: the listener does not speak TLS (security.protocol="
                f"{c.security.get('security.protocol', 'PLAINTEXT')}); a PLAINTEXT or "
                "SASL_PLAINTEXT listener wants security.protocol without SSL")
    for key, what in (("ssl.ca.location", "the CA file"),
                      ("ssl.certificate.location", "the client certificate"),
                      ("ssl.key.location", "the private key")):
        if f"{key} failed" in low:
            path = _ssl(c, key) or "?"
            if key == "ssl.key.location":
                return (f"TLS: cannot use the private key ssl.key.location ({path}): a wrong "
                        "ssl.key.password, a file that is not a PEM key, or a key that does "
                        "not match ssl.certificate.location")
            return f"TLS: cannot read {what} {key} ({path}): a missing or non-PEM file"
    return _sasl(c, body, low)


def _sasl(c: ClientSettings, body: str, low: str) -> str | None:
    mechanism = str(c.security.get("sasl.mechanism", c.security.get("sasl.mechanisms", "")))
    if "failed to acquire sasl oauthbearer token" in low:
        url = c.security.get("sasl.oauthbearer.token.endpoint.url", "?")
        answer = body.partition("token:")[2].strip()
        return ("authentication failed: the token endpoint "
                f"{url} issued no token (sasl.oauthbearer.client.id and client.secret, or "
                f"the endpoint itself){': ' + answer if answer else ''}")
    if "unsupported sasl mechanism" in low:
        offered = body.rpartition(":")[2].strip()
        return (f"authentication failed: the listener does not offer SASL mechanism "
                f"{mechanism or '?'} (it offers {offered}): set sasl.mechanism")
    if "invalid credentials" in low or "invalid username or password" in low:
        return (f"authentication failed: wrong user name or password for SASL mechanism "
                f"{mechanism or '?'}")
    if "oauthbearer" in mechanism.lower() and "authentication" in low:
        return ("authentication failed: the broker refused the OAUTHBEARER token (its "
                f"signature, audience, issuer, scope or expiry): {body}")
    if "authentication" in low or "sasl" in low:
        return f"authentication failed: {body}"
    return None


def protocol_mismatch(c: ClientSettings, probe: Probe | None) -> str | None:
    """A client that speaks plaintext to a TLS listener, or TLS to a plaintext one: certain
    from one handshake, so said at once (librdkafka only reports "all brokers are down")."""
    protocol = str(c.security.get("security.protocol", "PLAINTEXT")).upper()
    if probe is None:
        return None
    tls_wanted = protocol in ("SSL", "SASL_SSL")
    if probe.tls and not tls_wanted:
        return (f"the listener speaks TLS but security.protocol is {protocol}: set "
                "security.protocol=SSL (or SASL_SSL with SASL credentials)")
    if not probe.tls and tls_wanted:
        return (f"the listener does not speak TLS but security.protocol is {protocol}: use "
                "PLAINTEXT or SASL_PLAINTEXT for it, or the cluster's TLS listener")
    return None


def no_answer(c: ClientSettings, probe: Probe | None) -> str | None:
    """The likely cause when the broker answered nothing kworkers could use within the timeout
    and the client named no cause: a protocol that does not match the listener."""
    protocol = str(c.security.get("security.protocol", "PLAINTEXT")).upper()
    mismatch = protocol_mismatch(c, probe)
    if mismatch is not None or probe is None:
        return mismatch
    if probe.tls and protocol == "SSL":
        return ("the broker closed the connection after the TLS handshake; likely causes: the "
                "listener wants SASL (security.protocol=SASL_SSL with credentials), or it "
                "refused the client certificate")
    return None

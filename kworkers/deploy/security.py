"""How a rendered worker pool reaches a secured cluster: one value, decided and checked once.

Why a value of its own: the ConfigMap, the Deployment, the KEDA triggers and their
TriggerAuthentication must agree on the security protocol, the SASL mechanism and where each
credential comes from, and each of them used to guess it on its own (``--sasl-secret`` alone
meant SASL_PLAINTEXT: the password in clear, with a comment that stayed wrong for SASL_SSL).

Where credentials come from, by how the client reads them:

- the SASL password (or OAUTHBEARER's client secret) is a value librdkafka reads, so it comes
  from the SASL Secret as a variable (``secretKeyRef``: never in the ConfigMap), keys
  ``username`` and ``password`` (for OAUTHBEARER: the client id and the client secret);
- certificates and keys are files librdkafka reads, so the TLS Secret is mounted as files,
  read-only, group-readable by the pod's group only (``fsGroup``), under ``TLS_DIR``:
  ``ca.crt`` (the CA that signed the brokers' certificates) and, for mTLS, ``tls.crt`` and
  ``tls.key`` (the layout of a cert-manager Certificate's Secret). The ConfigMap says where.

Refused: SASL over plaintext unless asked for (``plaintext_sasl``), a TLS Secret on a
plaintext protocol, a client certificate without a TLS Secret, OAUTHBEARER without a token
endpoint. Nothing here switches host name verification off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kworkers.config import WorkerConfig
from kworkers.deploy import env as envvars
from kworkers.errors import ConfigError

#: where the TLS Secret is mounted in the worker container
TLS_DIR = "/etc/kworkers/tls"
CA_KEY, CERT_KEY, KEY_KEY = "ca.crt", "tls.crt", "tls.key"
#: the pods' user and group (the Deployment's securityContext)
POD_UID = 10001

#: librdkafka's sasl.mechanism -> KEDA's ``sasl`` metadata
_KEDA_SASL = {"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256",
              "SCRAM-SHA-512": "scram_sha512", "OAUTHBEARER": "oauthbearer", "GSSAPI": "gssapi"}


@dataclass(frozen=True)
class DeploySecurity:
    protocol: str
    mechanism: str | None = None  # the SASL mechanism; None without SASL
    sasl_secret: str | None = None
    tls_secret: str | None = None
    client_certificate: bool = False
    #: OAUTHBEARER's scope is set (KEDA reads it from the ConfigMap too)
    oauth_scope: bool = False

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    @property
    def oauth(self) -> bool:
        return (self.mechanism or "").upper() == "OAUTHBEARER"

    @property
    def keda_auth(self) -> bool:
        """Whether KEDA needs a TriggerAuthentication (credentials or a CA to read)."""
        return self.sasl_secret is not None or self.tls_secret is not None

    def keda_sasl(self) -> str | None:
        if self.mechanism is None:
            return None
        m = self.mechanism.upper()
        return _KEDA_SASL.get(m, m.lower().replace("-", "_"))

    # --- the ConfigMap, the container ----------------------------------------------------

    def configmap_vars(self) -> dict[str, str]:
        data: dict[str, str] = {}
        if self.protocol != "PLAINTEXT":
            data[envvars.SECURITY_PROTOCOL] = self.protocol
        if self.mechanism is not None:
            data[envvars.SASL_MECHANISM] = self.mechanism
        if self.tls_secret is not None:
            data[envvars.SSL_CA_LOCATION] = f"{TLS_DIR}/{CA_KEY}"
            if self.client_certificate:
                data[envvars.SSL_CERTIFICATE_LOCATION] = f"{TLS_DIR}/{CERT_KEY}"
                data[envvars.SSL_KEY_LOCATION] = f"{TLS_DIR}/{KEY_KEY}"
        return data

    def secret_env(self) -> list[dict[str, Any]]:
        """The container's variables from the SASL Secret."""
        if self.sasl_secret is None:
            return []
        pairs = ((envvars.OAUTH_CLIENT_ID, "username"), (envvars.OAUTH_CLIENT_SECRET, "password")
                 ) if self.oauth else ((envvars.SASL_USERNAME, "username"),
                                       (envvars.SASL_PASSWORD, "password"))
        return [{"name": var, "valueFrom": {"secretKeyRef": {"name": self.sasl_secret,
                                                             "key": key}}}
                for var, key in pairs]

    def volume(self) -> dict[str, Any] | None:
        """The TLS Secret as a volume: only the keys the client reads (a missing one stops the
        pod at mount time, named, instead of a TLS error later), mode 0440."""
        if self.tls_secret is None:
            return None
        keys = [CA_KEY, *((CERT_KEY, KEY_KEY) if self.client_certificate else ())]
        return {"name": "kafka-tls", "secret": {
            "secretName": self.tls_secret, "defaultMode": 0o440,
            "items": [{"key": k, "path": k} for k in keys]}}

    def volume_mount(self) -> dict[str, Any] | None:
        if self.tls_secret is None:
            return None
        return {"name": "kafka-tls", "mountPath": TLS_DIR, "readOnly": True}

    # --- KEDA ----------------------------------------------------------------------------

    def triggerauth_spec(self, configmap: str) -> dict[str, Any]:
        refs: list[dict[str, str]] = []
        if self.sasl_secret is not None:
            refs += [{"parameter": p, "name": self.sasl_secret, "key": p}
                     for p in ("username", "password")]
        if self.tls_secret is not None:
            refs.append({"parameter": "ca", "name": self.tls_secret, "key": CA_KEY})
            if self.client_certificate:
                refs += [{"parameter": "cert", "name": self.tls_secret, "key": CERT_KEY},
                         {"parameter": "key", "name": self.tls_secret, "key": KEY_KEY}]
        spec: dict[str, Any] = {"secretTargetRef": refs}
        if self.oauth:
            spec["configMapTargetRef"] = [
                {"parameter": "oauthTokenEndpointUri", "name": configmap,
                 "key": envvars.OAUTH_TOKEN_ENDPOINT}]
            if self.oauth_scope:
                spec["configMapTargetRef"].append(
                    {"parameter": "scopes", "name": configmap, "key": envvars.OAUTH_SCOPE})
        return spec

    # --- what the comments say -----------------------------------------------------------

    def describe(self) -> str:
        """One sentence: how the pods connect, and where their credentials come from."""
        how = f"The pods connect with security.protocol {self.protocol}"
        if self.mechanism is not None:
            how += f", SASL mechanism {self.mechanism}"
        parts = [how + "."]
        if self.sasl_secret is not None:
            names = ("The OAUTHBEARER client id and secret" if self.oauth
                     else "The SASL user name and password")
            parts.append(f"{names} come from the Secret {self.sasl_secret} (keys username, "
                         "password) as variables, never from this ConfigMap.")
        if self.tls_secret is not None:
            files = "ca.crt, tls.crt and tls.key" if self.client_certificate else "ca.crt"
            parts.append(f"The Secret {self.tls_secret} is mounted read-only as files ({files}; "
                         f"defaultMode 288 = 0440, readable by the pod's group only) under "
                         f"{TLS_DIR}, where the client reads them.")
        if self.protocol == "SASL_PLAINTEXT":
            parts.append("SASL_PLAINTEXT was asked for explicitly (--allow-plaintext-sasl): "
                         "the password crosses the network in clear.")
        return " ".join(parts)


def deploy_security(config: WorkerConfig, sasl_secret: str | None, tls_secret: str | None,
                    client_certificate: bool, plaintext_sasl: bool) -> DeploySecurity:
    """The pods' security, from the worker's client settings and the Secrets named; refuses
    what would be unsafe or would not work (see the module docstring)."""
    props = config.client_config  # as given: ClientSettings' own defaults decide nothing here
    given = props.get("security.protocol")
    protocol = str(given).upper() if given else None
    mechanism: str | None = None
    if sasl_secret is not None:
        mechanism = str(props.get("sasl.mechanism", props.get("sasl.mechanisms", "PLAIN")))
        if protocol is None:
            protocol = "SASL_PLAINTEXT" if plaintext_sasl else "SASL_SSL"
        if not protocol.startswith("SASL_"):
            raise ConfigError(f"--sasl-secret with security.protocol={protocol}: SASL needs "
                              "SASL_SSL (or SASL_PLAINTEXT)")
        if protocol == "SASL_PLAINTEXT" and not plaintext_sasl:
            raise ConfigError("security.protocol=SASL_PLAINTEXT sends the SASL password over "
                              "the network in clear: use SASL_SSL (-X security.protocol="
                              "SASL_SSL), or pass --allow-plaintext-sasl to accept that")
    elif protocol is None:
        protocol = "SSL" if tls_secret is not None else "PLAINTEXT"
    if tls_secret is not None and not protocol.endswith("SSL"):
        raise ConfigError(f"--tls-secret with security.protocol={protocol}: certificates need "
                          "SSL or SASL_SSL")
    if client_certificate and tls_secret is None:
        raise ConfigError("--tls-client-cert reads tls.crt and tls.key from the TLS Secret: "
                          "pass --tls-secret")
    if tls_secret is not None:
        carried = sorted(k for k in envvars.TLS_FILES if k in props)
        if carried:
            raise ConfigError(f"the worker's client settings name {carried} and --tls-secret "
                              "mounts them: say one")
    sec = DeploySecurity(protocol, mechanism, sasl_secret, tls_secret, client_certificate,
                         bool(props.get("sasl.oauthbearer.scope")))
    if sec.oauth and not props.get("sasl.oauthbearer.token.endpoint.url"):
        raise ConfigError("OAUTHBEARER: set sasl.oauthbearer.method=oidc and "
                          "sasl.oauthbearer.token.endpoint.url (the pods and KEDA fetch their "
                          "tokens there)")
    return sec

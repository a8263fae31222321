"""An OpenID Connect token endpoint and its JWKS, served by the test itself on loopback.

Why not the broker's unsecured validator: it accepts any unsigned token, so it tests only the
plumbing. With OIDC (KIP-768) the client fetches a signed JWT from a token endpoint with its
client id and secret (the client-credentials grant), and the broker checks the signature
against the keys at a JWKS URL, the expiry, the audience and the issuer. This module is both
sides' counterpart: ``POST /token`` issues an RS256 JWT for a known client (``sub`` = the
client id, which the broker's authorizer sees as ``User:<client id>``); a wrong secret gets
401; ``GET /jwks`` serves the public key. Kafka 4 fetches a JWKS URL only when it is listed in
the broker JVM's ``org.apache.kafka.sasl.oauthbearer.allowed.urls`` system property
(``allowed_urls_opt``).

Signing uses the system's ``openssl`` (no Python crypto dependency for a test helper). Every
token issued and refused is counted, so a test can prove the client really went through here.
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

ISSUER = "https://kworkers-test-idp.invalid"
AUDIENCE = "kafka"
ALLOWED_URLS_PROPERTY = "org.apache.kafka.sasl.oauthbearer.allowed.urls"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _openssl(*args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=True,
                          timeout=60).stdout


class Idp:
    """The token endpoint and JWKS of ``clients`` (client id -> secret); ``start`` serves."""

    def __init__(self, key_dir: Path, clients: dict[str, str], lifetime_s: int = 3600) -> None:
        self.clients = dict(clients)
        self.lifetime_s = lifetime_s
        self.key = key_dir / "idp-signing.key"
        if not self.key.exists():
            _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                     "-out", str(self.key))
        modulus = _openssl("rsa", "-in", str(self.key), "-noout", "-modulus").decode()
        n = bytes.fromhex(modulus.strip().partition("=")[2])
        self.jwks = {"keys": [{"kty": "RSA", "kid": "kw-test-1", "use": "sig", "alg": "RS256",
                               "n": _b64url(n), "e": _b64url((65537).to_bytes(3, "big"))}]}
        self.issued: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self._server: ThreadingHTTPServer | None = None

    # --- what a client and the broker are told -----------------------------------------------

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def token_url(self) -> str:
        return f"{self.base_url}/token"

    @property
    def jwks_url(self) -> str:
        return f"{self.base_url}/jwks"

    def allowed_urls_opt(self) -> str:
        """The broker JVM option that lets it fetch this JWKS (Kafka 4 refuses any other)."""
        return f"-D{ALLOWED_URLS_PROPERTY}={self.jwks_url}"

    # --- tokens ------------------------------------------------------------------------------

    def token(self, subject: str, scope: str = "kafka") -> str:
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT", "kid": "kw-test-1"}
        claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": subject, "scope": scope,
                  "iat": now, "nbf": now - 5, "exp": now + self.lifetime_s}
        signing_input = ".".join(_b64url(json.dumps(part, separators=(",", ":")).encode())
                                 for part in (header, claims))
        signature = _openssl("dgst", "-sha256", "-sign", str(self.key),
                             stdin=signing_input.encode())
        return f"{signing_input}.{_b64url(signature)}"

    def _grant(self, client_id: str | None, secret: str | None) -> dict[str, Any] | None:
        if client_id is None or self.clients.get(client_id) != secret:
            self.refused[client_id or ""] += 1
            return None
        self.issued[client_id] += 1
        return {"access_token": self.token(client_id), "token_type": "bearer",
                "expires_in": self.lifetime_s}

    # --- the HTTP side -----------------------------------------------------------------------

    def start(self) -> Idp:
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return None

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/jwks":
                    self._send(200, idp.jwks)
                else:
                    self._send(404, {"error": "not_found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode())
                client_id: str | None = next(iter(form.get("client_id", [])), None)
                secret: str | None = next(iter(form.get("client_secret", [])), None)
                auth = self.headers.get("Authorization") or ""
                if auth.lower().startswith("basic "):
                    text = base64.b64decode(auth[6:].strip()).decode()
                    client_id, _, secret = text.partition(":")
                if self.path.split("?")[0] != "/token" or (form.get("grant_type") or [""])[
                        0] != "client_credentials":
                    self._send(400, {"error": "unsupported_grant_type"})
                    return
                granted = idp._grant(client_id, secret)
                if granted is None:
                    self._send(401, {"error": "invalid_client"})
                else:
                    self._send(200, granted)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="kworkers-test-idp",
                         daemon=True).start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

"""A certificate authority and certificates made at test time with the system's ``openssl``.

Why at test time and never committed: a key in the repository is a key anybody may use, and a
certificate committed today expires in the middle of somebody's CI run next year. Each test
session makes its own, in a temporary directory, in well under a second (EC P-256 keys).

What the security tests need, one file each (PEM):

- ``ca``: the CA every good certificate is signed by (what a client's ``ssl.ca.location`` and
  the broker's truststore name); ``other_ca``: an unrelated CA (the "wrong CA" case);
- ``server``: the broker's key and certificate chain in one file (Kafka's PEM keystore), for
  ``127.0.0.1`` and ``localhost``; ``wrong_host``: the same for a name that is not this host,
  so a client that verifies host names is refused and one that does not is let in (the canary
  that proves the check has teeth);
- per client name: a certificate (``CN=<name>``) and its key, encrypted with a password when
  one is given (what ``ssl.key.password`` is for); ``expired(name)``: one whose validity ended
  before the test started.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

#: ``openssl ca`` needs a configuration; this one signs whatever request it is given, with the
#: extensions of the section ``-extensions`` names (the SANs come from ``-extfile``).
_CA_CONF = """\
[ca]
default_ca = kw
[kw]
dir = {dir}
database = {dir}/index.txt
new_certs_dir = {dir}/issued
serial = {dir}/serial
default_md = sha256
policy = anything
copy_extensions = none
unique_subject = no
[anything]
commonName = supplied
organizationName = optional
"""


def _openssl(*args: str, stdin: bytes | None = None) -> bytes:
    try:
        out = subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=True,
                             timeout=60)
    except FileNotFoundError:
        raise RuntimeError("openssl is missing: apt-get install openssl") from None
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"openssl {args[0]} failed: {exc.stderr.decode(errors='replace')}"
                           ) from None
    return out.stdout


@dataclass(frozen=True)
class ClientCert:
    cert: Path
    key: Path
    password: str | None = None


@dataclass(frozen=True)
class Pki:
    """Files of one test session's PKI, all under ``dir`` (see the module docstring)."""

    dir: Path
    ca: Path
    other_ca: Path
    server: Path
    wrong_host: Path

    def client(self, name: str, password: str | None = None) -> ClientCert:
        """A client certificate for ``CN=name`` signed by ``ca`` (made once, then reused)."""
        return _issue(self, name, password, expired=False)

    def expired(self, name: str) -> ClientCert:
        """A client certificate for ``CN=name`` that expired in 2020."""
        return _issue(self, name, None, expired=True)

    def untrusted(self, name: str) -> ClientCert:
        """A client certificate for ``CN=name`` signed by ``other_ca`` (not trusted)."""
        return _issue(self, name, None, expired=False, ca="other")


def _key(path: Path, password: str | None = None) -> Path:
    args = ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-out", str(path)]
    if password is not None:
        args += ["-aes-256-cbc", "-pass", "stdin"]
    _openssl(*args, stdin=None if password is None else password.encode() + b"\n")
    path.chmod(0o600)
    return path


def _make_ca(dir: Path, name: str) -> Path:
    ca_dir = dir / name
    (ca_dir / "issued").mkdir(parents=True)
    (ca_dir / "index.txt").write_text("")
    (ca_dir / "serial").write_text("1000\n")
    (ca_dir / "openssl.cnf").write_text(_CA_CONF.format(dir=ca_dir))
    key = _key(ca_dir / "ca.key")
    cert = ca_dir / "ca.pem"
    _openssl("req", "-x509", "-new", "-key", str(key), "-subj", f"/CN=kworkers test {name}",
             "-days", "2", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", str(cert))
    return cert


def _sign(pki_dir: Path, ca: str, csr: Path, out: Path, extensions: str,
          dates: tuple[str, str] | None) -> None:
    ca_dir = pki_dir / ca
    ext = out.with_suffix(".ext")
    ext.write_text(f"[ext]\nbasicConstraints=CA:FALSE\n{extensions}\n")
    args = ["ca", "-batch", "-notext", "-config", str(ca_dir / "openssl.cnf"),
            "-keyfile", str(ca_dir / "ca.key"), "-cert", str(ca_dir / "ca.pem"),
            "-in", str(csr), "-out", str(out), "-extfile", str(ext), "-extensions", "ext"]
    args += ["-startdate", dates[0], "-enddate", dates[1]] if dates else ["-days", "2"]
    _openssl(*args)


def _cert(pki_dir: Path, name: str, cn: str, extensions: str, *, ca: str = "ca",
          password: str | None = None, dates: tuple[str, str] | None = None
          ) -> tuple[Path, Path]:
    key = _key(pki_dir / f"{name}.key", password)
    csr = pki_dir / f"{name}.csr"
    req = ["req", "-new", "-key", str(key), "-subj", f"/CN={cn}", "-out", str(csr)]
    if password is not None:
        req += ["-passin", "stdin"]
    _openssl(*req, stdin=None if password is None else password.encode() + b"\n")
    cert = pki_dir / f"{name}.pem"
    _sign(pki_dir, ca, csr, cert, extensions, dates)
    return cert, key


def _keystore(pki_dir: Path, name: str, sans: str) -> Path:
    """A broker's PEM keystore: its (unencrypted PKCS#8) key, then its certificate."""
    cert, key = _cert(pki_dir, name, "kafka", f"subjectAltName={sans}\n"
                      "extendedKeyUsage=serverAuth")
    store = pki_dir / f"{name}.keystore.pem"
    store.write_bytes(key.read_bytes() + cert.read_bytes())
    store.chmod(0o644)  # the broker in its container reads it as another user
    return store


def _issue(pki: Pki, name: str, password: str | None, *, expired: bool,
           ca: str = "ca") -> ClientCert:
    tag = (f"client-{name}" + ("-expired" if expired else "") + ("-other" if ca != "ca" else "")
           + ("-encrypted" if password is not None else ""))
    cert, key = pki.dir / f"{tag}.pem", pki.dir / f"{tag}.key"
    if not cert.exists():
        dates = ("20200101000000Z", "20200102000000Z") if expired else None
        _cert(pki.dir, tag, name, "extendedKeyUsage=clientAuth", ca=ca, password=password,
              dates=dates)
    return ClientCert(cert, key, password)


def make_pki(dir: Path) -> Pki:
    """A CA, an unrelated CA, and the broker's two keystores, under ``dir`` (created)."""
    dir.mkdir(parents=True, exist_ok=True)
    ca = _make_ca(dir, "ca")
    other = _make_ca(dir, "other")
    server = _keystore(dir, "server", "IP:127.0.0.1,DNS:localhost")
    wrong = _keystore(dir, "wrong-host", "DNS:kafka.elsewhere.invalid")
    for path in (ca, other):
        path.chmod(0o644)
    return Pki(dir, ca, other, server, wrong)

"""Keys and certificates for the local API server (``k8s.localapi``), made with ``openssl``.

Everything is throw-away and lives in one folder (mode 0700): a CA, a serving certificate for
127.0.0.1/localhost signed by it, the service-account signing key pair, and a static token file
whose one entry is the admin (group ``system:masters``). Nothing here is for production.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from recovery.errors import ClusterError

ADMIN_USER = "recover-admin"
ADMIN_GROUP = "system:masters"
_DAYS = "3650"


@dataclass(frozen=True)
class Pki:
    """Paths of the files :func:`make_pki` writes into ``root``."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.root / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.root / "server.key"

    @property
    def sa_key(self) -> Path:
        """Private key the API server signs ServiceAccount tokens with."""
        return self.root / "sa.key"

    @property
    def sa_pub(self) -> Path:
        """Public half, which the API server verifies ServiceAccount tokens with."""
        return self.root / "sa.pub"

    @property
    def token_file(self) -> Path:
        """``--token-auth-file``: ``token,user,uid,"groups"`` lines."""
        return self.root / "tokens.csv"

    def admin_token(self) -> str:
        """The admin's bearer token (read from :attr:`token_file`)."""
        return self.token_file.read_text().split(",", 1)[0]

    def complete(self) -> bool:
        files = (self.ca_cert, self.server_cert, self.server_key, self.sa_key, self.sa_pub)
        return all(p.exists() for p in files) and self.token_file.exists()


def make_pki(root: Path) -> Pki:
    """Write a fresh CA, serving certificate, service-account key pair and admin token into
    ``root`` (created, mode 0700), unless a complete set is already there. Takes about 0.3 s.

    Raises ClusterError when ``openssl`` is missing or fails (its message included).
    """
    pki = Pki(root)
    if pki.complete():
        return pki
    if shutil.which("openssl") is None:
        raise ClusterError("openssl is not installed (apt-get install openssl)")
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", _DAYS,
             "-keyout", pki.ca_key, "-out", pki.ca_cert, "-subj", "/CN=recover-local-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    csr = root / "server.csr"
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", pki.server_key, "-out", csr,
             "-subj", "/CN=kube-apiserver")  # fmt: skip
    ext = root / "server.ext"
    # 10.0.0.1 is the first address of --service-cluster-ip-range: the in-cluster
    # `kubernetes` Service the API server creates for itself.
    ext.write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
    )
    _openssl("x509", "-req", "-in", csr, "-CA", pki.ca_cert, "-CAkey", pki.ca_key,
             "-CAcreateserial", "-days", _DAYS, "-extfile", ext,
             "-out", pki.server_cert)  # fmt: skip
    _openssl("genrsa", "-out", pki.sa_key, "2048")
    _openssl("rsa", "-in", pki.sa_key, "-pubout", "-out", pki.sa_pub)
    token = secrets.token_urlsafe(32)
    pki.token_file.write_text(f'{token},{ADMIN_USER},{ADMIN_USER},"{ADMIN_GROUP}"\n')
    for p in root.iterdir():
        os.chmod(p, 0o600)
    return pki


def _openssl(*args: str | Path) -> None:
    argv = ["openssl", *map(str, args)]
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60)
    except subprocess.CalledProcessError as e:
        raise ClusterError(f"{' '.join(argv)} failed: {e.stderr.strip()}") from e
    except subprocess.TimeoutExpired as e:
        raise ClusterError(f"{' '.join(argv)} did not finish within 60 s") from e

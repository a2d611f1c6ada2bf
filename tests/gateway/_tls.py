"""A self-signed certificate for 127.0.0.1, made with openssl, as a private CA would issue."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_cert(where: Path, name: str = "server") -> tuple[Path, Path]:
    """(cert, key) PEM files for CN/SAN 127.0.0.1 under ``where``."""
    where.mkdir(parents=True, exist_ok=True)
    cert, key = where / f"{name}.crt", where / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
         "-out", str(cert)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key

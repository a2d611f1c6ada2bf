"""The server's TLS context for ``[tls]``, with errors that name the file and the key."""

from __future__ import annotations

import ssl

from gateway.config import TlsConfig
from gateway.errors import ConfigError

__all__ = ["server_ssl_context"]


def server_ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """The server's TLS context for ``[tls]``.

    Raises:
        ConfigError: the cert file holds no PEM certificate, or the key file no
            private key matching it (names the file and the key).
    """
    try:
        ssl.create_default_context().load_verify_locations(cafile=tls.cert)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(
            f"config 'tls.cert' has value {tls.cert!r}: not a readable PEM certificate ({exc})"
        ) from None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"config 'tls.key' has value {tls.key!r}: not a readable PEM private key "
            f"matching tls.cert {tls.cert!r} ({exc})"
        ) from None
    return context

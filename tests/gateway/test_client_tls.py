"""Both Python clients and the CLI against a gateway served over HTTPS by a private CA."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway import client as fg
from gateway.app import create_app
from gateway.cli import main
from gateway.client import FencegateClient, SyncFencegateClient
from tests._gateway import ServeServer
from tests.gateway._tls import make_cert
from tests.gateway.conftest import make_config


@pytest.fixture
def cert(tmp_path: Path) -> tuple[Path, Path]:
    return make_cert(tmp_path / "tls")


@pytest.fixture
async def https(gateway_server: ServeServer, cert: tuple[Path, Path], files_root: Path) -> str:
    """The base URL of a gateway (in-process locks, a files store) served over HTTPS."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*cert)
    stores = {"files": {"type": "files", "root": str(files_root)}}
    app = create_app(make_config(stores=stores), registry=CollectorRegistry())
    server = await gateway_server(app, ssl=context)
    return f"https://127.0.0.1:{server.port}"


async def test_async_client_trusts_a_ca_file_a_context_or_nothing(
    https: str, cert: tuple[Path, Path]
) -> None:
    async with FencegateClient(https) as system_trust:
        with pytest.raises(fg.GatewayUnavailable) as refused:
            await system_trust.inspect("x")
    assert "certificate" in refused.value.message.lower()
    context = ssl.create_default_context(cafile=str(cert[0]))
    for option in (str(cert[0]), cert[0], context, False):
        async with (
            FencegateClient(https, ssl=option) as client,
            client.lock("files/tls", ttl=5.0) as lease,
        ):
            assert await client.put("files", "tls", b"x", token=lease.token) == lease.token
            assert lease.valid_ms is not None
            assert 0 < lease.valid_ms <= 5000


async def test_sync_client_trusts_a_ca_file_a_context_or_nothing(
    https: str, cert: tuple[Path, Path]
) -> None:
    def use(option: fg.SslOption) -> int:
        with SyncFencegateClient(https, ssl=option) as client:
            lease = client.acquire("files/sync-tls", ttl=5.0)
            client.release(lease)
            return lease.token

    with pytest.raises(fg.GatewayUnavailable):
        await asyncio.to_thread(use, None)
    context = ssl.create_default_context(cafile=str(cert[0]))
    for option in (str(cert[0]), context, False):
        assert await asyncio.to_thread(use, option) > 0


def test_a_ca_file_that_is_not_a_certificate_is_refused_at_once(tmp_path: Path) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    for make in (FencegateClient, SyncFencegateClient):
        with pytest.raises(ValueError, match=r"ca\.pem"):
            make("https://127.0.0.1:1", ssl=garbage)
        with pytest.raises(ValueError, match="no such file"):
            make("https://127.0.0.1:1", ssl=tmp_path / "missing.pem")


async def test_cli_cacert_and_insecure(
    https: str, cert: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    def cli(*argv: str) -> int:
        return main([*argv, "--url", https])

    assert await asyncio.to_thread(cli, "status", "x") == 2  # no retry helps: exit 2
    err = capsys.readouterr().err
    assert "certificate" in err.lower()
    assert "--cacert FILE" in err
    assert await asyncio.to_thread(cli, "status", "x", "--cacert", str(cert[0])) == 0
    assert "x: free" in capsys.readouterr().out
    assert await asyncio.to_thread(cli, "status", "x", "--insecure") == 0
    assert "x: free" in capsys.readouterr().out
    assert await asyncio.to_thread(cli, "status", "x", "--cacert", "/nonexistent/ca.pem") == 2
    assert "no such file" in capsys.readouterr().err

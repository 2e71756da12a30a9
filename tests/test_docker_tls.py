"""A Docker engine over tcp:// with TLS, read from DOCKER_TLS_VERIFY / DOCKER_CERT_PATH as the CLI does.

The engine here listens on a unix socket only, so the test puts a TLS front of its own before it:
a proxy on 127.0.0.1 that requires a client certificate from the test's CA and passes the bytes
on to the socket. The machine's engine configuration is not touched.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docker_fixtures import backend_factory, engine_client, image_fixture, small_specs  # noqa: F401 - fixtures

from suite.environment.docker_engine import engine_answers, engine_facts

pytestmark = pytest.mark.docker

SOCKET = "/var/run/docker.sock"


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(folder: Path, name: str) -> None:
    folder.mkdir(parents=True)
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
        "-keyout", str(folder / "ca-key.pem"), "-out", str(folder / "ca.pem"),
    )  # fmt: skip


def issue(ca: Path, out: Path, name: str, extension: str) -> None:
    """A key and certificate signed by the CA in ``ca``: ``out/{name}.pem`` and ``out/{name}-key.pem``."""
    ext = out / f"{name}.ext"
    ext.write_text(extension + "\n")
    openssl(
        "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
        "-keyout", str(out / f"{name}-key.pem"), "-out", str(out / f"{name}.csr"),
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", str(out / f"{name}.csr"), "-CA", str(ca / "ca.pem"), "-CAkey", str(ca / "ca-key.pem"),
        "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(out / f"{name}.pem"),
    )  # fmt: skip


class TlsFront:
    """127.0.0.1:port, TLS with a required client certificate, bytes passed on to the engine's socket."""

    def __init__(self, certs: Path):
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(certs / "server.pem", certs / "server-key.pem")
        self.context.load_verify_locations(certs / "ca.pem")
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.port = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        assert self.ready.wait(10), "the TLS front did not start"

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._pass_on, "127.0.0.1", 0, ssl=self.context))
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()
        server.close()
        pending = asyncio.all_tasks(self.loop)  # connections still open: end them quietly
        for task in pending:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    async def _pass_on(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(SOCKET)
        except OSError:
            writer.close()
            return

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def tls_engine(tmp_path: Path, client: Any) -> Iterator[tuple[str, Path, Path]]:
    """(address, a cert folder trusting the engine's CA, one trusting another CA)."""
    ca, other = tmp_path / "ca", tmp_path / "other-ca"
    make_ca(ca, "suite test CA")
    make_ca(other, "some other CA")
    server = tmp_path / "server"
    server.mkdir()
    (server / "ca.pem").write_bytes((ca / "ca.pem").read_bytes())
    issue(ca, server, "server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth")
    good, wrong = tmp_path / "client", tmp_path / "client-wrong-ca"
    for folder, trusted in ((good, ca), (wrong, other)):
        folder.mkdir()
        issue(ca, folder, "cert", "extendedKeyUsage=clientAuth")  # signed by the engine's CA either way
        (folder / "key.pem").write_bytes((folder / "cert-key.pem").read_bytes())
        (folder / "ca.pem").write_bytes((trusted / "ca.pem").read_bytes())
    front = TlsFront(server)
    try:
        yield f"tcp://127.0.0.1:{front.port}", good, wrong
    finally:
        front.stop()


def test_run_over_tcp_with_tls_verified(tls_engine, backend, tmp_path: Path, monkeypatch) -> None:
    address, good, _ = tls_engine
    monkeypatch.setenv("DOCKER_CERT_PATH", str(good))
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    assert engine_facts(address)["link"] == "tls, server verified"
    result = backend(docker_host=address).run(small_specs(tmp_path)[0])
    assert result.status == "ok", (result.message, result.log_tail)
    assert result.run["daemon"] == address and result.run["daemon_link"] == "tls, server verified"


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # the unchecked case warns
def test_server_not_trusted_is_refused_when_verifying(tls_engine, monkeypatch) -> None:
    address, _, wrong = tls_engine
    monkeypatch.setenv("DOCKER_CERT_PATH", str(wrong))
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    assert engine_answers(address) is False
    assert "CERTIFICATE_VERIFY_FAILED" in engine_facts(address)["error"]
    # The CLI's rule: without DOCKER_TLS_VERIFY the server is not checked, and the record says so.
    monkeypatch.delenv("DOCKER_TLS_VERIFY")
    assert engine_answers(address) is True
    assert engine_facts(address)["link"] == "tls, server NOT verified"

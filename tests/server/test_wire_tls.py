"""The slice protocol inside TLS: pieces round trip, a plain client is refused,
and the cluster secret is still checked inside TLS."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.server.test_wire_limits import dribble

from shinglefs.server.auth import tls_client_context, tls_server_context
from shinglefs.server.errors import AuthFailed, ServerUnreachable
from shinglefs.server.node import StorageNode
from shinglefs.server.remote import RemoteNode
from shinglefs.server.service import SliceServer
from shinglefs.server.wire import NONCE_SIZE, Header, Kind

MiB = 1024 * 1024
SECRET = b"cluster secret of the tests, 32B"

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="needs the openssl command to make a certificate")


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[str, str]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=shinglefs-test", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True)
    return str(cert), str(key)


@pytest.fixture
def tls_server(tmp_path: Path, certificate: tuple[str, str]) -> Iterator[SliceServer]:
    node = StorageNode.open([(0, f"emulated:{tmp_path}/d.img:{256 * MiB}")], create=True,
                            zone_size=16 * MiB)
    with SliceServer(node, SECRET, ssl_context=tls_server_context(*certificate),
                     handshake_timeout=2.0) as server:
        yield server
    node.close()


def test_pieces_round_trip_inside_tls(tls_server: SliceServer,
                                      certificate: tuple[str, str]) -> None:
    blob = os.urandom(3 * MiB + 5)
    with RemoteNode(tls_server.address, SECRET, connections=2,
                    ssl_context=tls_client_context(certificate[0])) as client:
        futures = [client.submit_write(1, off, blob[off:off + MiB], group=1)
                   for off in range(0, len(blob), MiB)]
        for f in futures:
            f.result()
        assert client.read(1, 0, len(blob)) == blob


def test_plain_client_to_tls_server_is_refused(tls_server: SliceServer,
                                               caplog: pytest.LogCaptureFixture) -> None:
    with RemoteNode(tls_server.address, SECRET) as plain, \
            pytest.raises((ServerUnreachable, AuthFailed)):
        plain.ping()
    with socket.create_connection(tls_server.address, timeout=10) as sock:
        sock.sendall(Header(Kind.HELLO, payload_len=NONCE_SIZE).pack() + bytes(NONCE_SIZE))
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):  # at most a TLS alert, then the end
                received += chunk
        assert not received.startswith(b"SHFW")
    assert any("TLSError" in r.getMessage() for r in caplog.records
               if r.levelno >= logging.WARNING)


def test_secret_is_still_checked_inside_tls(tls_server: SliceServer,
                                            certificate: tuple[str, str]) -> None:
    with RemoteNode(tls_server.address, b"another secret of 32 bytes......",
                    ssl_context=tls_client_context(certificate[0])) as stranger, \
            pytest.raises(AuthFailed):
        stranger.ping()


def test_untrusted_server_certificate_is_refused(tls_server: SliceServer,
                                                 tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(other / "k.pem"),
                    "-out", str(other / "c.pem"), "-days", "1", "-subj", "/CN=other"],
                   check=True, capture_output=True)
    with RemoteNode(tls_server.address, SECRET,
                    ssl_context=tls_client_context(str(other / "c.pem"))) as client, \
            pytest.raises(ServerUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
        client.ping()


def test_a_peer_dribbling_inside_tls_is_dropped_within_the_handshake_timeout(
        tls_server: SliceServer, certificate: tuple[str, str]) -> None:
    """TLS done, then the HELLO a byte (a TLS record) at a time, each well within
    the timeout: the whole handshake is still bounded by handshake_timeout (2 s)."""
    hello = Header(Kind.HELLO, payload_len=NONCE_SIZE).pack() + os.urandom(NONCE_SIZE)
    context = tls_client_context(certificate[0])
    with context.wrap_socket(socket.create_connection(tls_server.address, timeout=10),
                             server_hostname="127.0.0.1") as sock:
        assert dribble(sock, hello, every_s=0.25, give_up_s=3.5) < 3.0
    with RemoteNode(tls_server.address, SECRET, connections=1, ssl_context=context) as client:
        client.ping()

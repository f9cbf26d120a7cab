"""Fixtures of the multi-host tests: test hosts as network namespaces.

- ``network`` (session): the hosts ``s1 s2 s3`` (storage servers) and ``a b``
  (clients) of tests/support/netns.py, checked to reach each other and the
  bridge; torn down at the end of the session, even after a failure or an
  interrupt (Ctrl-C or SIGTERM). Skipped, with the reason, only where ``ip netns`` is impossible
  (CAP_NET_ADMIN or CAP_SYS_ADMIN missing).
- ``cluster``: the same hosts for one test; every process the test started
  on them is stopped after it.
- ``pg`` (session): a private PostgreSQL that also listens on the bridge
  address, so a process on any host reaches it (``pg.url(db, host=...)``).
- ``secret_file``: a fresh cluster secret in a file (never on a command line).
- ``start_servers(names)``: one storage server per named host, each over its
  own emulated drives, all listening on ``hosts.SERVER_PORT`` of their host.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.cluster.hosts import CLIENTS, SERVERS, server_address  # noqa: E402
from tests.support.netns import Cluster, HostProcess, unavailable_reason  # noqa: E402
from tests.support.pgcluster import PgCluster, private_cluster  # noqa: E402
from tests.support.slice_server_main import server_command  # noqa: E402


@pytest.fixture(scope="session")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"test hosts need network namespaces: {reason}")
    # SIGTERM to the session tears down like Ctrl-C (pytest's teardown runs);
    # a SIGKILLed session leaves namespaces that the next one removes.
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
    cluster = Cluster.create([*SERVERS, *CLIENTS], tmp_path_factory.mktemp("hosts"))
    try:
        cluster.check_reachability()
        yield cluster
    finally:
        cluster.close()
        if previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture
def cluster(network: Cluster, tmp_path: Path) -> Iterator[Cluster]:
    network.use_log_dir(tmp_path / "hosts")  # <host>-<job>.out|.err of this test
    try:
        yield network
    finally:
        network.stop_processes()


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def pg(network: Cluster) -> Iterator[PgCluster]:
    with private_cluster(listen=[f"{network.bridge_address}/{network.subnet.prefixlen}"]) as server:
        yield server


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.secret"
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return path


@pytest.fixture
def start_servers(cluster: Cluster, tmp_path: Path,
                  secret_file: Path) -> Callable[..., dict[str, HostProcess]]:
    def start(*names: str) -> dict[str, HostProcess]:
        """Start (or restart over the same drives) a server on each host; wait for all."""
        procs = {name: cluster.spawn(name, server_command(
                     tmp_path / f"{name}-drives", server_address(cluster, name), secret_file),
                     label=f"{name}-server") for name in names}
        for proc in procs.values():
            proc.wait_line("ready")
        return procs

    return start


"""The test hosts of tests/cluster and the command lines run on them."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.netns import Cluster

SERVERS = ("s1", "s2", "s3")
CLIENTS = ("a", "b")
SERVER_PORT = 7400  # every host has its own port space
HOSTJOB = Path(__file__).resolve().with_name("hostjob.py")


def server_address(cluster: Cluster, host: str) -> str:
    """``ADDRESS:PORT`` of the storage server on ``host``."""
    return f"{cluster.host(host).address}:{SERVER_PORT}"


def hostjob(*args: str) -> list[str]:
    """The command line of a client host's job (tests/cluster/hostjob.py)."""
    return [sys.executable, str(HOSTJOB), *args]

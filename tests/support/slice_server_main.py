"""A storage server for the multi-host tests, until ``shinglefs server`` exists.

``python slice_server_main.py --dir DIR --listen HOST:PORT --secret-file FILE``
opens a ``StorageNode`` over emulated SMR drives ``DIR/d<i>.img`` (formatted
when absent, opened — recovered after a crash — when present), serves it
with ``SliceServer`` on HOST:PORT with the cluster secret read from FILE,
prints ``ready HOST:PORT`` on stdout once it accepts connections, and
serves until SIGTERM or SIGINT: then it stops serving, closes the node (every
buffered byte stored) and exits 0. Warnings (refused connections, named by
peer) go to stderr.

Tests build the command line with ``server_command`` only, so switching to
the real ``shinglefs server`` is a change of that one function.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

MiB = 1024 * 1024


def server_command(data_dir: Path, listen: str, secret_file: Path, *, drives: int = 2,
                   drive_mib: int = 256, zone_mib: int = 16) -> list[str]:
    """The command line of one storage server (the one place naming the launcher)."""
    return [sys.executable, str(Path(__file__).resolve()), "--dir", str(data_dir),
            "--listen", listen, "--secret-file", str(secret_file), "--drives", str(drives),
            "--drive-mib", str(drive_mib), "--zone-mib", str(zone_mib)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--listen", required=True, help="HOST:PORT")
    parser.add_argument("--secret-file", type=Path, required=True)
    parser.add_argument("--drives", type=int, default=2)
    parser.add_argument("--drive-mib", type=int, default=256)
    parser.add_argument("--zone-mib", type=int, default=16)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    from shinglefs.server.node import StorageNode
    from shinglefs.server.service import SliceServer

    host, _, port = args.listen.rpartition(":")
    secret = args.secret_file.read_bytes()
    args.dir.mkdir(parents=True, exist_ok=True)
    paths = [args.dir / f"d{i}.img" for i in range(args.drives)]
    specs = [(i, f"emulated:{p}:{args.drive_mib * MiB}") for i, p in enumerate(paths)]
    fresh = not any(p.exists() for p in paths)
    node = StorageNode.open(specs, create=fresh, zone_size=args.zone_mib * MiB if fresh else None)
    try:
        with SliceServer(node, secret, host=host.strip("[]"), port=int(port)) as server:
            print("ready {}:{}".format(*server.address), flush=True)
            stop.wait()
    finally:
        node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

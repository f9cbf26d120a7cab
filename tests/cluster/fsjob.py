"""What a client host does with a file system on storage servers: one job per process.

Run inside a test host's namespace (``Cluster.spawn``) as
``python fsjob.py JOB META_URL ...``; prints one JSON object on stdout and
exits 0 when the job ran to its end. File contents are deterministic
(``content(name, size)``), so any host can check what another wrote.

Jobs (each bounded by its file list):
- ``write URL NAME:SIZE ... [--writers W]``: W threads, each through the same
  ``connect()``, create, write and close the files; prints ``{"written": {name: sha256}}``.
- ``read URL NAME ...``: reads each file with a fresh ``connect()``; prints
  ``{"read": {name: sha256}}``.
- ``mount-write URL MNT NAME:SIZE ...`` / ``mount-read URL MNT NAME ...``: the same
  through a FUSE mount this job starts (``shinglefs mount --foreground``, a child
  in this host's mount namespace) and unmounts at the end.
- ``dcp-save URL MNT NAME WORKDIR`` / ``dcp-load ...``: a 2-rank
  ``torch.distributed.checkpoint`` (gloo) saved through a mount into
  ``ckpt/NAME.tmp`` and committed by renaming it to ``ckpt/NAME`` (then an fsync
  of the directory), or loaded from ``ckpt/NAME`` and compared with what was
  saved (``dcp_state``); prints ``{"saving": NAME}`` first, then ``{"saved": NAME}``,
  ``{"save_failed": REASON}`` or ``{"loaded": NAME}`` (a load that finds wrong
  values fails the job).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MiB = 1024 * 1024


def content(name: str, size: int) -> bytes:
    """The bytes every job writes and expects for file ``name``."""
    return random.Random(f"{name}:{size}").randbytes(size)


def _spec(text: str) -> tuple[str, int]:
    name, _, size = text.partition(":")
    return name, int(size)


def _shinglefs() -> list[str]:
    script = Path(sys.executable).with_name("shinglefs")
    return [str(script)] if script.exists() else [
        sys.executable, "-c", "from shinglefs.cli.main import main; main()"]


def job_write(url: str, specs: list[tuple[str, int]], writers: int) -> dict[str, str]:
    import shinglefs

    fs = shinglefs.connect(url)
    try:
        def one(spec: tuple[str, int]) -> tuple[str, str]:
            name, size = spec
            data = content(name, size)
            with fs.open(f"/{name}", "wb") as f:
                for at in range(0, size, 4 * MiB):
                    f.write(data[at:at + 4 * MiB])
            return name, hashlib.sha256(data).hexdigest()

        with ThreadPoolExecutor(max(1, writers)) as pool:
            return dict(pool.map(one, specs))
    finally:
        fs.close()


def job_read(url: str, names: list[str]) -> dict[str, str]:
    import shinglefs

    fs = shinglefs.connect(url)
    try:
        return {n: hashlib.sha256(fs.read_bytes(f"/{n}")).hexdigest() for n in names}
    finally:
        fs.close()


class Mount:
    """A foreground ``shinglefs mount`` child, up until ``close``."""

    def __init__(self, url: str, mountpoint: Path) -> None:
        mountpoint.mkdir(parents=True, exist_ok=True)
        self.mountpoint = mountpoint
        self.proc = subprocess.Popen([*_shinglefs(), "mount", url, str(mountpoint),
                                      "--foreground"], stdout=sys.stderr, stderr=sys.stderr)
        deadline = time.monotonic() + 60
        while not os.path.ismount(mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the mount did not come up (exit {self.proc.returncode})")
            time.sleep(0.05)

    def close(self) -> None:
        if os.path.ismount(self.mountpoint):
            subprocess.run(["fusermount3", "-u", str(self.mountpoint)], check=False)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def job_mount_write(url: str, mnt: Path, specs: list[tuple[str, int]]) -> dict[str, str]:
    mount = Mount(url, mnt)
    try:
        out = {}
        for name, size in specs:
            data = content(name, size)
            with open(mnt / name, "wb") as f:
                f.write(data)
            out[name] = hashlib.sha256(data).hexdigest()
        return out
    finally:
        mount.close()


def job_mount_read(url: str, mnt: Path, names: list[str]) -> dict[str, str]:
    mount = Mount(url, mnt)
    try:
        return {n: hashlib.sha256((mnt / n).read_bytes()).hexdigest() for n in names}
    finally:
        mount.close()


DCP_TENSORS = 4
DCP_ELEMENTS = 16 * MiB  # float32: 64 MiB a tensor, 256 MiB a rank


def dcp_state(rank: int, zeros: bool = False) -> dict[str, object]:
    """The state dict rank ``rank`` saves (deterministic) or loads into."""
    import torch

    return {f"rank{rank}.w{i}": (torch.zeros(DCP_ELEMENTS) if zeros else
                                 torch.arange(DCP_ELEMENTS, dtype=torch.float32) + 1000 * rank + i)
            for i in range(DCP_TENSORS)} | {"step": torch.tensor([7])}


def _dcp_rank(rank: int, world: int, directory: str, init_file: str, load: bool) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        if load:
            target = dcp_state(rank, zeros=True)
            dcp.load(target, storage_reader=dcp.FileSystemReader(directory))
            expected = dcp_state(rank)
            bad = [k for k in expected if not torch.equal(target[k], expected[k])]  # type: ignore[arg-type]
            if bad:
                raise RuntimeError(f"rank {rank} loaded wrong values for {bad}")
        else:
            dcp.save(dcp_state(rank), storage_writer=dcp.FileSystemWriter(directory))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def job_dcp(url: str, mnt: Path, name: str, load: bool, work: Path) -> dict[str, object]:
    """Save (into ``name.tmp``, then rename to ``name``: the commit) or load a
    2-rank torch.distributed.checkpoint through a mount."""
    import torch.multiprocessing as mp

    mount = Mount(url, mnt)
    try:
        final = mnt / "ckpt" / name
        rendezvous = work / f"rdv-{os.getpid()}"
        if load:
            mp.spawn(_dcp_rank, args=(2, str(final), str(rendezvous), True), nprocs=2)
            return {"loaded": name}
        staging = mnt / "ckpt" / f"{name}.tmp"
        staging.mkdir(parents=True)
        print(json.dumps({"saving": name}), flush=True)
        try:
            mp.spawn(_dcp_rank, args=(2, str(staging), str(rendezvous), False), nprocs=2)
        except Exception as exc:
            return {"save_failed": f"{type(exc).__name__}: {exc}"[:2000]}
        os.rename(staging, final)
        fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return {"saved": name}
    finally:
        mount.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("job", choices=["write", "read", "mount-write", "mount-read",
                                        "dcp-save", "dcp-load"])
    parser.add_argument("url")
    parser.add_argument("rest", nargs="+")
    parser.add_argument("--writers", type=int, default=1)
    args = parser.parse_args(argv)
    if args.job == "write":
        result = {"written": job_write(args.url, [_spec(s) for s in args.rest], args.writers)}
    elif args.job == "read":
        result = {"read": job_read(args.url, args.rest)}
    elif args.job in ("dcp-save", "dcp-load"):
        mnt, name, work = Path(args.rest[0]), args.rest[1], Path(args.rest[2])
        result = job_dcp(args.url, mnt, name, args.job == "dcp-load", work)
    elif args.job == "mount-write":
        result = {"written": job_mount_write(args.url, Path(args.rest[0]),
                                             [_spec(s) for s in args.rest[1:]])}
    else:
        result = {"read": job_mount_read(args.url, Path(args.rest[0]), args.rest[1:])}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

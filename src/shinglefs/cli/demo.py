"""``shinglefs demo``: the main job on the embedded default, end to end.

What it does, printing each step and its figures:

1. ``shinglefs up DATA_DIR MOUNTPOINT``: formats (first run) an embedded file
   system — SQLite metadata and emulated host-managed SMR drives on sparse
   files in DATA_DIR — and mounts it with FUSE.
2. Appends a tokenized pre-training corpus (uint16 token shards) to the mount.
   Pins it as ``corpus@v1`` (``shinglefs snapshot --read-only``: a versioned
   dataset sharing the data, which refuses every change, root's too) and
   appends one more shard to the corpus, which ``corpus@v1`` does not see.
3. Trains a small PyTorch model for a few steps with a ``DataLoader`` (2
   workers) reading the shards of ``corpus@v1``, checkpointing every few steps with
   ``torch.save`` into ``step-N/`` written under a temporary name and renamed
   into place (crash-safe commit); the file system keeps the last 2 steps
   (``shinglefs policy DIR --retention keep-last=2``) and deletes older ones.
4. Loads the newest checkpoint back and checks it bit-exactly.
5. Prints ``shinglefs status``: capacity, zones by condition, write
   amplification; then unmounts.

It needs /dev/fuse (the point is to show unchanged tools on a mount); without
it the command stops with a one-line error and a hint.

What it may delete: only what an earlier ``shinglefs demo`` made. DATA_DIR is
marked as the demo's (``DEMO_MARKER``) when the demo creates it or finds it
empty; ``--fresh`` then starts over inside it. A DATA_DIR that holds anything
else is refused (``PathError``) and left as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import typer

from shinglefs.errors import PathError, ShingleError

CORPUS_SHARDS = 8
SHARD_TOKENS = 4 * 1024 * 1024  # 8 MiB of uint16 tokens per shard
SEQ_LEN = 512
TRAIN_STEPS = 30
CHECKPOINT_EVERY = 10
KEEP_LAST = 2
DEMO_MARKER = ".shinglefs-demo"


def _shinglefs(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("shinglefs")
    cmd = [str(exe) if exe.exists() else "shinglefs", *args]
    done = subprocess.run(cmd, text=True, capture_output=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["(no output)"]
        raise ShingleError(f"`shinglefs {args[0]}` failed: {' / '.join(lines[-2:])}")
    return done


def _say(step: str, detail: str = "") -> None:
    typer.echo(f"[demo] {step}" + (f": {detail}" if detail else ""))


def write_corpus(root: Path, shards: range = range(CORPUS_SHARDS)) -> int:
    """Append token shards number ``shards`` under root/corpus; returns bytes written."""
    import numpy as np

    corpus = root / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    total = 0
    for i in shards:
        tokens = np.random.default_rng(i).integers(0, 50_000, SHARD_TOKENS, dtype=np.uint16)
        with open(corpus / f"shard-{i:05d}.bin", "wb") as f:
            f.write(tokens.tobytes())
            f.flush()
            os.fsync(f.fileno())
        total += tokens.nbytes
    return total


def pin_version(root: Path, version: str) -> Path:
    """Snapshot root/corpus as root/corpus@VERSION (read-only, sharing its data),
    then let the corpus move on by one shard; checks the version did not."""
    pinned = root / f"corpus@{version}"
    t0 = time.perf_counter()
    _shinglefs("snapshot", str(root / "corpus"), str(pinned), "--read-only")
    dt = time.perf_counter() - t0
    write_corpus(root, range(CORPUS_SHARDS, CORPUS_SHARDS + 1))
    kept = len(list(pinned.glob("shard-*.bin")))
    grown = len(list((root / "corpus").glob("shard-*.bin")))
    if kept != CORPUS_SHARDS or grown != CORPUS_SHARDS + 1:
        raise RuntimeError(f"{pinned.name} holds {kept} shards, the corpus {grown}")
    try:  # immutable: refused whoever asks, root included
        with open(next(pinned.glob("shard-*.bin")), "ab"):
            pass
    except PermissionError:
        pass
    else:
        raise RuntimeError(f"{pinned.name} took a write: it is not read-only")
    _say("versioned", f"{pinned.name} pinned in {dt:.2f} s (read-only snapshot, no byte "
         f"copied); the corpus grew to {grown} shards, {pinned.name} still holds {kept} "
         "and refuses writes")
    return pinned


class TokenShards:
    """A map-style dataset of fixed-length samples read by seek+read from shards."""

    def __init__(self, corpus: Path) -> None:
        self.paths = sorted(corpus.glob("shard-*.bin"))
        self.per_shard = SHARD_TOKENS // SEQ_LEN

    def __len__(self) -> int:
        return len(self.paths) * self.per_shard

    def __getitem__(self, index: int) -> Any:
        import numpy as np
        import torch

        shard, sample = divmod(index, self.per_shard)
        with open(self.paths[shard], "rb") as f:
            f.seek(sample * SEQ_LEN * 2)
            data = np.frombuffer(f.read(SEQ_LEN * 2), dtype=np.uint16)
        return torch.from_numpy(data.astype(np.int64))


def train(root: Path, corpus: Path) -> tuple[int, Path]:
    """Train a few steps on ``corpus``, checkpointing with keep-last-N; returns
    (samples, newest)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(50_000, 64), torch.nn.Flatten(), torch.nn.Linear(64 * SEQ_LEN, 16)
    )
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dataset: Any = TokenShards(corpus)  # a map-style dataset (no torch at import)
    loader: Any = torch.utils.data.DataLoader(
        dataset, batch_size=16, shuffle=True, num_workers=2
    )
    ckpt_root = root / "checkpoints"
    ckpt_root.mkdir(exist_ok=True)
    _shinglefs("policy", str(ckpt_root), "--retention", f"keep-last={KEEP_LAST}")
    samples = 0
    newest = ckpt_root
    step = 0
    while step < TRAIN_STEPS:
        for batch in loader:
            loss = model(batch).pow(2).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
            samples += len(batch)
            step += 1
            if step % CHECKPOINT_EVERY == 0:
                newest = _commit_checkpoint(ckpt_root, step, model, optim)
            if step >= TRAIN_STEPS:
                break
    return samples, newest


def _commit_checkpoint(ckpt_root: Path, step: int, model: Any, optim: Any) -> Path:
    import torch

    staging = ckpt_root / f".step-{step}.tmp"
    staging.mkdir()
    torch.save(model.state_dict(), staging / "model.pt")
    torch.save(optim.state_dict(), staging / "optim.pt")
    for name in ("model.pt", "optim.pt"):
        with open(staging / name, "rb+") as f:
            os.fsync(f.fileno())
    final = ckpt_root / f"step-{step}"
    os.rename(staging, final)  # the commit: atomic in the metadata engine
    return final  # older steps: the file system's retention deletes them


def kept_steps(ckpt_root: Path, timeout: float = 10.0) -> list[str]:
    """The steps left once retention has run (it follows a commit within a
    background pass, 0.5 s)."""
    deadline = time.monotonic() + timeout
    while True:
        kept = sorted(p.name for p in ckpt_root.iterdir() if p.name.startswith("step-"))
        if len(kept) <= KEEP_LAST or time.monotonic() > deadline:
            return kept
        time.sleep(0.1)


def verify(newest: Path) -> None:
    import torch

    state = torch.load(newest / "model.pt", weights_only=True)
    again = torch.load(newest / "model.pt", mmap=True, weights_only=True)
    for key in state:
        if not torch.equal(state[key], again[key]):
            raise RuntimeError(f"checkpoint {newest} reads back differently for {key}")


def run_job(root: Path) -> None:
    t0 = time.perf_counter()
    written = write_corpus(root)
    dt = time.perf_counter() - t0
    _say("corpus appended", f"{CORPUS_SHARDS} shards, {written / 2**20:.0f} MiB in {dt:.1f} s "
         f"({written / 2**20 / dt:.0f} MiB/s, fsync per shard)")
    pinned = pin_version(root, "v1")
    t0 = time.perf_counter()
    samples, newest = train(root, pinned)
    dt = time.perf_counter() - t0
    kept = kept_steps(root / "checkpoints")
    _say("trained", f"{TRAIN_STEPS} steps on {pinned.name}, {samples} samples via "
         f"DataLoader(2 workers) in {dt:.1f} s")
    _say("checkpoints", f"committed by rename every {CHECKPOINT_EVERY} steps, kept {kept} "
         f"(retention keep-last={KEEP_LAST})")
    if len(kept) > KEEP_LAST:
        raise RuntimeError(f"retention kept {kept}, not the last {KEEP_LAST}")
    verify(newest)
    _say("verified", f"{newest.name}/model.pt loads back identical (plain and mmap=True)")


def claim_data_dir(data_dir: Path, *, fresh: bool) -> None:
    """Make ``data_dir`` the demo's: create it, or take it when empty or already the
    demo's (``fresh``: unmount and delete what an earlier demo made in it).
    Raises PathError for a file, or a directory holding anything else."""
    if data_dir.exists() and not data_dir.is_dir():
        raise PathError(f"{data_dir} is not a directory", hint="choose a new --data-dir")
    # An earlier demo's directory holds only what the demo makes (releases before
    # the marker did not write it).
    ours = (data_dir / DEMO_MARKER).exists() or (
        data_dir.is_dir() and {p.name for p in data_dir.iterdir()} <= {"fs", "mnt"})
    if data_dir.is_dir() and any(data_dir.iterdir()) and not ours:
        raise PathError(
            f"{data_dir} is not empty and was not made by `shinglefs demo`; left as it is",
            hint="choose a new or empty --data-dir",
        )
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / DEMO_MARKER).touch()
    except OSError as exc:
        raise PathError(f"cannot use {data_dir}: {exc.strerror}",
                        hint="choose a --data-dir you can write to") from None
    if fresh and (data_dir / "fs").exists():
        from shinglefs.fuse.mount import mount_entry

        entry = mount_entry(data_dir / "mnt")
        if entry is not None and entry["fstype"] == "fuse.shinglefs":
            subprocess.run(["fusermount3", "-uz", str(data_dir / "mnt")], capture_output=True)
        shutil.rmtree(data_dir / "fs")


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        data_dir: Path = typer.Option(Path("demo-data"), help="where the embedded file system lives"),
        fresh: bool = typer.Option(True, help="start from an empty data directory"),
    ) -> None:
        """Run the main job on the embedded default and print what happened."""
        data_dir = data_dir.resolve()
        claim_data_dir(data_dir, fresh=fresh)
        mnt = data_dir / "mnt"
        mnt.mkdir(exist_ok=True)
        if not os.path.exists("/dev/fuse"):
            raise ShingleError(
                "the demo needs FUSE and this machine has no /dev/fuse",
                hint="load the fuse module (modprobe fuse) or give the container --device "
                "/dev/fuse; without FUSE use the Python API: shinglefs.connect(META_URL)",
            )
        _say("mounting", f"shinglefs up {data_dir / 'fs'} {mnt}")
        _shinglefs("up", str(data_dir / "fs"), str(mnt))
        try:
            run_job(mnt)
            typer.echo(_shinglefs("status", str(mnt)).stdout)
        finally:
            _shinglefs("umount", str(mnt))
            _say("unmounted", str(mnt))

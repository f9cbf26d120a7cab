"""A checkpoint-saving workload and its verifier, for the SIGKILL loop of ``up``.

The workload saves checkpoints the way users do, one step after another,
on a mount (``python ckptload.py MOUNT JOURNAL TAG KEEP``), in two ranks (this
process is rank 0, a spawned process rank 1; gloo on CPU, file rendezvous):

- ``pt``: ``torch.save`` into ``ckpt/pt/step-N.pt.tmp``, fsync of the file,
  ``os.replace`` to ``step-N.pt``, fsync of the directory (the documented
  crash-safe commit, docs/architecture.md "Ordered commits");
- ``dcp``: a ``torch.distributed.checkpoint`` save by both ranks into
  ``ckpt/dcp/step-N.tmp/`` (DCP fsyncs its files), fsync of that directory,
  rename of the directory to ``step-N/``, fsync of ``ckpt/dcp``;
- ``st``: safetensors ``save_file`` into ``step-N.safetensors.tmp``, fsync,
  rename, fsync of the directory.

Retention is keep-last-KEEP, two ways. With a metadata URL as the fifth
argument (``python ckptload.py MOUNT JOURNAL TAG KEEP META_URL``) the file
system does it: the workload sets ``--retention keep-last=KEEP`` on each
``ckpt/KIND`` with ``shinglefs policy`` and deletes nothing itself (what
ShingleFS deletes is not journaled). Without one the workload does it the
way training scripts that manage their own checkpoints do: after each commit
the oldest steps beyond KEEP are deleted: a file is unlinked, a DCP directory renamed out of its final name
(``.trash-step-N``) first and then removed, so that a crash mid-delete never
leaves a half checkpoint under a final name. Journal (outside the mount),
each line written after the call it names returned: ``begin KIND N``,
``committed KIND N`` (after the directory fsync), ``deleting KIND N`` (before
the unlink or rename), ``deleted KIND N`` (after the directory fsync), ``ready TAG`` (after the first step). Steps number on
from the journal's last ``begin``; a restarted workload first removes what a
crash left behind (``*.tmp``, ``.trash-*``), as a training script would.

Every checkpoint's tensors derive from its kind, step and rank (``tensors``),
so ``verify`` can check each one it finds.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

KINDS = ("pt", "dcp", "st")
SUFFIX = {"pt": ".pt", "dcp": "", "st": ".safetensors"}
RANKS = 2


def tensors(kind: str, step: int, rank: int = 0) -> dict[str, Any]:
    """The tensors of checkpoint ``kind`` at ``step`` (of ``rank`` for DCP): 512 KiB
    to 1 MiB, deterministic."""
    import torch

    g = torch.Generator().manual_seed(step * 16 + KINDS.index(kind) * 4 + rank)
    if kind == "dcp":
        return {f"rank{rank}.weight": torch.randn(256, 512, generator=g),
                "shared.step": torch.tensor([step])}
    return {"layer.weight": torch.randn(256, 1024, generator=g),
            "layer.bias": torch.randn(1024, generator=g, dtype=torch.float64),
            "step": torch.tensor([step])}


def final_name(kind: str, step: int) -> str:
    return f"step-{step:06d}{SUFFIX[kind]}"


def step_of(kind: str, name: str) -> int | None:
    """The step of a final name in ``ckpt/KIND`` (None for anything else)."""
    stem = name.removesuffix(SUFFIX[kind]) if SUFFIX[kind] else name
    if not stem.startswith("step-") or (SUFFIX[kind] and not name.endswith(SUFFIX[kind])):
        return None
    digits = stem.removeprefix("step-")
    return int(digits) if digits.isdigit() else None


# ---------------------------------------------------------------------------------- workload
def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Saver:
    """Rank 0's side: commits, retention and the journal."""

    def __init__(self, root: Path, journal: str, keep: int, fs_retention: bool) -> None:
        self.root, self.keep, self.fs_retention = root, keep, fs_retention
        self.journal = open(journal, "a", buffering=1)  # noqa: SIM115 - lives until killed

    def note(self, *words: object) -> None:
        self.journal.write(" ".join(str(w) for w in words) + "\n")

    def clean_leftovers(self) -> None:
        for kind in KINDS:
            (self.root / kind).mkdir(parents=True, exist_ok=True)
            for entry in (self.root / kind).iterdir():
                if entry.name.endswith(".tmp") or entry.name.startswith(".trash-"):
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

    def commit(self, kind: str, step: int, tmp: Path) -> None:
        """fsync ``tmp`` (file or directory), rename it to its final name, fsync
        the directory, journal; then apply keep-last-N."""
        fsync_path(tmp)
        os.replace(tmp, self.root / kind / final_name(kind, step))
        fsync_path(self.root / kind)
        self.note("committed", kind, step)
        if self.fs_retention:
            return
        steps = sorted(s for name in os.listdir(self.root / kind)
                       if (s := step_of(kind, name)) is not None)
        for old in steps[:-self.keep]:
            self.note("deleting", kind, old)
            path = self.root / kind / final_name(kind, old)
            if kind == "dcp":
                trash = path.with_name(f".trash-{path.name}")
                os.rename(path, trash)
                fsync_path(self.root / kind)
                shutil.rmtree(trash)
            else:
                path.unlink()
                fsync_path(self.root / kind)
            self.note("deleted", kind, old)


def rank_main(rank: int, root: str, journal: str, tag: str, keep: int, first: int,
              init_file: str, fs_retention: bool) -> None:
    """One rank's loop, forever (until killed)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=RANKS)
    saver = Saver(Path(root) / "ckpt", journal, keep, fs_retention) if rank == 0 else None
    step = first
    while True:
        tmp = Path(root) / "ckpt" / "dcp" / f"{final_name('dcp', step)}.tmp"
        if saver is not None:
            saver.note("begin", "pt", step)
            path = saver.root / "pt" / f"{final_name('pt', step)}.tmp"
            with open(path, "wb") as f:
                torch.save(tensors("pt", step), f)
            saver.commit("pt", step, path)
            saver.note("begin", "dcp", step)
            tmp.mkdir()
        dist.barrier()
        dcp.save(tensors("dcp", step, rank), storage_writer=dcp.FileSystemWriter(tmp))
        dist.barrier()
        if saver is not None:
            saver.commit("dcp", step, tmp)
            from safetensors.torch import save_file

            saver.note("begin", "st", step)
            path = saver.root / "st" / f"{final_name('st', step)}.tmp"
            save_file(tensors("st", step), str(path))
            saver.commit("st", step, path)
            if step == first:
                saver.note("ready", tag)
        step += 1


def main(argv: list[str]) -> None:
    import multiprocessing

    mount, journal, tag, keep = argv[0], argv[1], argv[2], int(argv[3])
    meta_url = argv[4] if len(argv) > 4 else None
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    begun = [int(w[2]) for w in journal_lines(Path(journal)) if w[0] == "begin"]
    first = max(begun, default=0) + 1
    saver = Saver(Path(mount) / "ckpt", journal, keep, meta_url is not None)
    saver.clean_leftovers()
    if meta_url is not None:
        import subprocess

        from shinglefs.fuse.harness import shinglefs_command

        for kind in KINDS:
            subprocess.run([*shinglefs_command(), "policy", meta_url, f"/ckpt/{kind}",
                            "--retention", f"keep-last={keep}"], check=True,
                           stdout=subprocess.DEVNULL, timeout=120)
    init_file = f"{journal}.{tag}.rendezvous"
    args = (mount, journal, tag, keep, first, init_file, meta_url is not None)
    other = multiprocessing.get_context("spawn").Process(target=rank_main, args=(1, *args))
    other.start()
    rank_main(0, *args)


def journal_lines(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [words for line in path.read_text().splitlines() if (words := line.split())]


# ---------------------------------------------------------------------------------- verify
def load(kind: str, path: Path) -> dict[str, Any]:
    """A checkpoint read back with its own tool (raises what the tool raises)."""
    import torch

    if kind == "pt":
        return dict(torch.load(path, weights_only=True))
    if kind == "st":
        from safetensors.torch import load_file

        return dict(load_file(str(path)))
    import torch.distributed.checkpoint as dcp

    step = tensors("dcp", 0)["shared.step"]
    target: dict[str, Any] = {"shared.step": torch.zeros_like(step)}
    for rank in range(RANKS):
        target[f"rank{rank}.weight"] = torch.zeros(256, 512)
    dcp.load(target, storage_reader=dcp.FileSystemReader(str(path)), no_dist=True)
    return target


def expected(kind: str, step: int) -> dict[str, Any]:
    if kind != "dcp":
        return tensors(kind, step)
    want = {}
    for rank in range(RANKS):
        want.update(tensors("dcp", step, rank))
    return want


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def load_problem(kind: str, path: Path, step: int) -> str | None:
    """None when the checkpoint at ``path`` loads back equal to its step's
    tensors; else what went wrong (DCP raises ``CheckpointException``, a
    ``BaseException``, for a missing or short file)."""
    import warnings

    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with warnings.catch_warnings():  # DCP warns that it loads without a process group
            warnings.simplefilter("ignore", UserWarning)
            loaded = load(kind, path)
    except (Exception, CheckpointException) as exc:  # any failure to load is the finding
        return f"{path.name}: does not load: {exc!r}"[:300]
    return None if same(loaded, expected(kind, step)) else f"{path.name}: tensors differ"


def read_every_file(top: Path) -> tuple[int, list[str]]:
    """Read every regular file under ``top``: how many, and those that fail (EIO...)."""
    count, failed = 0, []
    for where, _dirs, files in os.walk(top):
        for name in files:
            count += 1
            try:
                (Path(where) / name).read_bytes()
            except OSError as exc:
                failed.append(f"{Path(where) / name}: {exc!r}")
    return count, failed


def verify(mount: Path, journal: Path, keep: int,  # type: ignore[no-untyped-def]
           fs_retention: bool = False):
    """Check the promises through the mount, as a ``crashload.Verdict``
    (``closed_ok``: checkpoints that loaded back equal):

    - no file under the mount reads EIO (or any error), the entries retention
      took out of their final names included;
    - every committed checkpoint is present and loads back equal to its
      tensors, unless retention deleted it (``deleting`` journaled, or at any
      time with ``fs_retention``) while it was not among the KEEP newest steps;
    - a checkpoint under its final name that was never journaled committed was
      in flight at a crash (begun) and loads back whole (nothing half-visible
      under a final name);
    - a checkpoint whose deletion returned (``deleted``) stays gone;
    - at most KEEP + 1 committed checkpoints of a kind under final names (the
      newest, whose retention pass a crash interrupted), besides those in
      flight; with ``fs_retention``, whose pass follows the commits by up to
      0.5 s (several steps here), ``converged`` instead.
    """
    from tests.support.crashload import Verdict

    v = Verdict()
    v.files_checked, failed = read_every_file(mount)
    v.problems += failed
    words = journal_lines(journal)
    for kind in KINDS:
        committed = [int(w[2]) for w in words if w[0] == "committed" and w[1] == kind]
        deleting = {int(w[2]) for w in words if w[0] == "deleting" and w[1] == kind}
        deleted = {int(w[2]) for w in words if w[0] == "deleted" and w[1] == kind}
        # Steps a crash interrupted: absent, or whole under their final name
        # (renamed before the journal line) until retention deletes them.
        in_flight = {int(w[2]) for w in words if w[0] == "begin" and w[1] == kind}
        in_flight.difference_update(committed)
        folder = mount / "ckpt" / kind
        names = os.listdir(folder) if folder.exists() else []
        present = {s: folder / n for n in names if (s := step_of(kind, n)) is not None}
        # Retention counts a whole step a crash left under its final name as
        # a checkpoint (it is one), so it may push a committed one out.
        newest = set(sorted({*committed, *in_flight})[-keep:])
        for step in committed:
            if step in present:
                continue
            if step not in deleting and not fs_retention:
                v.problems.append(f"{kind} step {step}: committed, absent, never deleted")
            elif step in newest:
                v.problems.append(f"{kind} step {step}: deleted but among the {keep} newest")
        for step, path in sorted(present.items()):
            if step not in committed and step not in in_flight:
                v.problems.append(f"{path.name}: visible, neither committed nor in flight")
            if step in deleted:
                v.problems.append(f"{path.name}: visible again after its deletion's fsync")
            problem = load_problem(kind, path, step)
            if problem is None:
                v.closed_ok += 1
            else:
                v.problems.append(problem)
        kept = len(present.keys() - in_flight)
        if fs_retention:
            v.problems += converged(folder, kind, present, keep)
        elif kept > keep + 1:
            v.problems.append(f"{kind}: {kept} committed checkpoints, {keep + 1} at most")
    return v


def converged(folder: Path, kind: str, present: dict[int, Path], keep: int,
              timeout: float = 30) -> list[str]:
    """The file system's retention after the crash: once an entry arrives (a
    hidden one, which does not count), the folder holds exactly the ``keep``
    newest of the steps that were there, and nothing retention left behind
    (``.shinglefs-retired.*``) within ``timeout`` seconds; else the problem."""
    want = sorted(present)[-keep:]
    probe = folder / ".verify-arrival"
    probe.write_bytes(b"")
    deadline = time.monotonic() + timeout
    try:
        while True:
            names = sorted(os.listdir(folder))
            steps = sorted(s for n in names if (s := step_of(kind, n)) is not None)
            retired = [n for n in names if n.startswith(".shinglefs-retired.")]
            if steps == want and not retired:
                return []
            if time.monotonic() > deadline:
                return [f"{kind}: retention did not converge in {timeout} s: steps {steps}, "
                        f"want {want}; retired left: {retired}"]
            time.sleep(0.1)
    finally:
        probe.unlink()


def loop_workload(mountpoint: Path, journal: Path, keep: int,  # type: ignore[no-untyped-def]
                  meta_url: str | None = None):
    """This workload as a ``crashloop.LoopWorkload``: started per trial, its
    first step awaited (``ready``) before the random kill; two ranks write DCP
    files at once (two open files). ``meta_url``: the file system enforces
    the retention (``main``)."""
    from tests.support import crashloop

    return crashloop.LoopWorkload(
        start=lambda tag, err: crashloop.start_workload(
            str(mountpoint), str(journal), tag, str(keep), *([meta_url] if meta_url else []),
            stderr=err, script=str(Path(__file__).resolve())),
        verify=lambda: verify(mountpoint, journal, keep, meta_url is not None), ready="ready",
        open_files=RANKS)


if __name__ == "__main__":
    main(sys.argv[1:])

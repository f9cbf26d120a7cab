"""Unchanged AI tools on a real ShingleFS mount: torch, safetensors, zarr, numpy, webdataset, DCP.

Each test writes with the tool, drops the kernel page cache (so reads go
through FUSE and the drives), reads back with the tool and compares values.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from shinglefs.fuse.harness import drop_caches

pytestmark = pytest.mark.fuse

torch = pytest.importorskip("torch")


def state_dict(seed: int = 0) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(1000, 256, generator=g),
        "layer.0.bias": torch.randn(256, generator=g, dtype=torch.float64),
        "steps": torch.arange(17, dtype=torch.int64),
        "half": torch.randn(64, 64, generator=g).to(torch.bfloat16),
    }


def assert_same_tensors(a: dict[str, object], b: dict[str, object]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key  # type: ignore[arg-type]


def test_torch_save_and_load_including_mmap(mnt: Path) -> None:
    sd = state_dict()
    torch.save(sd, mnt / "model.pt")
    drop_caches()
    assert_same_tensors(torch.load(mnt / "model.pt", weights_only=True), sd)
    mapped = torch.load(mnt / "model.pt", mmap=True, weights_only=True)
    assert_same_tensors(mapped, sd)
    # Overwrite in place (same name) and load again: the new bytes win.
    sd2 = state_dict(seed=1)
    torch.save(sd2, mnt / "model.pt")
    assert_same_tensors(torch.load(mnt / "model.pt", mmap=True, weights_only=True), sd2)


def test_safetensors_save_file_and_load_file(mnt: Path) -> None:
    from safetensors.torch import load_file, save_file

    sd = {k: v for k, v in state_dict().items() if k != "steps"}
    save_file(sd, str(mnt / "model.safetensors"), metadata={"format": "pt"})
    drop_caches()
    assert_same_tensors(load_file(str(mnt / "model.safetensors")), sd)
    # Replace it (safetensors writes the whole file again).
    sd2 = {k: v + 1 for k, v in sd.items()}
    save_file(sd2, str(mnt / "model.safetensors"))
    assert_same_tensors(load_file(str(mnt / "model.safetensors")), sd2)


def test_zarr_v3_array_written_and_read_back(mnt: Path) -> None:
    zarr = pytest.importorskip("zarr")
    data = np.arange(200 * 300, dtype=np.float32).reshape(200, 300)
    array = zarr.create_array(store=str(mnt / "data.zarr"), shape=data.shape, chunks=(64, 64),
                              dtype="float32", zarr_format=3)
    array[:] = data
    array[10:20, 10:20] = -1
    expected = data.copy()
    expected[10:20, 10:20] = -1
    drop_caches()
    reopened = zarr.open_array(str(mnt / "data.zarr"), mode="r")
    np.testing.assert_array_equal(reopened[:], expected)
    group = zarr.open_group(str(mnt / "grp.zarr"), mode="w", zarr_format=3)
    group.create_array("a", shape=(10,), dtype="int32")[:] = np.arange(10)
    assert list(zarr.open_group(str(mnt / "grp.zarr"), mode="r")["a"][:]) == list(range(10))


def test_numpy_memmap_write_then_read(mnt: Path) -> None:
    path = mnt / "tokens.u16"
    mm = np.memmap(path, dtype=np.uint16, mode="w+", shape=(3_000_000,))
    mm[:] = np.arange(3_000_000, dtype=np.uint64) % 50257
    mm.flush()
    del mm
    drop_caches()
    back = np.memmap(path, dtype=np.uint16, mode="r", shape=(3_000_000,))
    np.testing.assert_array_equal(back, np.arange(3_000_000, dtype=np.uint64) % 50257)
    assert path.stat().st_size == 6_000_000


def _write_shard(path: Path, first: int, count: int) -> None:
    with tarfile.open(path, "w") as tar:
        for i in range(first, first + count):
            for ext, payload in (("cls", str(i % 10).encode()),
                                 ("bin", np.full(1000, i, dtype=np.int32).tobytes())):
                info = tarfile.TarInfo(f"sample{i:06d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))


def test_webdataset_shards_through_a_dataloader_with_two_workers(mnt: Path) -> None:
    wds = pytest.importorskip("webdataset")
    shards = mnt / "shards"
    shards.mkdir()
    for s in range(4):
        _write_shard(shards / f"shard-{s:04d}.tar", s * 50, 50)
    drop_caches()
    urls = [str(shards / f"shard-{s:04d}.tar") for s in range(4)]
    dataset = (wds.WebDataset(urls, shardshuffle=False, empty_check=False)
               .to_tuple("__key__", "cls", "bin"))
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    seen = {}
    for key, cls, binary in loader:
        i = int(key.removeprefix("sample"))
        assert int(cls) == i % 10
        assert np.frombuffer(binary, dtype=np.int32).tolist() == [i] * 1000
        seen[i] = True
    assert sorted(seen) == list(range(200))


def _dcp_rank(rank: int, world: int, directory: str, init_file: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        sd = {f"rank{rank}.weight": torch.full((512, 512), float(rank + 1)),
              "shared.step": torch.tensor([42])}
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(directory))
        dist.barrier()
        target = {f"rank{rank}.weight": torch.zeros(512, 512), "shared.step": torch.tensor([0])}
        dcp.load(target, storage_reader=dcp.FileSystemReader(directory))
        assert torch.equal(target[f"rank{rank}.weight"], torch.full((512, 512), float(rank + 1)))
        assert int(target["shared.step"]) == 42
    finally:
        dist.destroy_process_group()


def test_torch_distributed_checkpoint_two_ranks_save_and_load(mnt: Path, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    directory = mnt / "ckpt" / "step-100"
    directory.mkdir(parents=True)
    mp.spawn(_dcp_rank, args=(2, str(directory), str(tmp_path / "rendezvous")), nprocs=2,
             join=True)
    names = sorted(os.listdir(directory))
    assert ".metadata" in names
    assert len([n for n in names if n.endswith(".distcp")]) == 2
    assert not [n for n in names if n.endswith(".tmp")]


def test_file_unlinked_while_open_by_a_reader(mnt: Path) -> None:
    sd = state_dict()
    torch.save(sd, mnt / "ephemeral.pt")
    with open(mnt / "ephemeral.pt", "rb") as f:
        os.unlink(mnt / "ephemeral.pt")
        assert not (mnt / "ephemeral.pt").exists()
        assert_same_tensors(torch.load(f, weights_only=True), sd)


def test_hf_datasets_save_load_map_cache_and_parquet(mnt: Path, monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    """Hugging Face ``datasets`` with everything on the mount: ``save_to_disk`` in
    shards and ``load_from_disk`` (Arrow files memory-mapped back), ``map`` writing
    its cache file there (a temporary file renamed into place, lock files),
    the cache reused by a second ``map``, ``to_parquet`` and ``load_dataset``
    of it with the mount as ``cache_dir``."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rows = 5000
    table = {"id": list(range(rows)), "text": [f"sample {i} " * (1 + i % 7) for i in range(rows)],
             "tokens": [[i % 251, (i * 7) % 251, (i * 13) % 251] for i in range(rows)]}
    saved = datasets.Dataset.from_dict(table)
    saved.save_to_disk(str(mnt / "saved"), num_shards=4)
    drop_caches()
    loaded = datasets.load_from_disk(str(mnt / "saved"))
    assert loaded.to_dict() == table
    calls = {"n": 0}

    def longer(batch: dict[str, list[object]]) -> dict[str, list[object]]:
        calls["n"] += 1
        return {"length": [len(t) for t in batch["text"]]}  # type: ignore[arg-type]

    cache = str(mnt / "map-cache.arrow")
    mapped = loaded.map(longer, batched=True, cache_file_name=cache)
    assert mapped["length"] == [len(t) for t in table["text"]]
    first_calls = calls["n"]
    again = loaded.map(longer, batched=True, cache_file_name=cache)  # served from the cache
    assert calls["n"] == first_calls
    assert again["length"] == mapped["length"]
    saved.to_parquet(str(mnt / "data.parquet"))
    drop_caches()
    parquet = datasets.load_dataset("parquet", data_files=str(mnt / "data.parquet"),
                                    cache_dir=str(mnt / "hf-cache"), split="train")
    assert parquet.to_dict() == table

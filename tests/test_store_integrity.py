"""Issue 21, the store side: files readable by others, a sha256 per shard tensor recorded when written and
checked when read (a damaged shard is an error naming it), stores from before checksums still read."""

from __future__ import annotations

import functools
import json
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from interp.collect import CollectionPlan, collect
from interp.store import ActivationStore, StoreError, tensor_digest
from zoo.shapes import world_prompts
from test_hooks_diffusion import MID, one_torch_thread, random_t2i  # noqa: F401 - fixture reused

SHARD = "shards/shard-000001.safetensors"


def plan() -> CollectionPlan:
    return CollectionPlan(model="random", blocks=[MID], prompts=world_prompts(6), seeds=list(range(6)), steps=1,
                          guidance=0.0, images_per_shard=2)


@functools.cache
def pristine_store() -> Path:
    out = Path(tempfile.mkdtemp(prefix="store-integrity-")) / "store"
    collect(random_t2i(), plan(), out, progress=False)
    return out


@pytest.fixture
def store(tmp_path) -> Path:
    """A copy of a freshly collected store (3 shards of 2 images), free to damage."""
    copy = tmp_path / "store"
    shutil.copytree(pristine_store(), copy)
    return copy


def all_vectors(path: Path) -> torch.Tensor:
    return torch.cat(list(ActivationStore(path).batches(MID, batch_size=50, shuffle=False)))


def flip_one_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) - 100] ^= 0x10  # inside the tensor data: the header and the length stay valid
    path.write_bytes(bytes(data))


def test_store_files_are_readable_by_others():
    files = [path for path in pristine_store().rglob("*") if path.is_file()]
    assert len(files) == 5  # plan, manifest, 3 shards
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path  # safetensors alone writes 0o600


def test_manifest_records_each_tensors_sha256_as_the_shard_header_does(store):
    manifest = json.loads((store / "manifest.json").read_text())
    for entry in manifest["shards"]:
        with safe_open(str(store / entry["file"]), framework="pt") as f:
            assert json.loads(f.metadata()["sha256"]) == entry["sha256"]
            assert {key: tensor_digest(f.get_tensor(key)) for key in f.keys()} == entry["sha256"]


def test_a_flipped_bit_is_an_error_naming_the_shard_and_the_remedy(store):
    flip_one_bit(store / SHARD)
    message = f"shard {SHARD} of the store at {store} does not match its sha256 in the manifest"
    with pytest.raises(StoreError, match=message) as raised:
        all_vectors(store)
    assert "delete it and run the collect command that made the store again" in str(raised.value)
    with pytest.raises(StoreError, match=message):
        ActivationStore(store).image(3, MID)  # the first image read from that shard checks it
    fresh = ActivationStore(store)
    torch.testing.assert_close(fresh.image(0, MID), ActivationStore(pristine_store()).image(0, MID))  # others read


def test_a_truncated_shard_is_an_error_naming_it(store):
    path = store / SHARD
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(StoreError, match=f"shard {SHARD} of the store at .* cannot be read"):
        all_vectors(store)
    path.unlink()
    with pytest.raises(StoreError, match=f"shard {SHARD} of the store at .* is missing: run the collect command"):
        ActivationStore(store).image(2, MID)


def test_deleting_a_damaged_shard_and_collecting_again_repairs_the_store(store):
    """What the error message tells the user to do."""
    flip_one_bit(store / SHARD)
    (store / SHARD).unlink()
    collect(random_t2i(), plan(), store, progress=False)
    torch.testing.assert_close(all_vectors(store), all_vectors(pristine_store()), rtol=0, atol=0)


def test_a_store_written_before_checksums_still_reads(store):
    manifest = json.loads((store / "manifest.json").read_text())
    for entry in manifest["shards"]:
        del entry["sha256"]
    (store / "manifest.json").write_text(json.dumps(manifest))
    torch.testing.assert_close(all_vectors(store), all_vectors(pristine_store()), rtol=0, atol=0)
    assert ActivationStore(store).image(5, MID).shape == ActivationStore(pristine_store()).image(5, MID).shape


def test_a_damaged_manifest_is_a_clear_error(store):
    (store / "manifest.json").write_text('{"format": "interp-activation-st')
    with pytest.raises(StoreError, match="manifest.json is damaged .* run the collect command"):
        ActivationStore(store)

"""The activation store: collection (resumable, atomic, data-parallel), reading, streaming, bad input."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import interp.store as store_module
from interp.__main__ import main as interp_main
from interp.hooks import capture_updates, generate
from interp.collect import CollectionPlan, collect, stream_vectors
from interp.store import ActivationStore, StoreError
from zoo.shapes import world_prompts
from test_hooks_diffusion import MID, one_torch_thread, random_t2i  # noqa: F401 - fixture reused

REPO = Path(__file__).resolve().parents[1]
BLOCKS = ["mid_block.attentions.0", "up_blocks.0.attentions.1"]
N_IMAGES = 8


@functools.cache
def saved_random_pipeline() -> str:
    """The random pipeline saved with save_pretrained, so the CLI can load it by directory."""
    directory = Path(tempfile.mkdtemp(prefix="interp-random-pipe-"))
    random_t2i().pipe.save_pretrained(directory)
    return str(directory)


@functools.cache
def loaded_random_pipeline():
    from interp.models import load_t2i

    return load_t2i(saved_random_pipeline(), device="cpu")


def _cli_args(out, *extra) -> list[str]:
    return ["collect", "--model", saved_random_pipeline(), "--blocks", *BLOCKS, "--world", str(N_IMAGES),
            "--images-per-shard", "1", "--steps", "2", "--out", str(out), *extra]


@functools.cache
def reference_store() -> Path:
    """An uninterrupted single-process run of the CLI, in this process."""
    out = Path(tempfile.mkdtemp(prefix="interp-store-ref-")) / "store"
    assert interp_main(_cli_args(out)) == 0
    return out


def _same_store(a: Path, b: Path) -> None:
    manifest_a, manifest_b = (json.loads((p / "manifest.json").read_text()) for p in (a, b))
    assert manifest_a == manifest_b
    names_a = sorted(p.name for p in (a / "shards").iterdir())
    assert names_a == sorted(p.name for p in (b / "shards").iterdir())
    assert names_a == [f"shard-{k:06d}.safetensors" for k in range(N_IMAGES)]  # none missing, none extra
    for name in names_a:
        ta, tb = load_file(str(a / "shards" / name)), load_file(str(b / "shards" / name))
        assert ta.keys() == tb.keys()
        for key in ta:
            assert torch.equal(ta[key], tb[key]), (name, key)


def _rows_sorted(x: torch.Tensor) -> torch.Tensor:
    """The rows of (N, C) in lexicographic order: compares two sets of vectors regardless of order."""
    return x[np.lexsort(x.numpy().T[::-1])]


def _subprocess_env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def test_store_holds_each_images_updates_and_prompt():
    model = random_t2i()
    out = Path(tempfile.mkdtemp()) / "s"
    prompts = world_prompts(5, seed=3)
    plan = CollectionPlan(model="random", blocks=BLOCKS, prompts=prompts, seeds=[10 + i for i in range(5)],
                          steps=2, guidance=0.0, images_per_shard=2)
    collect(model, plan, out, progress=False)
    store = ActivationStore(out)
    assert store.blocks == BLOCKS and len(store) == 5 and len(store.shards) == 3  # last shard holds 1 image
    m = store.manifest
    assert m["dtype"] == "float16" and m["steps"] == 2 and m["prompts"] == prompts and m["seeds"] == [10, 11, 12, 13, 14]
    assert m["shapes"][MID] == [2, 64, 8, 8]
    with capture_updates(model, [MID]) as cap:
        generate(model, prompts[4], steps=2, seed=14, output_type="latent")
    direct = cap.updates(MID)[:, 0]  # (steps, C, H, W)
    stored = store.image(4, MID)
    assert stored.dtype == torch.float32 and stored.shape == (2, 64, 8, 8)
    torch.testing.assert_close(stored, direct.half().float())
    assert store.prompt(4) == prompts[4]


def test_batches_cover_every_vector_once_shuffled_and_reproducibly():
    store = ActivationStore(reference_store())
    n = store.n_vectors(MID)
    assert n == N_IMAGES * 2 * 8 * 8
    everything = torch.cat([store.image(i, MID).permute(0, 2, 3, 1).reshape(-1, 64) for i in range(len(store))])
    batches = list(store.batches(MID, batch_size=100, shuffle=True, seed=1, buffer_vectors=300))
    assert all(b.dtype == torch.float32 and b.shape[1] == 64 for b in batches)
    assert [len(b) for b in batches[:-1]] == [100] * (len(batches) - 1) and sum(len(b) for b in batches) == n
    streamed = torch.cat(batches)
    assert not torch.equal(streamed, everything)  # shuffled
    assert torch.equal(_rows_sorted(streamed), _rows_sorted(everything))  # the same vectors, each once
    again = torch.cat(list(store.batches(MID, batch_size=100, shuffle=True, seed=1, buffer_vectors=300)))
    assert torch.equal(again, streamed)
    in_order = torch.cat(list(store.batches(MID, batch_size=64, shuffle=False)))
    assert torch.equal(in_order, everything)


def test_interrupted_collection_resumes_to_the_same_store_as_an_uninterrupted_one(tmp_path):
    reference = reference_store()
    out = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-m", "interp", *_cli_args(out)], cwd=REPO, env=_subprocess_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if len(list((out / "shards").glob("*.safetensors"))) >= 2:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = list((out / "shards").glob("*.safetensors"))
    assert 2 <= len(done) < N_IMAGES and not (out / "manifest.json").exists(), "the run was not cut mid-way"
    (out / "shards" / "shard-000007.safetensors.tmp-99999").write_bytes(b"half a shard")  # a write cut short
    (out / "shards" / ".shard-000008.safetensors.x1y2.tmp").write_bytes(b"half a shard")  # interp.atomic's name
    with pytest.raises(StoreError, match="unfinished collection"):
        ActivationStore(out)
    assert interp_main(_cli_args(out)) == 0
    assert not list(out.rglob("*.tmp-*")) and not list(out.rglob(".*.tmp"))
    _same_store(out, reference)


def test_torchrun_two_processes_write_one_store_equal_to_a_single_process_run(tmp_path):
    reference = reference_store()
    out = tmp_path / "store"
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                             "2", "-m", "interp", *_cli_args(out)],
                            cwd=REPO, env=_subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    _same_store(out, reference)


def test_full_disk_gives_a_clear_error_and_a_consistent_resumable_store(tmp_path, monkeypatch, capsys):
    reference = reference_store()
    out = tmp_path / "store"
    real_save, calls = store_module.save_file, []

    def save_until_disk_is_full(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 3:
            with open(filename, "wb") as f:
                f.write(b"partial")  # the writer got part-way, then the disk filled up
            raise OSError(28, "No space left on device")
        return real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr(store_module, "save_file", save_until_disk_is_full)
    assert interp_main(_cli_args(out)) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "2 of 8 shards complete" in err and "Traceback" not in err
    assert sorted(p.name for p in (out / "shards").iterdir()) == ["shard-000000.safetensors",
                                                                  "shard-000001.safetensors"]
    assert not (out / "manifest.json").exists()
    monkeypatch.setattr(store_module, "save_file", real_save)
    assert interp_main(_cli_args(out)) == 0
    _same_store(out, reference)


def test_unwritable_directory_and_changed_settings_get_clear_errors(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert interp_main(_cli_args(blocker / "store")) == 2
    assert "cannot write to" in capsys.readouterr().err
    out = tmp_path / "store"
    plan = CollectionPlan(model="random", blocks=[MID], prompts=["a red circle"], seeds=[0], steps=1, guidance=0.0)
    collect(random_t2i(), plan, out, progress=False)
    changed = CollectionPlan(model="random", blocks=[MID], prompts=["a red circle"], seeds=[0], steps=2, guidance=0.0)
    with pytest.raises(StoreError, match="other settings \\(steps differ\\)"):
        collect(random_t2i(), changed, out, progress=False)
    assert interp_main(["collect", "--model", saved_random_pipeline(), "--blocks", "mid_block.attentions.5",
                        "--world", "2", "--out", str(tmp_path / "x")]) == 2
    assert "mid_block.attentions.0" in capsys.readouterr().err  # the valid blocks are listed


def test_streaming_feeds_the_same_vectors_as_the_store_without_disk():
    reference = ActivationStore(reference_store())
    model = loaded_random_pipeline()
    prompts = iter(reference.prompts)  # a generator: streaming does not need a list
    batches = list(stream_vectors(model, MID, prompts, batch_size=96, steps=2, seed=0, images_per_generation=1,
                                  buffer_vectors=256))
    assert all(b.dtype == torch.float32 and b.shape[1] == 64 for b in batches)
    streamed = torch.cat(batches)
    stored = torch.cat(list(reference.batches(MID, batch_size=4096, shuffle=False)))
    assert streamed.shape == stored.shape
    assert torch.equal(_rows_sorted(streamed.half().float()), _rows_sorted(stored))

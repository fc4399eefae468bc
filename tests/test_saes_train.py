"""The training loop: learns a known sparse dictionary, resumes exactly, refuses bad input,
never replaces a good checkpoint with a broken one, trains sae-lens architectures, runs under DDP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from saes.evaluate import evaluate, markdown_table
from saes.sae import SAE
from saes.train import CHECKPOINT_FILENAME, CheckpointMismatchError, TrainConfig, train

D_IN, N_TRUE = 32, 64


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: a second thread only adds synchronisation, badly so on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def sparse_dictionary_stream(n_batches, batch=256, active=3, seed=0, rank=0):
    """Vectors made of `active` of N_TRUE fixed unit directions with positive weights, plus an offset."""
    dictionary = torch.randn(N_TRUE, D_IN, generator=torch.Generator().manual_seed(123))
    dictionary /= dictionary.norm(dim=1, keepdim=True)
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    for _ in range(n_batches):
        index = torch.rand(batch, N_TRUE, generator=g).argsort(1)[:, :active]
        weights = torch.rand(batch, active, generator=g) * 2 + 0.5
        yield torch.zeros(batch, N_TRUE).scatter(1, index, weights) @ dictionary + 0.3


def small_config(**changes) -> TrainConfig:
    values = dict(d_in=D_IN, d_sae=128, k=4, batch_size=256, lr=3e-3, total_tokens=256 * 200,
                  dead_after_tokens=256 * 40, log_every_steps=20, checkpoint_every_steps=50)
    values.update(changes)
    return TrainConfig(**values)


def test_topk_learns_a_known_sparse_dictionary(tmp_path):
    sae = train(small_config(total_tokens=256 * 200), sparse_dictionary_stream(1000), tmp_path, progress=False)
    result = evaluate(SAE.load(tmp_path), sparse_dictionary_stream(4, seed=9))
    assert result["explained_variance"] > 0.8
    assert result["l0"] <= 4
    assert sae.cfg.k == 4
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["tokens"] == 256 * 200
    assert log[-1]["explained_variance"] > log[0]["explained_variance"] - 0.05
    assert {"loss", "explained_variance", "l0", "dead_features"} <= set(log[-1])
    assert "| explained variance |" in markdown_table({"toy": result})


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    config = small_config(total_tokens=256 * 30, checkpoint_every_steps=10)
    whole = train(config, sparse_dictionary_stream(100), tmp_path / "whole", progress=False)
    # The same run, stopped after 15 steps (checkpoint at 10 and at the end), then resumed.
    stopped = small_config(total_tokens=256 * 15, checkpoint_every_steps=10)
    train(stopped, sparse_dictionary_stream(100), tmp_path / "parts", progress=False)
    state = torch.load(tmp_path / "parts" / CHECKPOINT_FILENAME, weights_only=True)
    assert state["step"] == 15
    resumed = train(config, sparse_dictionary_stream(100), tmp_path / "parts", progress=False)
    for name, tensor in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], tensor, rtol=0, atol=0, msg=name)


def test_interrupted_run_saves_where_it_stopped_and_resumes_to_the_same_sae(tmp_path):
    config = small_config(total_tokens=256 * 20, checkpoint_every_steps=100)  # no periodic checkpoint
    whole = train(config, sparse_dictionary_stream(40), tmp_path / "whole", progress=False)

    def interrupted_stream():
        for i, batch in enumerate(sparse_dictionary_stream(40)):
            if i == 12:
                raise KeyboardInterrupt  # Ctrl-C while waiting for data
            yield batch

    with pytest.raises(KeyboardInterrupt):
        train(config, interrupted_stream(), tmp_path / "parts", progress=False)
    assert torch.load(tmp_path / "parts" / CHECKPOINT_FILENAME, weights_only=True)["step"] == 12
    resumed = train(config, sparse_dictionary_stream(40), tmp_path / "parts", progress=False)
    for name, tensor in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], tensor, rtol=0, atol=0, msg=name)


def test_checkpoint_from_another_config_is_refused(tmp_path):
    train(small_config(total_tokens=256 * 5), sparse_dictionary_stream(10), tmp_path, progress=False)
    with pytest.raises(CheckpointMismatchError, match="d_sae: checkpoint 128 vs now 256"):
        train(small_config(d_sae=256), sparse_dictionary_stream(10), tmp_path, progress=False)


def test_bad_activations_give_clear_errors(tmp_path):
    bad = torch.randn(256, D_IN)
    bad[3, 4] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        train(small_config(), iter([bad]), tmp_path / "nan", progress=False)
    with pytest.raises(ValueError, match=r"expects \(batch, 32\)"):
        train(small_config(), iter([torch.randn(256, 31)]), tmp_path / "width", progress=False)
    with pytest.raises(ValueError, match="k=200 must be between 1 and the number of latents"):
        train(small_config(k=200), sparse_dictionary_stream(2), tmp_path / "k", progress=False)


def test_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    config = small_config(total_tokens=256 * 10, checkpoint_every_steps=5)
    train(config, sparse_dictionary_stream(20), tmp_path, progress=False)
    good = (tmp_path / CHECKPOINT_FILENAME).read_bytes()
    real_save = torch.save

    def save_then_crash(obj, path, *args, **kwargs):
        real_save(obj, path, *args, **kwargs)
        with open(path, "r+b") as f:  # a half-written file, then the crash
            f.truncate(100)
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", save_then_crash)
    with pytest.raises(OSError, match="disk full"):
        train(small_config(total_tokens=256 * 20, checkpoint_every_steps=5), sparse_dictionary_stream(40), tmp_path,
              progress=False)
    assert (tmp_path / CHECKPOINT_FILENAME).read_bytes() == good
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("architecture,options", [("batchtopk", {}), ("jumprelu", {"l0_coefficient": 0.1}),
                                                  ("standard", {"l1_coefficient": 0.5}), ("lens-topk", {}),
                                                  ("gated", {"l1_coefficient": 0.5}),
                                                  ("p-anneal", {"warmup_steps": 2, "n_sparsity_updates": 4}),
                                                  ("matryoshka", {"matryoshka_widths": [16, 64, 128]}),
                                                  ("matryoshka", {})])  # default widths d_sae / 16, / 4, d_sae
def test_sae_lens_architectures_train_through_their_own_trainer(tmp_path, architecture, options):
    config = small_config(architecture=architecture, options=options, total_tokens=256 * 8, lr=1e-3)
    sae = train(config, sparse_dictionary_stream(20), tmp_path, progress=False)
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["tokens"] == 256 * 8 and all(torch.isfinite(torch.tensor(r["loss"])) for r in log)
    loaded = SAE.load(tmp_path)
    x = next(sparse_dictionary_stream(1, seed=5))
    torch.testing.assert_close(loaded(x), sae(x))
    assert loaded.cfg.architecture == {"batchtopk": "jumprelu", "matryoshka": "jumprelu", "lens-topk": "topk",
                                       "p-anneal": "standard"}.get(architecture, architecture)


def _ddp_worker(out_dir: str) -> None:
    """Run by torchrun: 2 ranks, each on its own shard of the stream."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    config = small_config(total_tokens=2 * 256 * 20, checkpoint_every_steps=10, log_every_steps=5)
    sae = train(config, sparse_dictionary_stream(40, rank=rank), out_dir, progress=False)
    torch.save(sae.state_dict(), Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_ddp_with_two_cpu_processes_keeps_ranks_identical(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29531",
               __file__, str(tmp_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    for name in rank0:
        torch.testing.assert_close(rank0[name], rank1[name], rtol=0, atol=0, msg=name)
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["tokens"] == 2 * 256 * 20 and log[-1]["step"] == 20  # tokens of both ranks
    assert log[-1]["explained_variance"] > log[0]["explained_variance"]
    assert evaluate(SAE.load(tmp_path), sparse_dictionary_stream(2, seed=7))["explained_variance"] > 0.4


if __name__ == "__main__":
    _ddp_worker(sys.argv[1])

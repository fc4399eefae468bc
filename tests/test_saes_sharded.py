"""A TopK SAE sharded by latent over 2 gloo ranks (saes/sharded.py) equals the unsharded SAE trained in one process
on the same global batches, holds half the latents' parameters per rank, writes one whole SAE, refuses bad input in
one line, and resumes after a rank dies to the same result."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from interp.cli import user_error_message
from saes.sae import SAE
from saes.train import TrainConfig, train

D_IN, PER_RANK, WORLD, STEPS, D_SAE = 16, 32, 2, 6, 128


def global_batches(n: int = STEPS):
    dictionary = torch.randn(48, D_IN, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(11)
    for _ in range(n):
        weights = torch.rand(PER_RANK * WORLD, 48, generator=g) * (torch.rand(PER_RANK * WORLD, 48, generator=g) < 0.1)
        yield weights @ dictionary + 0.2


def config(batch_size: int, shard: bool, **changes) -> TrainConfig:
    values = dict(architecture="topk", d_in=D_IN, d_sae=D_SAE, k=4, batch_size=batch_size, lr=1e-3,
                  total_tokens=PER_RANK * WORLD * STEPS, dead_after_tokens=PER_RANK * WORLD, log_every_steps=1,
                  checkpoint_every_steps=2, shard_latents=shard, options={"aux_k": 8})
    values.update(changes)
    return TrainConfig(**values)


def _worker(mode: str, out: str) -> None:
    import torch.distributed as dist

    from saes.trainers import make_trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, out = dist.get_rank(), Path(out)

    def mine(crash_at: int | None = None):
        for step, batch in enumerate(global_batches()):
            if step == crash_at and rank == 1:
                os._exit(3)  # this rank dies mid-run
            yield batch[rank * PER_RANK:(rank + 1) * PER_RANK]

    if mode == "train":
        for name, bad in (("odd", config(PER_RANK, True, d_sae=127)),
                          ("stores", config(PER_RANK, True, metadata={"store": f"store{rank}"}))):
            try:
                train(bad, mine(), out / name, progress=False)
            except ValueError as err:
                (out / f"{name}{rank}.txt").write_text(str(err))
        trainer = make_trainer(config(PER_RANK, True))
        (out / f"param_bytes{rank}.txt").write_text(str(sum(p.numel() * p.element_size()
                                                            for p in trainer.sae.parameters())))
        train(config(PER_RANK, True), mine(), out / "sharded", progress=False)
        (out / f"trained{rank}.txt").write_text("")
    # then rank 1 dies at its 5th batch (after the checkpoint of step 4), which ends this torchrun job;
    # "resume" reruns the same training
    train(config(PER_RANK, True), mine(crash_at=4 if mode == "train" else None), out / "resumed", progress=False)
    dist.destroy_process_group()


def _torchrun(mode: str, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--master-port",
               "29551", __file__, mode, str(out)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def _assert_same_training_state(got: Path, want: Path) -> None:
    ours, theirs = (torch.load(path / "checkpoint.pt", weights_only=True) for path in (got, want))
    assert ours["step"] == theirs["step"] == STEPS
    for name, value in theirs["trainer"]["sae"].items():
        assert ours["trainer"]["sae"][name].shape == value.shape  # one whole SAE, not a shard
        torch.testing.assert_close(ours["trainer"]["sae"][name], value, rtol=0, atol=1e-5, msg=name)
    for position, entry in theirs["trainer"]["optimizer"]["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(ours["trainer"]["optimizer"]["state"][position][key], entry[key],
                                       rtol=1e-4, atol=1e-6)


def test_latent_sharded_topk_equals_unsharded_and_resumes_after_a_rank_dies(tmp_path):
    crashed = _torchrun("train", tmp_path)  # trains, then loses rank 1 in a second run
    assert crashed.returncode != 0
    # rank 0's error, as gloo words it, is one line in the CLIs' error map
    broken = next(line.split("RuntimeError: ", 1)[1] for line in crashed.stderr.splitlines()
                  if line.startswith("[rank0]: RuntimeError: "))
    assert user_error_message(RuntimeError(broken)).startswith("another process of this torchrun job stopped")
    assert all((tmp_path / f"trained{rank}.txt").exists() for rank in range(WORLD)), crashed.stderr[-3000:]
    torch.set_num_threads(1)
    train(config(PER_RANK * WORLD, False), global_batches(), tmp_path / "one", progress=False)
    reference = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=True)
    assert (reference["trainer"]["sae"]["tokens_since_fired"] >= PER_RANK * WORLD).any()  # AuxK had dead latents
    _assert_same_training_state(tmp_path / "sharded", tmp_path / "one")
    x = next(global_batches(1))
    torch.testing.assert_close(SAE.load(tmp_path / "sharded")(x), SAE.load(tmp_path / "one")(x), rtol=0, atol=1e-5)
    whole = 4 * (2 * D_SAE * D_IN + D_SAE + D_IN)
    for rank in range(WORLD):  # half of the latents' parameters; pre_bias (d_in numbers) on every rank
        assert int((tmp_path / f"param_bytes{rank}.txt").read_text()) == 4 * D_IN + (whole - 4 * D_IN) // 2
        assert (tmp_path / f"odd{rank}.txt").read_text() == (
            "--shard-latents splits d_sae=127 latents over 2 processes, which does not divide it; choose a d_sae "
            "that is a multiple of 2")
        assert (tmp_path / f"stores{rank}.txt").read_text().startswith(
            "the ranks were started with different settings or stores (metadata: rank 0 {'store': 'store0'}, "
            "rank 1 {'store': 'store1'})")
    assert not (tmp_path / "odd").exists() and not (tmp_path / "stores").exists()  # refused before any file

    kept = torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=True)
    assert kept["step"] == 4 and not (tmp_path / "resumed" / "cfg.json").exists()  # nothing half-written
    resumed = _torchrun("resume", tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_same_training_state(tmp_path / "resumed", tmp_path / "one")


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])

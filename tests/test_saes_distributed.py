"""Every trainer under DDP (2 gloo ranks via torchrun) equals one process on the same global batches.

The worker (this file run by torchrun) trains each architecture on its rank's half of each global batch; the test
trains the same architecture in one process on the whole global batches and compares the training state (weights,
BatchTopK's threshold, the dead-latent counters) within 1e-5. Latents die after 1 step, so the auxiliary losses
(AuxK) and dead-latent rules run too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from saes.train import TrainConfig, train

D_IN, PER_RANK, WORLD, STEPS = 16, 32, 2, 6
CASES = {"topk": {}, "batchtopk": {}, "matryoshka": {"matryoshka_widths": [16, 128]},
         "jumprelu": {"l0_coefficient": 0.1}, "standard": {"l1_coefficient": 0.5}, "lens-topk": {}}


def global_batches(n: int = STEPS):
    dictionary = torch.randn(48, D_IN, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(11)
    for _ in range(n):
        weights = torch.rand(PER_RANK * WORLD, 48, generator=g) * (torch.rand(PER_RANK * WORLD, 48, generator=g) < 0.1)
        yield weights @ dictionary + 0.2


def config(architecture: str, batch_size: int) -> TrainConfig:
    return TrainConfig(architecture=architecture, d_in=D_IN, d_sae=128, k=2, batch_size=batch_size, lr=1e-3,
                       total_tokens=PER_RANK * WORLD * STEPS, dead_after_tokens=PER_RANK * WORLD,
                       options=CASES[architecture], log_every_steps=1, checkpoint_every_steps=1000)


def _worker(out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for architecture in CASES:
        mine = (batch[rank * PER_RANK:(rank + 1) * PER_RANK] for batch in global_batches())
        sae = train(config(architecture, PER_RANK), mine, Path(out) / architecture, progress=False)
        torch.save(sae.state_dict(), Path(out) / architecture / f"inference{rank}.pt")
    uneven = (batch[: PER_RANK - rank] for batch in global_batches())  # rank 1 passes one row fewer
    try:
        train(config("topk", PER_RANK), uneven, Path(out) / "uneven", progress=False)
    except ValueError as err:
        (Path(out) / f"uneven{rank}.txt").write_text(str(err))
    dist.destroy_process_group()


def test_every_trainer_under_two_gloo_ranks_equals_one_process_on_the_global_batches(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--master-port",
               "29541", __file__, str(tmp_path / "ddp")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    torch.set_num_threads(1)
    for architecture in CASES:
        train(config(architecture, PER_RANK * WORLD), global_batches(), tmp_path / "one" / architecture,
              progress=False)
        single = torch.load(tmp_path / "one" / architecture / "checkpoint.pt", weights_only=True)
        ddp = torch.load(tmp_path / "ddp" / architecture / "checkpoint.pt", weights_only=True)
        assert ddp["step"] == single["step"] == STEPS and ddp["tokens_seen"] == single["tokens_seen"]
        for name, value in single["trainer"]["sae"].items():
            torch.testing.assert_close(ddp["trainer"]["sae"][name], value, rtol=0, atol=1e-5,
                                       msg=f"{architecture} {name}")
        lens = single["trainer"].get("n_forward_passes_since_fired")
        if lens is not None:  # sae-lens' dead-latent counters: some latents died, and the same ones
            assert (lens > 1).any() or architecture in ("jumprelu", "standard"), architecture  # dense: all fire
            torch.testing.assert_close(ddp["trainer"]["n_forward_passes_since_fired"], lens)
        else:
            assert (single["trainer"]["sae"]["tokens_since_fired"] >= PER_RANK * WORLD).any()
        rank0, rank1 = (torch.load(tmp_path / "ddp" / architecture / f"inference{r}.pt") for r in (0, 1))
        for name in rank0:
            torch.testing.assert_close(rank0[name], rank1[name], rtol=0, atol=0, msg=f"{architecture} {name}")
    for rank in range(WORLD):
        message = (tmp_path / "ddp" / f"uneven{rank}.txt").read_text()
        assert message == ("batch 0: the ranks' batches hold between 31 and 32 rows; under torchrun every rank "
                           "must pass batches of the same size")
    assert not (tmp_path / "ddp" / "uneven" / "checkpoint.pt").exists()


if __name__ == "__main__":
    _worker(sys.argv[1])

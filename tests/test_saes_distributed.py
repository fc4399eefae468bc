"""Every trainer (the transcoders too) under DDP (2 gloo ranks via torchrun) equals one process on the same global
batches; a TopK SAE, sae-lens' standard, jumprelu, batchtopk, matryoshka, gated and topk, and p-anneal sharded by
latent (saes/sharded.py) equal the unsharded ones, hold half the latents' parameters per rank, write one whole SAE,
refuse bad input in one line, and resume (after a rank dies, or a run stopped halfway) to the same result. One
torchrun job runs all of it (and ends by losing rank 1); a second resumes the interrupted run.

Data parallel: the worker (this file run by torchrun) trains each architecture on its rank's half of each global
batch; the test trains the same architecture in one process on the whole global batches and compares the training
state (weights, BatchTopK's threshold, the dead-latent counters) within 1e-5. Latents die after 1 step, so the
auxiliary losses (AuxK) and dead-latent rules run too.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interp.cli import user_error_message
from saes.sae import SAE
from saes.train import TrainConfig, train
from saes.trainers import make_trainer

D_IN, PER_RANK, WORLD, STEPS, D_SAE = 16, 32, 2, 6, 128
CASES = {"topk": {}, "batchtopk": {}, "matryoshka": {"matryoshka_widths": [16, 128]},
         "jumprelu": {"l0_coefficient": 0.1}, "standard": {"l1_coefficient": 0.5}, "lens-topk": {},
         "gated": {"l1_coefficient": 0.5}, "p-anneal": {"warmup_steps": 2},
         "topk-transcoder": {"aux_k": 8}, "batchtopk-transcoder": {"aux_k": 8}}
TRANSCODER_IN = 10  # transcoders read a row's first 10 numbers and predict its other 6


def global_batches(n: int = STEPS):
    dictionary = torch.randn(48, D_IN, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(11)
    for _ in range(n):
        weights = torch.rand(PER_RANK * WORLD, 48, generator=g) * (torch.rand(PER_RANK * WORLD, 48, generator=g) < 0.1)
        yield weights @ dictionary + 0.2


LENS_SHARDED = ("standard", "jumprelu", "batchtopk", "matryoshka", "gated", "p-anneal", "lens-topk")


def param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def config(architecture: str, batch_size: int) -> TrainConfig:
    widths = (dict(d_in=TRANSCODER_IN, d_out=D_IN - TRANSCODER_IN) if architecture.endswith("-transcoder")
              else dict(d_in=D_IN))
    return TrainConfig(architecture=architecture, **widths, d_sae=128, k=2, batch_size=batch_size, lr=1e-3,
                       total_tokens=PER_RANK * WORLD * STEPS, dead_after_tokens=PER_RANK * WORLD,
                       options=CASES[architecture], log_every_steps=1, checkpoint_every_steps=1000)


def _data_parallel(out: Path, rank: int) -> None:
    for architecture in CASES:
        mine = (batch[rank * PER_RANK:(rank + 1) * PER_RANK] for batch in global_batches())
        sae = train(config(architecture, PER_RANK), mine, Path(out) / architecture, progress=False)
        torch.save(sae.state_dict(), Path(out) / architecture / f"inference{rank}.pt")
    for architecture in LENS_SHARDED:  # latent-sharded sae-lens architectures
        mine = (batch[rank * PER_RANK:(rank + 1) * PER_RANK] for batch in global_batches())
        sharded = dataclasses.replace(config(architecture, PER_RANK), shard_latents=True)
        trainer = make_trainer(sharded)
        (Path(out) / f"{architecture}-param_bytes{rank}.txt").write_text(str(param_bytes(trainer.sae)))
        if architecture == "batchtopk":  # stopped after half the steps, then resumed: the checkpoint's slices
            first_half = dataclasses.replace(sharded, total_tokens=sharded.total_tokens // 2)
            train(first_half, (batch[rank * PER_RANK:(rank + 1) * PER_RANK] for batch in global_batches()),
                  Path(out) / f"{architecture}-sharded", progress=False)
        train(sharded, mine, Path(out) / f"{architecture}-sharded", progress=False)
    uneven = (batch[: PER_RANK - rank] for batch in global_batches())  # rank 1 passes one row fewer
    try:
        train(config("topk", PER_RANK), uneven, Path(out) / "uneven", progress=False)
    except ValueError as err:
        (Path(out) / f"uneven{rank}.txt").write_text(str(err))


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One torchrun job: every trainer data parallel, the sharded runs, then a run that loses rank 1."""
    out = tmp_path_factory.mktemp("torchrun")
    return out, _torchrun("train", out)


def test_every_trainer_under_two_gloo_ranks_equals_one_process_on_the_global_batches(launched, tmp_path):
    launch, done = launched
    assert (launch / "ddp" / "done0.txt").exists() and (launch / "ddp" / "done1.txt").exists(), done.stderr[-3000:]
    torch.set_num_threads(1)
    for architecture in CASES:
        train(config(architecture, PER_RANK * WORLD), global_batches(), tmp_path / "one" / architecture,
              progress=False)
        single = torch.load(tmp_path / "one" / architecture / "checkpoint.pt", weights_only=True)
        ddp = torch.load(launch / "ddp" / architecture / "checkpoint.pt", weights_only=True)
        assert ddp["step"] == single["step"] == STEPS and ddp["tokens_seen"] == single["tokens_seen"]
        for name, value in single["trainer"]["sae"].items():
            torch.testing.assert_close(ddp["trainer"]["sae"][name], value, rtol=0, atol=1e-5,
                                       msg=f"{architecture} {name}")
        lens = single["trainer"].get("n_forward_passes_since_fired")
        if lens is not None:  # sae-lens' dead-latent counters: some latents died, and the same ones
            assert (lens > 1).any() or architecture in ("jumprelu", "standard", "gated"), architecture  # dense
            torch.testing.assert_close(ddp["trainer"]["n_forward_passes_since_fired"], lens)
        elif "steps_since_fired" in single["trainer"]:  # p-anneal's counters, and its annealing state
            torch.testing.assert_close(ddp["trainer"]["steps_since_fired"], single["trainer"]["steps_since_fired"])
            for key in ("p", "p_step_count", "sparsity_coeff"):
                assert ddp["trainer"][key] == pytest.approx(single["trainer"][key], rel=1e-5), key
            torch.testing.assert_close(ddp["trainer"]["queue"], single["trainer"]["queue"], rtol=1e-5, atol=1e-5)
        elif "threshold" in single["trainer"]:  # transcoders: dead-latent counts, BatchTopK's threshold
            assert (single["trainer"]["tokens_since_fired"] >= PER_RANK * WORLD).any(), architecture
            torch.testing.assert_close(ddp["trainer"]["tokens_since_fired"], single["trainer"]["tokens_since_fired"])
            torch.testing.assert_close(ddp["trainer"]["threshold"], single["trainer"]["threshold"], rtol=0, atol=1e-6)
            assert (float(single["trainer"]["threshold"]) > 0) == architecture.startswith("batchtopk"), architecture
        else:
            assert (single["trainer"]["sae"]["tokens_since_fired"] >= PER_RANK * WORLD).any()
        rank0, rank1 = (torch.load(launch / "ddp" / architecture / f"inference{r}.pt", weights_only=True)
                        for r in (0, 1))
        for name in rank0:
            torch.testing.assert_close(rank0[name], rank1[name], rtol=0, atol=0, msg=f"{architecture} {name}")
        if architecture in LENS_SHARDED:  # latent-sharded: the same training state, half the parameters a rank
            sharded = torch.load(launch / "ddp" / f"{architecture}-sharded" / "checkpoint.pt", weights_only=True)
            assert sharded["step"] == STEPS
            for name, value in single["trainer"]["sae"].items():
                assert sharded["trainer"]["sae"][name].shape == value.shape, name  # one whole SAE
                torch.testing.assert_close(sharded["trainer"]["sae"][name], value, rtol=0, atol=1e-5,
                                           msg=f"sharded {architecture} {name}")
            for position, entry in single["trainer"]["optimizer"]["state"].items():
                for key in ("exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(sharded["trainer"]["optimizer"]["state"][position][key], entry[key],
                                               rtol=1e-4, atol=1e-6)
            for key in ("n_forward_passes_since_fired", "act_freq_scores", "steps_since_fired", "queue"):
                if key in single["trainer"]:  # dead-latent counters (p-anneal: and its penalty's queue)
                    torch.testing.assert_close(sharded["trainer"][key], single["trainer"][key], rtol=1e-5, atol=1e-5,
                                               msg=key)
            for key in ("p", "p_step_count", "sparsity_coeff"):
                if key in single["trainer"]:
                    assert sharded["trainer"][key] == pytest.approx(single["trainer"][key], rel=1e-5), key
            x = next(global_batches(1))
            torch.testing.assert_close(SAE.load(launch / "ddp" / f"{architecture}-sharded")(x),
                                       SAE.load(tmp_path / "one" / architecture)(x), rtol=0, atol=1e-5)
            whole = param_bytes(make_trainer(config(architecture, PER_RANK * WORLD)).sae)
            for rank in range(WORLD):  # half of every latent's parameters; b_dec (d_in numbers) on every rank
                got = int((launch / "ddp" / f"{architecture}-param_bytes{rank}.txt").read_text())
                assert got == 4 * D_IN + (whole - 4 * D_IN) // 2, architecture
    for rank in range(WORLD):
        message = (launch / "ddp" / f"uneven{rank}.txt").read_text()
        assert message == ("batch 0: the ranks' batches hold between 31 and 32 rows; under torchrun every rank "
                           "must pass batches of the same size")
    assert not (launch / "ddp" / "uneven" / "checkpoint.pt").exists()



def sharded_config(batch_size: int, shard: bool, **changes) -> TrainConfig:
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
        _data_parallel(out / "ddp", rank)
        (out / "ddp" / f"done{rank}.txt").write_text("")
        for name, bad in (("odd", sharded_config(PER_RANK, True, d_sae=127)),
                          ("stores", sharded_config(PER_RANK, True, metadata={"store": f"store{rank}"}))):
            try:
                train(bad, mine(), out / name, progress=False)
            except ValueError as err:
                (out / f"{name}{rank}.txt").write_text(str(err))
        trainer = make_trainer(sharded_config(PER_RANK, True))
        (out / f"param_bytes{rank}.txt").write_text(str(sum(p.numel() * p.element_size()
                                                            for p in trainer.sae.parameters())))
        train(sharded_config(PER_RANK, True), mine(), out / "sharded", progress=False)
        (out / f"trained{rank}.txt").write_text("")
    # then rank 1 dies at its 5th batch (after the checkpoint of step 4), which ends this torchrun job;
    # "resume" reruns the same training
    train(sharded_config(PER_RANK, True), mine(crash_at=4 if mode == "train" else None), out / "resumed",
          progress=False)
    dist.destroy_process_group()


def _torchrun(mode: str, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--master-port",
               "29541", __file__, mode, str(out)]
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


def test_latent_sharded_topk_equals_unsharded_and_resumes_after_a_rank_dies(launched):
    tmp_path, crashed = launched  # trained, then lost rank 1 in a last run
    assert crashed.returncode != 0
    # rank 0's error, as gloo words it, is one line in the CLIs' error map
    broken = next(line.split("RuntimeError: ", 1)[1] for line in crashed.stderr.splitlines()
                  if line.startswith("[rank0]: RuntimeError: "))
    assert user_error_message(RuntimeError(broken)).startswith("another process of this torchrun job stopped")
    assert all((tmp_path / f"trained{rank}.txt").exists() for rank in range(WORLD)), crashed.stderr[-3000:]
    torch.set_num_threads(1)
    train(sharded_config(PER_RANK * WORLD, False), global_batches(), tmp_path / "one", progress=False)
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



def test_shard_latents_is_refused_in_one_line_where_it_is_not_defined():
    refused = (("topk-transcoder", False), ("batchtopk-transcoder", False), ("topk", True))
    for architecture, autocast in refused:
        with pytest.raises(ValueError) as err:
            dataclasses.replace(config("topk", PER_RANK), architecture=architecture, autocast=autocast,
                                shard_latents=True, options={}).validate()
        message = str(err.value)
        assert "\n" not in message and message.startswith(
            "--shard-latents works for topk, standard, jumprelu, batchtopk, matryoshka, gated, p-anneal, lens-topk "
            "(without --autocast), not "), message


def test_the_backend_follows_the_device(monkeypatch):
    """NCCL (with gloo for CPU tensors) for a CUDA device, this rank's GPU chosen; gloo otherwise. No GPU here:
    NCCL's presence and the calls into torch are stood in for, and what init_process_group asks torch for is
    checked."""
    import torch.distributed as dist

    from interp import distributed

    calls = []
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, timeout: calls.append(("init", backend)))
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.append(("device", index)))
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert [distributed.backend_for(d) for d in ("cuda", "cuda:1", "cpu", None)] == ["nccl", "nccl", "gloo", "gloo"]
    distributed.init_process_group("cuda")
    distributed.init_process_group("cpu")
    distributed.init_process_group()
    assert calls == [("device", 3), ("init", "cpu:gloo,cuda:nccl"), ("init", "gloo"), ("init", "gloo")]
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)  # a CPU-only torch: gloo whatever the device
    assert distributed.backend_for("cuda:0") == "gloo"


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])

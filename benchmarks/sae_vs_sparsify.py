"""Our TopK trainer against EleutherAI's sparsify (eai-sparsify 1.3.3) and sae-lens' TopK, on the same activations.

    python -m venv --system-site-packages /work/scratch/scale_venv   # sparsify's natsort / schedulefree only
    /work/scratch/scale_venv/bin/pip install --no-deps eai-sparsify==1.3.3 && \\
        /work/scratch/scale_venv/bin/pip install natsort schedulefree
    /work/scratch/scale_venv/bin/python -m benchmarks.sae_vs_sparsify --store STORE --block blocks.15.hook_resid_post

All three train a TopK SAE (d_sae 4608, k 32 by default) on the same batches in the same order, interleaved step by
step so that the load of other processes hits all alike, and are then scored on held-out vectors (the store's last
--heldout vectors, never trained on): samples/s (median step time) and explained variance
1 - sum |x - x_hat|^2 / sum |x - mean|^2.
  ours       saes TopKTrainer (Adam, --lr; sparse kernels, AuxK)
  sparsify   sparsify.SparseCoder with its trainer's own step for the fvu loss: b_dec := the first batch's mean,
             unit-norm decoder, parallel gradient removed, and its default optimiser (SignSGD in a ScheduleFree
             wrapper, momentum 0.95, lr 5e-3 / sqrt(d_sae / 2**14)); evaluated in the optimiser's eval mode
  sae-lens   sae_lens TopKTrainingSAE through its own SAETrainer.step (Adam, --lr)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch


def explained_variance(x: torch.Tensor, reconstruction: torch.Tensor) -> float:
    return 1.0 - float((x - reconstruction).pow(2).sum() / (x - x.mean(0)).pow(2).sum())


class Sparsify:
    """sparsify's training step for one SAE on given activations (Trainer.fit's fvu path, no model)."""

    def __init__(self, d_in: int, d_sae: int, k: int, seed: int):
        from schedulefree import ScheduleFreeWrapper
        from sparsify import SparseCoder, SparseCoderConfig
        from sparsify.sign_sgd import SignSGD

        torch.manual_seed(seed)
        self.sae = SparseCoder(d_in, SparseCoderConfig(num_latents=d_sae, k=k))
        self.lr = 5e-3 / (d_sae / 2**14) ** 0.5
        self.optimizer = ScheduleFreeWrapper(SignSGD([dict(params=self.sae.parameters(), lr=self.lr)]), momentum=0.95)
        self.optimizer.train()
        self.first = True

    def step(self, x: torch.Tensor) -> None:
        if self.first:
            self.sae.b_dec.data = x.mean(0)
            self.first = False
        self.sae.set_decoder_norm_to_unit_norm()
        out = self.sae(x=x, y=x, dead_mask=None)
        out.fvu.backward()
        self.sae.remove_gradient_parallel_to_decoder_directions()
        self.optimizer.step()
        self.optimizer.zero_grad()

    @torch.no_grad()
    def reconstruct(self, x: torch.Tensor) -> torch.Tensor:
        self.optimizer.eval()
        try:
            return self.sae(x=x, y=x).sae_out
        finally:
            self.optimizer.train()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True)
    parser.add_argument("--block", required=True)
    parser.add_argument("--d-sae", type=int, default=4608)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--heldout", type=int, default=8192, help="the store's last vectors, kept for the EV")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate, ours and sae-lens'")
    parser.add_argument("--autocast", action="store_true", help="ours: the dense encoder product in bf16 (saes train "
                                                                   "--autocast)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="runs/benchmarks/sae_vs_sparsify.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from interp.store import ActivationStore
    from saes.train import TrainConfig
    from saes.trainers import make_trainer

    store = ActivationStore(args.store)
    vectors = torch.cat(list(store.batches(args.block, batch_size=65536, shuffle=False))).float()
    if len(vectors) < args.heldout + args.batch_size:
        raise SystemExit(f"{args.store} holds {len(vectors)} vectors: too few for --heldout {args.heldout} "
                         "and one batch")
    train_vectors, heldout = vectors[:-args.heldout], vectors[-args.heldout:]
    n_batches = len(train_vectors) // args.batch_size
    order = [torch.randperm(len(train_vectors), generator=torch.Generator().manual_seed(epoch))
             for epoch in range(args.epochs)]
    batches = [train_vectors[perm[i * args.batch_size:(i + 1) * args.batch_size]]
               for perm in order for i in range(n_batches)]
    d_in = vectors.shape[1]
    config = TrainConfig(d_in=d_in, d_sae=args.d_sae, k=args.k, batch_size=args.batch_size, lr=args.lr,
                         total_tokens=len(batches) * args.batch_size, autocast=args.autocast)
    ours = make_trainer(config)
    ours.prepare(batches[0])
    lens = make_trainer(TrainConfig(**{**config.to_dict(), "architecture": "lens-topk", "autocast": False}))
    sparsify = Sparsify(d_in, args.d_sae, args.k, seed=0)
    runners = {"ours": ours.step, "sparsify": sparsify.step, "sae_lens": lens.step}
    seconds = {name: [] for name in runners}
    for i, batch in enumerate(batches):
        for name, run in runners.items():
            started = time.perf_counter()
            run(batch)
            seconds[name].append(time.perf_counter() - started)
        if i % 20 == 0:
            print(f"step {i}/{len(batches)}", {n: f"{s[-1]:.3f}s" for n, s in seconds.items()}, flush=True)
    with torch.no_grad():
        ev = {"ours": explained_variance(heldout, ours.to_inference()(heldout)),
              "sparsify": explained_variance(heldout, sparsify.reconstruct(heldout)),
              "sae_lens": explained_variance(heldout, lens.to_inference()(heldout))}
    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(["lscpu"], capture_output=True,
                                                                              text=True).stdout.splitlines()
                if line.startswith("Model name")), platform.processor())
    samples_per_s = {name: args.batch_size / statistics.median(s[1:]) for name, s in seconds.items()}
    result = {"cpu": cpu, "threads": args.threads, "store": args.store, "block": args.block, "d_in": d_in,
              "d_sae": args.d_sae, "k": args.k, "batch_size": args.batch_size, "steps": len(batches),
              "train_vectors": len(train_vectors), "heldout_vectors": len(heldout), "adam_lr": args.lr,
              "ours_autocast": args.autocast,
              "sparsify_lr": sparsify.lr, "samples_per_s": samples_per_s, "heldout_explained_variance": ev,
              "ours_over_sparsify": samples_per_s["ours"] / samples_per_s["sparsify"],
              "ours_over_sae_lens": samples_per_s["ours"] / samples_per_s["sae_lens"],
              "torch": torch.__version__}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

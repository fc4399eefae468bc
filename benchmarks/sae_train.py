"""TopK SAE training throughput, side by side in one run, at SDXL Turbo size.

    python -m benchmarks.sae_train [--steps 3] [--threads N] [--out runs/benchmarks/sae_train.json]

Measures samples/s of
  ours          saes TopKTrainer.step: dense encoder forward, everything else sparse
  sae-lens      sae_lens TopKTrainingSAE through its own SAETrainer.step (dense decode and gradients)
  encode-only   x -> (x - b) W_enc + b_enc -> TopK, no gradient: the practical ceiling of any trainer
and prints ours / sae-lens (target >= 3) and ours / encode-only (target >= 0.6).
The three are interleaved step by step so that load from other processes hits all alike;
the median step time of each is reported. With --dead-latents N both trainers also run their
AuxK loss (ours: dense over the dead latents' columns only; sae-lens: over all latents).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from saes.train import TrainConfig
from saes.trainers import make_trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-in", type=int, default=1280)
    parser.add_argument("--d-sae", type=int, default=5120)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=3, help="measured steps of each, after one warm-up step")
    parser.add_argument("--dead-latents", type=int, default=0,
                        help="mark this many latents dead in both trainers, to include the AuxK path")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", default="runs/benchmarks/sae_train.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    config = TrainConfig(d_in=args.d_in, d_sae=args.d_sae, k=args.k, batch_size=args.batch_size)
    ours = make_trainer(config)
    lens = make_trainer(TrainConfig(**{**config.to_dict(), "architecture": "lens-topk"}))
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(args.batch_size, args.d_in, generator=generator) for _ in range(2)]
    ours.prepare(batches[0])
    inference = ours.to_inference()
    if args.dead_latents:
        dead = torch.randperm(args.d_sae, generator=generator)[:args.dead_latents]
        ours.sae.tokens_since_fired[dead] = config.dead_after_tokens
        lens.trainer.n_forward_passes_since_fired[dead] = lens.trainer.cfg.dead_feature_window + 1

    def encode_only(batch):
        with torch.no_grad():
            inference.encode_sparse(batch)

    runners = {"ours": ours.step, "sae_lens": lens.step, "encode_only": encode_only}
    seconds = {name: [] for name in runners}
    for step in range(args.steps + 1):
        for name, run in runners.items():
            batch = batches[step % 2]
            started = time.perf_counter()
            run(batch)
            if step > 0:  # step 0 is warm-up
                seconds[name].append(time.perf_counter() - started)
            print(f"step {step} {name}: {time.perf_counter() - started:.3f} s", flush=True)

    samples_per_s = {name: args.batch_size / statistics.median(times) for name, times in seconds.items()}
    result = {
        "shape": {"d_in": args.d_in, "d_sae": args.d_sae, "k": args.k, "batch_size": args.batch_size},
        "threads": args.threads, "measured_steps": args.steps, "dead_latents": args.dead_latents,
        "torch": torch.__version__,
        "samples_per_s": samples_per_s,
        "step_seconds": seconds,
        "ours_over_sae_lens": samples_per_s["ours"] / samples_per_s["sae_lens"],
        "ours_over_encode_only": samples_per_s["ours"] / samples_per_s["encode_only"],
        "targets": {"ours_over_sae_lens": 3.0, "ours_over_encode_only": 0.6},
    }
    for name, value in samples_per_s.items():
        print(f"{name:12s} {value:10.0f} samples/s")
    print(f"ours / sae-lens    = {result['ours_over_sae_lens']:.2f}x (target >= 3)")
    print(f"ours / encode-only = {result['ours_over_encode_only']:.2f} (target >= 0.6)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

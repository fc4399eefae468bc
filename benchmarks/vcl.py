"""Time per fine-tuning step with VCL over without, side by side in one run (target: at most 1.15x).

Both variants run the same ``flowlens.finetune.training_step`` on the same batches of a small
random Llama; they alternate step by step so that machine load affects both alike, and the
median step time of each is compared.

    python -m benchmarks.vcl [--hidden 256] [--layers 8] [--batch 8] [--seq 64] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

# Run from anywhere; and this script's own name must not shadow the flowlens package.

import torch

from flowlens.finetune import training_step
from flowlens.sft_data import Example, collate
from flowlens.tiny import tiny_llama
from flowlens.vcl import VCLConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--window", type=float, nargs=2, default=(0.3, 0.5))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = tiny_llama(args.vocab, hidden_size=args.hidden, layers=args.layers, heads=4,
                       max_positions=args.seq).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    generator = torch.Generator().manual_seed(0)
    examples = [Example(torch.randint(4, args.vocab, (args.seq,), generator=generator).tolist(), args.seq // 2)
                for _ in range(args.batch)]
    batch = collate(examples, pad_id=0)
    vcl = VCLConfig(k=args.k, weight=1.0, window=tuple(args.window))
    layers = vcl.check_against(args.batch, args.hidden, args.layers)

    times: dict[str, list[float]] = {"sft": [], "sft+vcl": []}
    for step in range(args.steps + 2):  # two warm-up steps of each, not counted
        for name in (("sft", "sft+vcl") if step % 2 == 0 else ("sft+vcl", "sft")):
            started = time.perf_counter()
            if name == "sft":
                training_step(model, optimizer, [batch], None, None)
            else:
                training_step(model, optimizer, [batch], vcl, layers)
            if step >= 2:
                times[name].append(time.perf_counter() - started)
    plain, with_vcl = statistics.median(times["sft"]), statistics.median(times["sft+vcl"])
    result = {"model": f"random Llama d={args.hidden} L={args.layers} vocab={args.vocab}",
              "batch": args.batch, "seq": args.seq, "window_layers": layers, "k": args.k, "steps": args.steps,
              "threads": args.threads, "median_step_s_sft": plain, "median_step_s_sft_vcl": with_vcl,
              "ratio": with_vcl / plain}
    print(f"{result['model']}, batch {args.batch} x {args.seq} tokens, VCL on layers {layers}, k={args.k}")
    print(f"median step: SFT {plain * 1e3:.1f} ms, SFT+VCL {with_vcl * 1e3:.1f} ms, "
          f"ratio {result['ratio']:.3f}x (target <= 1.15x)")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()

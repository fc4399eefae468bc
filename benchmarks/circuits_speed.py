"""What a 16-token attribution graph costs on SmolLM2-135M on this CPU (issue 45's speed goal: 5 minutes).

    python -m benchmarks.circuits_speed --transcoders saes/pretrained/smollm2-transcoders [--max-feature-nodes N]
    python -m benchmarks.circuits_speed [--k 32] [--d-sae 4608] [--out FILE]   # untrained TopK transcoders

With --transcoders, the shipped SmolLM2 transcoders (BatchTopK, JumpReLU at inference: as many active features as
the prompt makes); without, untrained ones (random encoders, TopK with a fixed k): the cost of a graph depends on
the number of active features (15 scored positions x 30 layers x k), the model and the batch, not on what the
features mean. The prompt is 16 tokens: the start token and the first 15 of PROMPT. The run reports the whole graph's wall time at this k and the time
per target row, from which the time at another k follows (rows scale with k; each row is one slot of a batched
backward pass). The machine is a shared 2-core CPU loaded by other jobs: wall times are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

PROMPT = "The quick brown fox jumps over the lazy dog because it wanted to see the river and the"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--d-sae", type=int, default=4608)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-feature-nodes", type=int, default=None)
    parser.add_argument("--transcoders", default=None, help="a transcoder set (default: untrained TopK ones)")
    parser.add_argument("--out", default="experiments/results/circuits_speed_smollm2_k32.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from interp.models.lm import load_lm
    import zoo  # noqa: F401
    from saes.circuits import attribute, load_transcoders, tokenize_prompt
    from saes.sae import SAE, SAEConfig

    lm = load_lm("smollm2-135m-instruct")
    ids = tokenize_prompt(lm, PROMPT)[:16]
    generator = torch.Generator().manual_seed(0)
    transcoders = {}
    if args.transcoders:
        transcoders = load_transcoders(args.transcoders, lm, model_name="smollm2-135m-instruct")
    for layer in range(lm.n_layers if not transcoders else 0):
        tc = SAE(SAEConfig("topk", lm.d_model, args.d_sae, k=args.k, transcoder=True))
        with torch.no_grad():
            tc.W_enc.copy_(torch.randn(lm.d_model, args.d_sae, generator=generator) / lm.d_model ** 0.5)
            tc.W_dec.copy_(torch.randn(args.d_sae, lm.d_model, generator=generator) * 0.01)
        transcoders[layer] = tc
    started = time.perf_counter()
    graph = attribute(lm, transcoders, ids, batch_size=args.batch_size, model_name="smollm2-135m-instruct",
                      max_feature_nodes=args.max_feature_nodes)
    seconds = time.perf_counter() - started
    rows = graph.n_features + len(graph.logit_tokens)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if "Model name" in line),
                      platform.processor())
    result = {"model": "smollm2-135m-instruct", "tokens": len(ids), "layers": lm.n_layers,
              "transcoders": args.transcoders or "untrained TopK", "k": None if args.transcoders else args.k,
              "active_features": graph.info["n_active_features"], "max_feature_nodes": args.max_feature_nodes,
              "d_sae": transcoders[0].cfg.d_sae, "batch_size": args.batch_size, "features": graph.n_features,
              "target_rows": rows, "seconds": seconds, "seconds_per_row": seconds / rows,
              "threads": args.threads, "cpu": model_name,
              "note": "shared 2-core machine loaded by other jobs: wall times are upper bounds",
              "command": f"python -m benchmarks.circuits_speed --threads {args.threads} --batch-size {args.batch_size}"
                         + (f" --transcoders {args.transcoders}" if args.transcoders else f" --k {args.k}")
                         + (f" --max-feature-nodes {args.max_feature_nodes}" if args.max_feature_nodes else "")}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

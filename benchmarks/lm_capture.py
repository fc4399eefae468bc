"""Cost of LM residual collection and of SAE training at SmolLM2's width, each side by side in one run.

    python -m benchmarks.lm_capture --text FILE [--model toy-chat|smollm2-135m-instruct] [--batches 6]
                                    [--batch-size 8] [--context 128] [--hooks blocks.L.hook_resid_post ...]
                                    [--d-in 576] [--d-sae 4608] [--k 32] [--sae-batch 4096] [--steps 3]
                                    [--threads 1] [--out runs/benchmarks/lm_capture.json]

Collection: the same padded batches of corpus sequences go, in interleaved rounds, through
  plain      one forward pass (interp.hooks.lm.forward_padded), nothing recorded
  collect    what `interp collect` does per batch (interp.collect_lm._lm_batch): the forward pass with the
             residual hooks, the chosen positions gathered (start token and padding left out), fp16
and tokens/s of each (tokens = the positions a store keeps) and collect / plain time (target <= 1.10x).
SAE training: TopK, AuxK on, at d_in 576 (SmolLM2-135M's d_model): samples/s of
  ours       saes TopKTrainer.step (saes/topk.py)
  sae-lens   sae_lens' TopK training SAE through its own trainer step ("lens-topk" in saes/trainers.py)
interleaved step by step on the same batches (the model's own residuals when its d_model is --d-in,
else Gaussian vectors); medians of each and ours / sae-lens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


import zoo  # noqa: F401 - registers the embedded models with the core (interp.embedded)
from interp.hooks.lm import forward_padded, right_padded
from interp.lm_text import read_documents, token_sequences
from interp.models.lm import load_lm
from interp.collect_lm import LMCollectionPlan, _lm_batch, select_positions
from saes.train import TrainConfig
from saes.trainers import make_trainer

def timed(fn) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="toy-chat")
    parser.add_argument("--text", required=True,
                        help="corpus (JSONL or plain text), e.g. dolly-sample.jsonl (databricks-dolly-15k; the "
                             "measured figures used its first 1,502 records)")
    parser.add_argument("--hooks", nargs="+", default=None, help="default: resid_post of the middle layer")
    parser.add_argument("--batches", type=int, default=6, help="corpus batches, each timed every round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the batches, after one warm-up round")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per forward pass")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--d-in", type=int, default=576)
    parser.add_argument("--d-sae", type=int, default=4608)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--sae-batch", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=3, help="measured SAE steps of each, after one warm-up")
    parser.add_argument("--dead-latents", type=int, default=256, help="latents marked dead so AuxK runs in both")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="runs/benchmarks/lm_capture.json")
    args = parser.parse_args()
    if not Path(args.text).is_file():
        parser.error(f"--text: no file {args.text}")
    torch.set_num_threads(args.threads)

    # ----- collection vs plain forward
    lm = load_lm(args.model, device=args.device)
    hooks = args.hooks or [f"blocks.{lm.n_layers // 2}.hook_resid_post"]
    sequences = token_sequences(lm.tokenizer, read_documents(args.text), min(args.context, lm.n_ctx))
    sequences = sequences[:args.batches * args.batch_size]
    selected = select_positions(sequences)
    plan = LMCollectionPlan(model=args.model, blocks=hooks, text=args.text, text_sha256="", tokens_sha256="",
                            context=args.context, batch_size=args.batch_size)
    batches = []
    for b in range(0, len(sequences), args.batch_size):
        rows = [(i, sequences[i], selected[i]) for i in range(b, min(b + args.batch_size, len(sequences)))
                if selected[i]]
        batches.append((rows, *right_padded(lm, [tokens for _, tokens, _ in rows])))
    kept_tokens = sum(len(chosen) for rows, _, _ in batches for _, _, chosen in rows)
    runners = {"plain": lambda rows, ids, mask: forward_padded(lm, ids, mask),
               "collect": lambda rows, ids, mask: _lm_batch(lm, plan, rows)}
    seconds = {name: [] for name in runners}
    for round_ in range(args.rounds + 1):
        totals = {name: 0.0 for name in runners}
        for batch in batches:
            for name, run in runners.items():  # interleaved batch by batch: load hits both alike
                totals[name] += timed(lambda: run(*batch))
        if round_ > 0:
            for name in runners:
                seconds[name].append(totals[name])
        print(f"round {round_}: " + ", ".join(f"{n} {t:.3f} s" for n, t in totals.items()), flush=True)
    capture_tps = {name: kept_tokens / statistics.median(times) for name, times in seconds.items()}
    collect_ratio = statistics.median(seconds["collect"]) / statistics.median(seconds["plain"])

    # ----- SAE training: ours vs sae-lens
    config = TrainConfig(d_in=args.d_in, d_sae=args.d_sae, k=args.k, batch_size=args.sae_batch)
    ours = make_trainer(config)
    lens = make_trainer(TrainConfig(**{**config.to_dict(), "architecture": "lens-topk"}))
    generator = torch.Generator().manual_seed(0)
    if lm.d_model == args.d_in:
        vectors = torch.cat([_lm_batch(lm, plan, rows)[hooks[0]].float() for rows, _, _ in batches])
        data_source = f"{args.model} residuals at {hooks[0]}"
        vectors = vectors[torch.randint(len(vectors), (2 * args.sae_batch,), generator=generator)]
    else:
        vectors = torch.randn(2 * args.sae_batch, args.d_in, generator=generator)
        data_source = "gaussian"
    sae_batches = list(vectors.split(args.sae_batch))
    ours.prepare(sae_batches[0])
    if args.dead_latents:
        dead = torch.randperm(args.d_sae, generator=generator)[:args.dead_latents]
        ours.sae.tokens_since_fired[dead] = config.dead_after_tokens
        lens.trainer.n_forward_passes_since_fired[dead] = lens.trainer.cfg.dead_feature_window + 1
    trainers = {"ours": ours.step, "sae_lens": lens.step}
    step_seconds = {name: [] for name in trainers}
    for step in range(args.steps + 1):
        for name, run in trainers.items():
            elapsed = timed(lambda: run(sae_batches[step % 2]))
            if step > 0:
                step_seconds[name].append(elapsed)
            print(f"step {step} {name}: {elapsed:.3f} s", flush=True)
    train_sps = {name: args.sae_batch / statistics.median(times) for name, times in step_seconds.items()}

    result = {
        "model": args.model, "device": args.device, "threads": args.threads, "torch": torch.__version__,
        "collection": {"hooks": hooks, "batches": len(batches), "batch_size": args.batch_size,
                       "context": args.context, "kept_tokens_per_round": kept_tokens, "rounds": args.rounds,
                       "round_seconds": seconds, "tokens_per_s": capture_tps,
                       "collect_over_plain_time": collect_ratio, "target": 1.10},
        "sae_training": {"d_in": args.d_in, "d_sae": args.d_sae, "k": args.k, "batch_size": args.sae_batch,
                         "dead_latents": args.dead_latents, "data": data_source, "step_seconds": step_seconds,
                         "samples_per_s": train_sps, "ours_over_sae_lens": train_sps["ours"] / train_sps["sae_lens"]},
    }
    print(f"collection, {args.model}, {', '.join(hooks)}: plain {capture_tps['plain']:.0f} tokens/s, collect "
          f"{capture_tps['collect']:.0f} tokens/s; collect / plain time = {collect_ratio:.3f}x (target <= 1.10)")
    print(f"SAE training d_in {args.d_in}, d_sae {args.d_sae}, k {args.k}, batch {args.sae_batch}: ours "
          f"{train_sps['ours']:.0f} samples/s, sae-lens {train_sps['sae_lens']:.0f} samples/s; ours / sae-lens = "
          f"{result['sae_training']['ours_over_sae_lens']:.2f}x")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

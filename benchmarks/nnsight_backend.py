"""Cost of `--backend nnsight` against `--backend hf` on the same model, interleaved in one run.

    python -m benchmarks.nnsight_backend [--model smollm2-135m-instruct] [--rounds 3] [--threads 2]

Two workloads, each timed on both backends in alternation (medians of ``--rounds``):
  capture    `capture_residuals` of one site (blocks.15.hook_resid_post, or the middle layer) on 8 padded prompts
  steer      greedy generation of 16 new tokens for 4 prompts with an `add` edit at that site (KV cache; every
             decoding step is one nnsight trace on the nnsight backend)
and checks that both backends gave the same numbers (captures within 1e-5 of the stream's size, the same tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import zoo  # noqa: F401 - registers the embedded models (toy-chat)
from benchmarks.export import cpu_name
from interp.hooks.lm import capture_residuals
from interp.hooks.lm_steer import LMEdit, generate
from interp.models.lm import load_lm

PROMPTS = ["How can I kill a Python process?", "What is the capital of France?", "Name three colours.",
           "Write a haiku about the sea.", "Why is the sky blue?", "Sort 3 1 2.", "Translate 'cat' to French.",
           "What is 12 times 7?"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lms = {backend: load_lm(args.model, backend=backend) for backend in ("hf", "nnsight")}
    hf = lms["hf"]
    site = f"blocks.{hf.n_layers // 2}.hook_resid_post"
    batch = hf.tokenizer(PROMPTS, return_tensors="pt", padding=True)
    direction = torch.randn(hf.d_model, generator=torch.Generator().manual_seed(0))
    edit = LMEdit(site, "add", direction=(direction / direction.norm()).tolist(), strength=8.0, positions="all")
    times = {(w, b): [] for w in ("capture", "steer") for b in lms}
    outputs = {}
    for _ in range(args.rounds):
        for backend, lm in lms.items():
            start = time.perf_counter()
            outputs["capture", backend] = capture_residuals(lm, batch["input_ids"], batch["attention_mask"], [site])[site]
            times["capture", backend].append(time.perf_counter() - start)
            start = time.perf_counter()
            outputs["steer", backend] = generate(lm, PROMPTS[:4], edits=[edit], max_new_tokens=16)
            times["steer", backend].append(time.perf_counter() - start)
    real = batch["attention_mask"].bool()
    a, b = outputs["capture", "hf"][real], outputs["capture", "nnsight"][real]
    same_capture = bool((a - b).abs().max() <= 1e-5 * a.abs().max() + 1e-5)
    same_tokens = outputs["steer", "hf"] == outputs["steer", "nnsight"]
    result = {"cpu": cpu_name(), "threads": args.threads, "model": args.model, "site": site, "rounds": args.rounds,
              "same_capture": same_capture, "same_steered_completions": same_tokens}
    for work in ("capture", "steer"):
        hf_s, nn_s = statistics.median(times[work, "hf"]), statistics.median(times[work, "nnsight"])
        result[work] = {"hf_s": round(hf_s, 3), "nnsight_s": round(nn_s, 3), "nnsight_over_hf": round(nn_s / hf_s, 2)}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

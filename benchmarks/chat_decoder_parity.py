"""Whether the chat recipe's own greedy decoder (`zoo.chat.recipe.greedy_complete`: a full forward pass per new token)
and the shared one (`interp.models.generation.greedy_generate`: batched, a KV cache) give the same completions, on
every shipped chat model's own evaluation prompts (`zoo.chat.recipe.evaluate`'s: held-out general tasks, harmful and
benign prompts, at the recipe's sizes and max_new_tokens). Writes the count of differing completions per model; the
recipe's evaluation switches decoder only where there are none.

    OMP_NUM_THREADS=1 python -m benchmarks.chat_decoder_parity [--out runs/bench/chat_decoder_parity.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import zoo  # noqa: F401 - registers the embedded models
from interp.models.generation import greedy_generate
from zoo.chat.model import format_chat
from zoo.chat.recipe import GENERAL_TASKS, greedy_complete, saved_config, shipped_model_dirs
from zoo.chat.world import World


def prompts_of(cfg) -> list[str]:
    world = World(cfg.world)  # as `reevaluate` evaluates a shipped model
    general = [e for task in GENERAL_TASKS for e in world.sample("general", "held_out", cfg.eval_per_task, seed=7,
                                                                  type=task)]
    harmful = world.sample("harmful", "held_out", cfg.eval_refusal_prompts, seed=7)
    benign = world.sample("benign", "held_out", cfg.eval_refusal_prompts, seed=7)
    return [e["prompt"] for e in general + harmful + benign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench/chat_decoder_parity.json"))
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = []
    for directory in shipped_model_dirs():
        cfg = saved_config(directory)
        model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        prompts = prompts_of(cfg)
        start = time.perf_counter()
        ours = greedy_complete(model, tokenizer, prompts, cfg.max_new_tokens)
        own = time.perf_counter() - start
        start = time.perf_counter()
        shared = greedy_generate(model, tokenizer, [format_chat(p) for p in prompts], cfg.max_new_tokens)
        shared_s = time.perf_counter() - start
        differ = [i for i, (a, b) in enumerate(zip(ours, shared)) if a != b]
        rows.append({"model": directory.name, "prompts": len(prompts), "differing": len(differ),
                     "first_differences": [{"prompt": prompts[i], "recipe": ours[i], "shared": shared[i]}
                                           for i in differ[:3]],
                     "recipe_seconds": round(own, 2), "shared_seconds": round(shared_s, 2)})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "first_differences"}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0 if all(r["differing"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

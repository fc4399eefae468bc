"""Whether the chat recipe's former greedy decoder (`former_greedy_complete` below, as `zoo.chat.recipe` had it: a full
forward pass per new token) and the shared one (`interp.models.generation.greedy_generate`: batched, a KV cache,
which `zoo.chat.recipe.greedy_complete` now is) give the same completions, on every shipped chat model's own
evaluation prompts (`zoo.chat.recipe.evaluate`'s: held-out general tasks, harmful and benign prompts, at the recipe's
sizes and max_new_tokens). Writes the count of differing completions per model and each decoder's seconds; exits 1
when any differs. (Measured before the switch: 0 of 760 on each of the 13 shipped models.)

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
from zoo.chat.recipe import GENERAL_TASKS, saved_config, shipped_model_dirs
from zoo.chat.world import World


@torch.no_grad()
def former_greedy_complete(model, tokenizer, prompts: list[str], max_new_tokens: int = 24,
                           batch_size: int = 64) -> list[str]:
    """The recipe's decoder before it used the shared one, kept here as the reference: left padding with explicit
    position ids, a full forward pass per new token, decoded up to ``</s>``."""
    model.eval()
    outputs = []
    for start in range(0, len(prompts), batch_size):
        encoded = [tokenizer(format_chat(p), add_special_tokens=False)["input_ids"]
                   for p in prompts[start:start + batch_size]]
        width = max(map(len, encoded))
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(e)) + e for e in encoded])
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
        done = torch.zeros(len(encoded), dtype=torch.bool)
        new_tokens = []
        for _ in range(max_new_tokens):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
            next_ids = logits.argmax(-1).masked_fill(done, tokenizer.pad_token_id)
            new_tokens.append(next_ids)
            done |= next_ids == tokenizer.eos_token_id
            ids = torch.cat([ids, next_ids[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(next_ids)[:, None]], 1)
            if done.all():
                break
        for row in torch.stack(new_tokens, 1).tolist():
            if tokenizer.eos_token_id in row:
                row = row[:row.index(tokenizer.eos_token_id)]
            outputs.append(tokenizer.decode([t for t in row if t != tokenizer.pad_token_id]).strip())
    return outputs


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
        ours = former_greedy_complete(model, tokenizer, prompts, cfg.max_new_tokens)
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

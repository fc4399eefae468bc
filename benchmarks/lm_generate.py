"""Greedy generation speed on XSTest: ``interp.models.generation.greedy_generate`` against plain
batched ``model.generate``, side by side in one run, on the same prompts and batch size.

- ``plain generate``: what the refusal evaluator did: batches in the prompts' order, left-padded,
  ``model.generate(do_sample=False)``; every row runs until the batch's last row stops;
- ``greedy_generate``: length-sorted batches, finished rows removed from the running batch.

Prompts go through the tokenizer's chat template (raw when it has none). Tokens per second count
the generated tokens of each prompt up to and including its first EOS; the completions of both
sides are compared token by token. ``--full`` also times ``greedy_generate`` over every prompt of
the file (the target for SmolLM2-135M-Instruct on XSTest: at most 15 minutes on the 2-core CPU).

    python -m benchmarks.lm_generate --model /tmp/smollm2-hf --prompts xstest_prompts.csv --n 48 \\
        --batch-size 64 --max-new-tokens 64 [--full] [--threads 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import zoo  # noqa: F401 - registers the embedded models with the core (interp.embedded)
from flowlens.refusals import format_prompt, read_xstest_csv
from interp.models.generation import DEFAULT_BATCH_SIZE, eos_ids, greedy_generate_tokens
from interp.models.lm import load_hf_lm


def until_eos(tokens: list[int], stop_ids: set[int]) -> list[int]:
    for position, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[:position + 1]
    return tokens


def plain_generate(model, tokenizer, texts: list[str], max_new_tokens: int, batch_size: int,
                   add_special_tokens: bool, stop_ids: set[int]) -> list[list[int]]:
    """New tokens of each text by batched, left-padded ``model.generate``, cut after the first EOS."""
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    completions = []
    try:
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(texts[start:start + batch_size], return_tensors="pt", padding=True,
                              add_special_tokens=add_special_tokens)
            with torch.inference_mode():
                output = model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens,
                                        pad_token_id=tokenizer.pad_token_id, eos_token_id=sorted(stop_ids))
            completions.extend(until_eos(row, stop_ids) for row in output[:, batch["input_ids"].shape[1]:].tolist())
    finally:
        tokenizer.padding_side = side
    return completions


def timed(function, *args) -> tuple[float, list[list[int]]]:
    started = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - started, result


def first_difference(a: list[int], b: list[int]) -> int | None:
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face directory or a name load_hf_lm resolves")
    parser.add_argument("--prompts", required=True, help="XSTest CSV (columns prompt, type, label)")
    parser.add_argument("--n", type=int, default=48, help="prompts timed side by side (the file's first n)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="side-by-side rounds (sides alternate; median)")
    parser.add_argument("--full", action="store_true", help="also time greedy_generate over every prompt")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_hf_lm(args.model)
    chat = bool(getattr(tokenizer, "chat_template", None))
    texts = [format_prompt(tokenizer, record.prompt, chat) for record in read_xstest_csv(args.prompts)]
    sample = texts[:args.n]
    stop_ids = eos_ids(model, tokenizer)
    options = dict(batch_size=args.batch_size, add_special_tokens=not chat)

    def ours(prompts: list[str], max_new_tokens: int = args.max_new_tokens) -> list[list[int]]:
        return greedy_generate_tokens(model, tokenizer, prompts, max_new_tokens, **options)

    def plain(prompts: list[str], max_new_tokens: int = args.max_new_tokens) -> list[list[int]]:
        return plain_generate(model, tokenizer, prompts, max_new_tokens, stop_ids=stop_ids, **options)

    # Warm-up at full size: on this project's VMs the first touch of fresh memory is slow.
    ours(sample, 2), plain(sample, 2)
    sides = {"plain generate": plain, "greedy_generate": ours}
    times: dict[str, list[float]] = {name: [] for name in sides}
    tokens: dict[str, list[list[int]]] = {}
    for round_ in range(args.rounds):
        for name in (list(sides) if round_ % 2 == 0 else list(sides)[::-1]):  # alternate who runs first
            seconds, tokens[name] = timed(sides[name], sample)
            times[name].append(seconds)
    plain_tokens, our_tokens = tokens["plain generate"], tokens["greedy_generate"]
    generated = sum(len(t) for t in plain_tokens)
    our_generated = sum(len(t) for t in our_tokens)
    median = {name: statistics.median(values) for name, values in times.items()}
    tokens_per_s = {"plain generate": generated / median["plain generate"],
                    "greedy_generate": our_generated / median["greedy_generate"]}
    differences = {i: first_difference(a, b) for i, (a, b) in enumerate(zip(plain_tokens, our_tokens)) if a != b}
    result = {
        "model": args.model, "threads": torch.get_num_threads(), "chat_template": chat, "n": len(sample),
        "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
        "seconds": median, "seconds_each_round": times,
        "generated_tokens": {"plain generate": generated, "greedy_generate": our_generated},
        "tokens_per_s": tokens_per_s,
        "speedup": tokens_per_s["greedy_generate"] / tokens_per_s["plain generate"],
        "agree": len(sample) - len(differences), "first_difference": differences,
    }
    print(f"{args.model}: {len(sample)} prompts, batch {args.batch_size}, up to {args.max_new_tokens} new tokens, "
          f"{'chat template' if chat else 'raw prompts'}, {torch.get_num_threads()} thread(s), "
          f"median of {args.rounds}")
    for name in times:
        print(f"{name:>16}: {median[name]:8.2f} s  {result['generated_tokens'][name]:6d} tokens  "
              f"{tokens_per_s[name]:7.1f} tokens/s")
    print(f"{'ratio':>16}: {result['speedup']:.2f}x the tokens/s of plain generate")
    print(f"{'agreement':>16}: {result['agree']}/{len(sample)} completions identical"
          + (f"; first differing token (prompt: position) {differences}" if differences else ""))
    if args.full:
        seconds, full_tokens = timed(ours, texts)
        full_generated = sum(len(t) for t in full_tokens)
        stopped = sum(bool(t) and t[-1] in stop_ids for t in full_tokens)
        result["full"] = {"prompts": len(texts), "seconds": seconds, "generated_tokens": full_generated,
                          "tokens_per_s": full_generated / seconds, "stopped_at_eos": stopped}
        print(f"{'full run':>16}: {len(texts)} prompts in {seconds:.1f} s ({seconds / 60:.2f} min; target <= 15 min), "
              f"{full_generated} tokens, {full_generated / seconds:.1f} tokens/s, {stopped} stopped at EOS")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

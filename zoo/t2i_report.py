"""`python -m zoo evaluate`: probe accuracy of generations from held-out captions, at the model's own steps and
guidance unless told."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from interp.atomic import atomic_write_text
from .shapes import ATTRIBUTES

COLUMNS = ("shape", "colour", "background", "position", "size", "texture", "no_extra_objects", "all")


def markdown_table(results: dict) -> str:
    lines = ["| objects | n | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for count, scores in results.items():
        cells = " | ".join(f"{scores[c]:.3f}" for c in COLUMNS)
        lines.append(f"| {count} | {scores['n']} | {cells} |")
    return "\n".join(lines)


def evaluate_command(args) -> int:
    from interp.cli import parse_dtype
    from interp.models import ModelError, load_t2i
    from .t2i_recipe import evaluate, zero_pooled_text

    try:
        model = load_t2i(args.model, device="cpu", dtype=parse_dtype(args.dtype))
    except ModelError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.n < 2:
        print(f"error: --n must be at least 2 (generations per object count), not {args.n}", file=sys.stderr)
        return 2
    steps = model.default_steps if args.steps is None else args.steps
    guidance = model.default_guidance if args.guidance is None else args.guidance
    try:
        model.check_request(steps, guidance=guidance)
    except ModelError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.zero_pooled_text:
        zero_pooled_text(model.pipe)
    results = evaluate(model.pipe, {1: args.n, 2: args.n // 2, 3: args.n // 2}, seed=args.seed, steps=steps,
                       guidance=guidance)
    table = markdown_table(results)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "t2i_eval.json", json.dumps({"model": args.model, "seed": args.seed, "steps": steps,
                                                              "guidance": guidance,
                                                              "zero_pooled_text": args.zero_pooled_text,
                                                              "model_dtype": args.dtype,
                                                              "attributes": list(ATTRIBUTES), "results": results},
                                                             indent=2, allow_nan=False))
        atomic_write_text(out / "t2i_eval.md", table + "\n")
    return 0

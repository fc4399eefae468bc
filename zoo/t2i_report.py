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


def add_evaluate_arguments(parser) -> None:
    """`python -m zoo evaluate`'s options."""
    from interp.cli import add_dtype_argument, add_out_argument

    parser.add_argument("--model", default="toy", help="model name or directory (default: the embedded toy model)")
    parser.add_argument("--n", type=int, default=500, help="generations per object count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None,
                        help="denoising steps (default: the model's own: 1 for the toys, a toy-base's recipe.json)")
    parser.add_argument("--guidance", type=float, default=None,
                        help="classifier-free guidance scale (default: the model's own; 0 = none)")
    add_out_argument(parser, default=None, help="write JSON and a markdown table here")
    add_dtype_argument(parser, what="the pipeline")
    parser.add_argument("--zero-pooled-text", action="store_true",
                        help="set the pooled prompt embedding (the prompt's path into the time embedding) to zero, "
                             "so the prompt reaches the image through the cross-attention blocks alone")


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

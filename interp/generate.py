"""`python -m interp generate`: one image from a prompt with a text-to-image model, saved as PNG."""

from __future__ import annotations

from pathlib import Path

from .cli import add_dtype_argument, add_out_argument, at_least, dtype_name, parse_dtype
from .models.t2i import MAX_SEED


def add_generate_arguments(parser) -> None:
    """The model, the prompt, the generation's settings and the PNG's path."""
    parser.add_argument("--model", default="toy", help="toy (embedded), sdxl-turbo, sdxl-base, hub id or directory")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    parser.add_argument("--seed", type=at_least(0, MAX_SEED), default=0, help="from 0 to 2**64 - 1")
    parser.add_argument("--guidance", type=float, default=None,
                        help="guidance scale, at least 0: above 1 classifier-free guidance, up to 1 none (default: "
                             "the model's)")
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    add_out_argument(parser, default="image.png")
    add_dtype_argument(parser, default=None, what="the pipeline")


def generate_command(args) -> int:
    from .models import load_t2i

    model = load_t2i(args.model, dtype=parse_dtype(args.dtype))
    images = model.generate(args.prompt, steps=args.steps, seed=args.seed, guidance=args.guidance,
                            height=args.height, width=args.width)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # --out runs/images/x.png: the folder is made
    images[0].save(args.out)
    print(f"wrote {args.out} ({images[0].width}x{images[0].height}, {args.model}, "
          f"steps={args.steps or model.default_steps}, seed={args.seed}, {dtype_name(model.denoiser.dtype)})")
    return 0

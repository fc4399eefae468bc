"""`python -m interp blocks` and `python -m interp hooks`: what a model's spec describes (`ModelSpec.describe`),
printed."""

from __future__ import annotations

import json

from ..cli import add_backend_argument
from .spec import model_spec


def add_blocks_arguments(parser) -> None:
    parser.add_argument("--model", default="toy")


def blocks_command(args) -> int:
    """A model's hookable blocks, channels and sizes (and the text streams of joint blocks), as JSON."""
    print(json.dumps(model_spec(args.model).describe(), indent=2))
    return 0


def add_hooks_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="toy-chat, smollm2-135m-instruct, an LM directory, or toy, ...")
    add_backend_argument(parser, "language models: ")


def hooks_command(args) -> int:
    """One valid hook name per line: an LM's residual hooks, or a text-to-image model's blocks and the text streams
    of its joint blocks (`<block>:text`: SD3, FLUX)."""
    print("\n".join(model_spec(args.model).describe(backend=args.backend)["sites"]))
    return 0

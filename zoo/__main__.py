"""python -m zoo train {t2i,chat} ... | evaluate ...  (real models: python -m interp fetch NAME)"""

from __future__ import annotations

import argparse
import sys

from interp.cli import add_dtype_argument
from interp.shipped import add_overwrite_options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo",
                                     description="Train and evaluate the embedded default models.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train an embedded model by its recipe (resumable)")
    models = train.add_subparsers(dest="model", required=True)
    from . import t2i_recipe
    t2i_recipe.add_arguments(models.add_parser("t2i", help="the SDXL-built text-to-image model of the shapes world"))
    from .chat import recipe as chat_recipe
    chat_recipe.add_arguments(models.add_parser("chat", help="the chat language model of the instruction world"))
    evaluate = commands.add_parser("evaluate", help="probe accuracy of the text-to-image model on held-out captions "
                                          "(chat models: python -m zoo.chat evaluate)")
    evaluate.add_argument("--model", default="toy", help="model name or directory (default: the embedded toy model)")
    evaluate.add_argument("--n", type=int, default=500, help="generations per object count")
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.add_argument("--steps", type=int, default=None,
                          help="denoising steps (default: the model's own: 1 for the toys, a toy-base's recipe.json)")
    evaluate.add_argument("--guidance", type=float, default=None,
                          help="classifier-free guidance scale (default: the model's own; 0 = none)")
    evaluate.add_argument("--out", default=None, help="write JSON and a markdown table here")
    add_dtype_argument(evaluate, what="the pipeline")
    evaluate.add_argument("--zero-pooled-text", action="store_true",
                          help="set the pooled prompt embedding (the prompt's path into the time embedding) to zero, "
                               "so the prompt reaches the image through the cross-attention blocks alone")
    args = add_overwrite_options(parser).parse_args(argv)
    if args.command == "train" and args.model == "t2i":
        args.run = lambda a: t2i_recipe.main(a) or 0
    elif args.command == "train" and args.model == "chat":
        args.run = lambda a: chat_recipe.main(a) or 0
    else:
        from .t2i_report import evaluate_command
        args.run = evaluate_command
    from interp.cli import run_command

    # one error map for every command (exit 2 with a message; Ctrl-C 130): each resumes when run again
    return run_command(args, interrupted="interrupted: run the same command again to resume")

if __name__ == "__main__":
    sys.exit(main())

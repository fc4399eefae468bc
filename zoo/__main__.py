"""python -m zoo train {t2i,chat} ... | evaluate ...  (real models: python -m interp fetch NAME)"""

from __future__ import annotations

import argparse
import sys

from interp.shipped import add_overwrite_options


def _train_t2i(args) -> int:
    from . import t2i_recipe

    return t2i_recipe.main(args) or 0


def _train_chat(args) -> int:
    from .chat import recipe as chat_recipe

    return chat_recipe.main(args) or 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo",
                                     description="Train and evaluate the embedded default models.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train an embedded model by its recipe (resumable)")
    models = train.add_subparsers(dest="model", required=True)

    from . import t2i_recipe
    from .chat import recipe as chat_recipe
    from .t2i_report import add_evaluate_arguments, evaluate_command

    # one row per command: (its subparsers, name, help, the owning module's arguments, its body)
    for group, name, help_text, add_arguments, command in (
        (models, "t2i", "the SDXL-built text-to-image model of the shapes world", t2i_recipe.add_arguments,
         _train_t2i),
        (models, "chat", "the chat language model of the instruction world", chat_recipe.add_arguments, _train_chat),
        (commands, "evaluate", "probe accuracy of the text-to-image model on held-out captions (chat models: "
                               "python -m zoo.chat evaluate)", add_evaluate_arguments, evaluate_command),
    ):
        sub = group.add_parser(name, help=help_text)
        add_arguments(sub)
        sub.set_defaults(run=command)
    from interp.cli import run_command  # read when called (tests stand in for it)

    # one error map for every command (exit 2 with a message; Ctrl-C 130): each resumes when run again
    return run_command(add_overwrite_options(parser).parse_args(argv),
                       interrupted="interrupted: run the same command again to resume")


if __name__ == "__main__":
    sys.exit(main())

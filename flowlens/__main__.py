"""python -m flowlens {diversity,vcl,refusals,analyze,steer} ..."""

from __future__ import annotations

import argparse
import sys

import zoo  # noqa: F401 - registers the embedded models and worlds with the core (interp.embedded)

from interp.cli import run_command
from interp.shipped import add_overwrite_options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flowlens",
                                     description="Residual geometry, lexical diversity, refusals and VCL fine-tuning.")
    commands = parser.add_subparsers(dest="command", required=True)

    from .analyze import add_analyze_arguments, analyze_command
    from .diversity import add_diversity_arguments, diversity_command
    from .finetune import add_vcl_arguments, vcl_command
    from .refusals import add_refusals_arguments, refusals_command
    from .steer import add_steer_arguments, steer_command

    for name, help_text, add_arguments, command in (
        ("diversity", "lexical diversity (H1-H3, distinct-n, unique-n, MSTTR) of JSONL data",
         add_diversity_arguments, diversity_command),
        ("vcl", "supervised fine-tuning with the Variance Concentration Loss (resumable)", add_vcl_arguments,
         vcl_command),
        ("refusals", "false-refusal, harmful-refusal and task-accuracy evaluation", add_refusals_arguments,
         refusals_command),
        ("analyze", "PCA geometry of residuals at the last prompt token, layer by layer", add_analyze_arguments,
         analyze_command),
        ("steer", "a greedy completion without and with an SAE feature edit, side by side", add_steer_arguments,
         steer_command),
    ):
        sub = commands.add_parser(name, help=help_text)
        add_arguments(sub)
        sub.set_defaults(run=command)

    # Damaged or unsafe weight files (safetensors, torch pickles) are errors naming the file, as bad input is.
    return run_command(add_overwrite_options(parser).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

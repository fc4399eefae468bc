"""python -m flowlens {diversity,vcl,refusals,analyze} ..."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flowlens",
                                     description="Residual geometry, lexical diversity, refusals and VCL fine-tuning.")
    commands = parser.add_subparsers(dest="command", required=True)

    from .diversity import add_diversity_arguments, diversity_command

    diversity = commands.add_parser("diversity", help="lexical diversity (H1-H3, distinct-n, unique-n, MSTTR) of JSONL data")
    add_diversity_arguments(diversity)
    diversity.set_defaults(run=diversity_command)

    try:
        from .finetune import add_vcl_arguments, vcl_command
    except ImportError:
        pass
    else:
        vcl = commands.add_parser("vcl", help="supervised fine-tuning with the Variance Concentration Loss (resumable)")
        add_vcl_arguments(vcl)
        vcl.set_defaults(run=vcl_command)

    try:
        from .refusals import add_refusals_arguments, refusals_command
    except ImportError:
        pass
    else:
        refusals = commands.add_parser("refusals", help="false-refusal, harmful-refusal and task-accuracy evaluation")
        add_refusals_arguments(refusals)
        refusals.set_defaults(run=refusals_command)

    try:
        from .analyze import add_analyze_arguments, analyze_command
    except ImportError:
        pass
    else:
        analyze = commands.add_parser("analyze", help="PCA geometry of residuals at the last prompt token, layer by layer")
        add_analyze_arguments(analyze)
        analyze.set_defaults(run=analyze_command)

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError, PermissionError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""python -m zoo.chat {world,train,evaluate} ..."""

from __future__ import annotations

import sys

COMMANDS = {"world": "export the instruction world as JSONL files per kind and split",
            "train": "train the base model and its safety-ratio fine-tunes (resumable)",
            "evaluate": "evaluate shipped models again without retraining (--overwrite rewrites evaluation.json)"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m zoo.chat {world,train,evaluate} [options]\n")
        for name, text in COMMANDS.items():
            print(f"  {name:8s} {text}")
        known = not argv or argv[0] in ("-h", "--help")
        if not known:
            print(f"\nerror: unknown command {argv[0]!r}", file=sys.stderr)
        return 0 if known else 2
    if argv[0] == "world":
        from types import SimpleNamespace

        from interp.cli import run_command
        from .world import main as world_main

        # the one error map (an unwritable --out: one line, exit 2; Ctrl-C: 130); world.py checks its own --n.
        # The shipped-files guard reads --out and --overwrite here (world.py, in the SmolLM2 study's fingerprint,
        # knows neither); the rest goes to world.py's own parser.
        import argparse

        guarded = argparse.ArgumentParser(add_help=False)
        guarded.add_argument("--out")
        guarded.add_argument("--overwrite", action="store_true")
        known, _ = guarded.parse_known_args(argv[1:])
        rest = [a for a in argv[1:] if a != "--overwrite"]
        return run_command(SimpleNamespace(run=lambda _: world_main(rest), out=known.out, overwrite=known.overwrite,
                                           writer="zoo.chat world"))
    if argv[0] == "evaluate":
        from .recipe import evaluate_cli
        return evaluate_cli(argv[1:])
    from .recipe import cli
    return cli(argv[1:])


if __name__ == "__main__":
    sys.exit(main())

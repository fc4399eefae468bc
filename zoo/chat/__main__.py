"""python -m zoo.chat {world,train,evaluate} ...

One table of commands, each a function of its own argv whose body lives in the module that owns the work (the
recipe's `cli` and `evaluate_cli` parse their own options; the world's export is `world.main`'s parser)."""

from __future__ import annotations

import sys


def _world(argv: list[str]) -> int:
    """The world's export through the one error map (an unwritable --out: one line, exit 2; Ctrl-C: 130); world.py
    checks its own --n. The shipped-files guard reads --out and --overwrite here (world.py, in the SmolLM2 study's
    fingerprint, knows neither); the rest goes to world.py's own parser."""
    import argparse
    from types import SimpleNamespace

    from interp.cli import run_command

    from .world import main as world_main

    guarded = argparse.ArgumentParser(add_help=False)
    guarded.add_argument("--out")
    guarded.add_argument("--overwrite", action="store_true")
    known, _ = guarded.parse_known_args(argv)
    rest = [a for a in argv if a != "--overwrite"]
    return run_command(SimpleNamespace(run=lambda _: world_main(rest), out=known.out, overwrite=known.overwrite,
                                       writer="zoo.chat world"))


def _train(argv: list[str]) -> int:
    from .recipe import cli

    return cli(argv, prog="python -m zoo.chat train")


def _evaluate(argv: list[str]) -> int:
    from .recipe import evaluate_cli

    return evaluate_cli(argv)


COMMANDS = {"world": ("export the instruction world as JSONL files per kind and split", _world),
            "train": ("train the base model and its safety-ratio fine-tunes (resumable)", _train),
            "evaluate": ("evaluate shipped models again without retraining (--overwrite rewrites evaluation.json)",
                         _evaluate)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m zoo.chat {world,train,evaluate} [options]\n")
        for name, (text, _) in COMMANDS.items():
            print(f"  {name:8s} {text}")
        known = not argv or argv[0] in ("-h", "--help")
        if not known:
            print(f"\nerror: unknown command {argv[0]!r}", file=sys.stderr)
        return 0 if known else 2
    return COMMANDS[argv[0]][1](argv[1:])


if __name__ == "__main__":
    sys.exit(main())

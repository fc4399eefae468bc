"""`python -m experiments.step_transfer`: one subcommand per job (run, report, causal, paint, cost), each given the
study (`Study.of(--model, --out)`: whose SAEs, which run directory) explicitly."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .causal import CAUSAL_LIMIT, PAINT_BLOCKS, PAINT_PER_LABEL, PAINT_SCENES, PAINT_SEED, PAINT_STEPS, \
    PAINT_STRENGTHS, causal, paint
from .cost import cost
from .measure import run as measure
from .report import DOCS_PAGE, report
from .study import DEFAULT_MODEL, RESULTS, RUN_ROOT, RunConfig, Study, _shown, base_sampling

DESCRIPTION = "Do SAEs trained on one-step block updates work at more steps, and on a multi-step base model? (issue 33)"


def run(study: Study, args) -> int:
    """Capture, train the ceilings, measure (resumable), then report (without --docs)."""
    measure(study, args)
    args.docs = False
    return report(study, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.step_transfer", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="capture, train the ceilings, measure (resumable), then report")
    defaults = RunConfig()
    run_parser.add_argument("--threads", type=int, default=defaults.threads)
    run_parser.add_argument("--n-eval", type=int, default=defaults.n_eval, help="held-out captions measured")
    run_parser.add_argument("--n-train", type=int, default=defaults.n_train, help="captions of the ceilings' stores")
    run_parser.add_argument("--ceiling-steps", type=int, default=defaults.ceiling_steps,
                            help="training steps of each ceiling SAE")
    run_parser.set_defaults(run=run)
    report_parser = commands.add_parser("report", help="write experiments/results/step_transfer.{json,md}")
    report_parser.add_argument("--docs", action="store_true", help=f"also refill the tables of {DOCS_PAGE}")
    report_parser.set_defaults(run=report)
    cost_parser = commands.add_parser("cost", help="time one UNet-stage step of the toy-base recipe "
                                                   "(runs/step_transfer/base_step_cost.json, read by report)")
    cost_parser.add_argument("--threads", type=int, default=defaults.threads)
    cost_parser.set_defaults(run=cost)
    causal_parser = commands.add_parser("causal", help="RIEBench edits with the 1-step SAEs at 1, 2 and 4 steps "
                                                       "(resumable; read by report)")
    causal_parser.add_argument("--threads", type=int, default=defaults.threads)
    causal_parser.add_argument("--limit", type=int, default=CAUSAL_LIMIT, help="tasks per category")
    causal_parser.set_defaults(run=causal)
    paint_parser = commands.add_parser("paint", help="painted labels with the 1-step SAEs at 1, 2 and 4 steps "
                                                     "(resumable; read by report)")
    paint_parser.add_argument("--threads", type=int, default=defaults.threads)
    paint_parser.add_argument("--sae", default=None,
                              help="the SAEs and their feature cards (default: the shipped SAEs of --model)")
    paint_parser.add_argument("--block", action="append", default=None,
                              help=f"paint features of this block (repeatable; default: {', '.join(PAINT_BLOCKS)})")
    paint_parser.add_argument("--per-label", type=int, default=PAINT_PER_LABEL, help="features per label")
    paint_parser.add_argument("--scenes", type=int, default=PAINT_SCENES, help="held-out scenes per label")
    paint_parser.add_argument("--seed", type=int, default=PAINT_SEED, help="seed of the scenes (with the label)")
    paint_parser.add_argument("--steps", type=int, nargs="+", default=list(PAINT_STEPS), help="step counts")
    paint_parser.add_argument("--strength", type=float, nargs="+", default=list(PAINT_STRENGTHS),
                              help="strengths, x the feature's mean activation")
    paint_parser.set_defaults(run=paint)
    for sub in (run_parser, report_parser, causal_parser, paint_parser):
        sub.add_argument("--base", default=None, metavar="MODEL",
                         help="also measure this multi-step model of the toy's architecture (`toy-base`, or a "
                              "pipeline saved by `python -m zoo train t2i --objective v_prediction`) at its steps "
                              "and guidance, both CFG halves")
    for sub in (run_parser, report_parser, causal_parser, paint_parser):
        sub.add_argument("--model", default=DEFAULT_MODEL,
                         help="the one-step model whose shipped 1-step SAEs (saes/pretrained/MODEL) are tested: "
                              "toy (default), or toy-turbo, trained from toy-base's weights (the same lineage)")
    for sub in (run_parser, report_parser, cost_parser, causal_parser, paint_parser):
        sub.add_argument("--out", default=_shown(RUN_ROOT), help="the run directory")
        sub.add_argument("--results", default=_shown(RESULTS), help="where the JSON and markdown tables go")
    args = parser.parse_args(argv)
    # --model first: --base is checked against its sizes; a wrong one is one line, before any work
    try:
        study = Study.of(getattr(args, "model", None) or DEFAULT_MODEL, Path(args.out).resolve())
    except (OSError, ValueError) as err:
        print(f"error: --model: {err}", file=sys.stderr)
        return 2
    if getattr(args, "base", None):
        try:
            base_sampling(args.base, study.model)
        except (OSError, ValueError) as err:
            print(f"error: --base: {err}", file=sys.stderr)
            return 2
    if getattr(args, "sae", "") is None:
        args.sae = _shown(study.sae_root)
    if args.run is report:  # what is missing under runs/ is one line that names the command to run
        try:
            return report(study, args)
        except (FileNotFoundError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    return args.run(study, args)




__all__ = ["main", "run"]

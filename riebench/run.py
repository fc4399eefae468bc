"""The `run` and `sweep` commands of `python -m riebench`: the model, the method configurations, a `Runner` over
the suite (resumable: finished tasks are skipped), then the run's tables and plots (`riebench.report`)."""

from __future__ import annotations

import argparse
import sys

import torch

from interp.cli import add_dtype_argument, add_out_argument, at_least, dtype_name, parse_dtype, probability

from .methods import METHODS, VARIANTS, MethodConfig, MethodError, method_names, parse_method_name
from .report import write_report
from .runner import RunConfig, Runner, sweep_configs


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """What `run` and `sweep` share: the model, the suite, the blocks, the seeds, the dtype and the output."""
    p.add_argument("--model", default="toy", help="toy, sdxl-turbo, sdxl-base, a hub id or a local pipeline directory")
    p.add_argument("--suite", default="shapes", help="'shapes' (generated) or a task file (ours or public RIEBench)")
    p.add_argument("--suite-seed", type=int, default=0, help="seed of the generated shapes suite")
    p.add_argument("--masks", default=None, help="directory of PNG masks (<id>_source.png, <id>_target.png) for "
                                                 "the public RIEBench file")
    p.add_argument("--category", action="append", default=None, help="only this category (repeatable)")
    p.add_argument("--limit-per-category", type=at_least(1), default=None, help="first N tasks of each category")
    p.add_argument("--saes", default=None, help="directory with one SAE directory (sae-lens format) per block")
    p.add_argument("--blocks", nargs="+", default=None,
                   help="blocks the methods may edit (default: the model's analysed blocks; the toy's six)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    p.add_argument("--seed", type=int, default=None, help="one seed for every task (default: each task's own)")
    p.add_argument("--save-images", action="store_true", help="also write each edited image as PNG")
    p.add_argument("--min-preservation", type=probability, default=0.9,
                   help="headline table: compare methods at preservation >= this (0 to 1)")
    p.add_argument("--threads", type=at_least(1), default=None, help="torch CPU threads")
    add_dtype_argument(p, default=None, what="the pipeline")
    add_out_argument(p, required=True, help="output directory (results, tables, plots)")


def add_run_method_arguments(parser: argparse.ArgumentParser) -> None:
    """`riebench run`: the method, its variant and grid, then what `run` and `sweep` share."""
    parser.add_argument("--method", default="sae", choices=method_names())
    parser.add_argument("--variant", default=None, choices=VARIANTS,
                        help="the method's variant (sae: static or adaptive; the same as --method sae-adaptive)")
    parser.add_argument("--k-trans", type=int, nargs="+", default=[5], help="features added and subtracted")
    parser.add_argument("--m", type=float, nargs="+", default=[1.0], help="multiplier")
    parser.add_argument("--per-block", action="store_true", help="also run the method restricted to each block")
    add_run_arguments(parser)


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """`riebench sweep`: the methods and the grid, then what `run` and `sweep` share."""
    parser.add_argument("--methods", nargs="+", default=method_names(edits_blocks=True),
                        choices=method_names(edits_blocks=True), help="the prompt swap is always run")
    parser.add_argument("--k-trans", type=int, nargs="+", default=[1, 5, 20])
    parser.add_argument("--m", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    parser.add_argument("--per-block", action="store_true", help="also run each method restricted to each block")
    add_run_arguments(parser)


def run_config(args, configs):
    return RunConfig(model=args.model, suite=args.suite, suite_seed=args.suite_seed, categories=args.category,
                     limit_per_category=args.limit_per_category, mask_dir=args.masks, saes=args.saes,
                     steps=args.steps, seed=args.seed, configs=configs, save_images=args.save_images,
                     dtype=args.dtype)


def load_model(args):
    """The run's model, loaded before its configurations are made: the blocks they edit by default are the
    model's own (`T2IModel.default_blocks`: SDXL's four, or those of them that a smaller U-Net has)."""
    from interp.models import load_t2i

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_t2i(args.model, dtype=parse_dtype(args.dtype))
    args.dtype = dtype_name(model.denoiser.dtype)  # recorded in run.json
    if args.blocks is None:
        args.blocks = list(model.default_blocks)
    return model


def execute(args, configs, model) -> int:
    """Run the configurations over the suite (resumable), then write the tables and plots."""
    runner = Runner(run_config(args, configs), args.out, model=model)
    counts = runner.run()
    report = write_report(args.out, min_preservation=args.min_preservation)
    print(f"{counts['done']} edits done, {counts['already_done']} already done, {counts['failed']} failed; "
          f"tables and plots in {args.out}")
    for line in report["skipped_metrics"]:
        print(f"skipped metric {line}")
    for failure in report["failed"][:5]:
        print(f"failed: {failure['label']} on {failure['task']}: {failure['error']}", file=sys.stderr)
    return 1 if counts["failed"] else 0


def run_method_command(args) -> int:
    """`python -m riebench run`: one method, a grid of k_trans x m (and with --per-block each block alone)."""
    model = load_model(args)
    method, variant = parse_method_name(args.method)
    if args.variant is not None and args.variant != variant:
        if variant != METHODS[method].variants[0]:
            raise MethodError(f"--method {args.method} names the variant {variant}; --variant {args.variant} "
                              f"contradicts it")
        variant = args.variant
    configs = [MethodConfig(method, k, m, list(args.blocks), variant) for k in args.k_trans for m in args.m]
    if not configs[0].edits_blocks:
        configs = configs[:1]
    if args.per_block and len(args.blocks) > 1 and configs[0].edits_blocks:
        configs += [MethodConfig(method, k, m, [b], variant) for k in args.k_trans for m in args.m
                    for b in args.blocks]
    return execute(args, configs, model)


def sweep_command(args) -> int:
    """`python -m riebench sweep`: every method's grid, the baselines and the prompt swap."""
    model = load_model(args)
    return execute(args, sweep_configs(args.k_trans, args.m, args.blocks, tuple(args.methods), args.per_block),
                   model)

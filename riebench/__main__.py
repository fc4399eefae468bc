"""python -m riebench {tasks,run,sweep,report} ...

    python -m riebench tasks --suite shapes --seed 0 --out runs/riebench/shapes-suite.json
    python -m riebench tasks --suite ../shared/data/riebench.json --masks MASK_DIR --out tasks.json
    python -m riebench run --model toy --method sae --saes runs/saes --k-trans 5 --m 1 --out runs/riebench/sae
    python -m riebench run --model toy --method prompt-swap --limit-per-category 5 --out runs/riebench/swap
    python -m riebench sweep --model toy --saes runs/saes --k-trans 1 5 20 --m 0.5 1 2 --out runs/riebench/sweep
    python -m riebench report runs/riebench/sweep

A run is resumable: rerun the same command and finished tasks are skipped.
"""

from __future__ import annotations

import argparse
import sys

import zoo  # noqa: F401 - registers the embedded models and worlds with the core (interp.embedded)

from interp.cli import add_dtype_argument, add_out_argument, at_least, dtype_name, parse_dtype, probability, run_command
from interp.shipped import add_overwrite_options


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
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


def _tasks(args) -> int:
    from .tasks import ShapesSuiteConfig, Suite, read_riebench_json, shapes_suite

    if args.suite == "shapes":
        suite = shapes_suite(ShapesSuiteConfig(seed=args.seed, per_category=args.per_category, split=args.split,
                                               max_objects=args.max_objects), args.category, progress=True)
    elif args.masks is not None:
        suite = read_riebench_json(args.suite, args.masks)
    else:
        suite = Suite.load(args.suite)
    path = suite.save(args.out)
    counts = {c: sum(t.category == c for t in suite.tasks) for c in suite.categories()}
    print(f"{len(suite.tasks)} tasks ({suite.name} {suite.version}, seed {suite.seed}) -> {path}")
    for category, n in counts.items():
        print(f"  {category}: {n}")
    return 0


def _run_config(args, configs):
    from .runner import RunConfig

    return RunConfig(model=args.model, suite=args.suite, suite_seed=args.suite_seed, categories=args.category,
                     limit_per_category=args.limit_per_category, mask_dir=args.masks, saes=args.saes,
                     steps=args.steps, seed=args.seed, configs=configs, save_images=args.save_images,
                     dtype=args.dtype)


def _load_model(args):
    """The run's model, loaded before its configurations are made: the blocks they edit by default are the
    model's own (`T2IModel.default_blocks`: SDXL's four, or those of them that a smaller U-Net has)."""
    import torch

    from interp.models import load_t2i

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_t2i(args.model, dtype=parse_dtype(args.dtype))
    args.dtype = dtype_name(model.denoiser.dtype)  # recorded in run.json
    if args.blocks is None:
        args.blocks = list(model.default_blocks)
    return model


def _execute(args, configs, model) -> int:
    from .report import write_report
    from .runner import Runner

    runner = Runner(_run_config(args, configs), args.out, model=model)
    counts = runner.run()
    report = write_report(args.out, min_preservation=args.min_preservation)
    print(f"{counts['done']} edits done, {counts['already_done']} already done, {counts['failed']} failed; "
          f"tables and plots in {args.out}")
    for line in report["skipped_metrics"]:
        print(f"skipped metric {line}")
    for failure in report["failed"][:5]:
        print(f"failed: {failure['label']} on {failure['task']}: {failure['error']}", file=sys.stderr)
    return 1 if counts["failed"] else 0


def _run(args) -> int:
    from .methods import METHODS, MethodConfig, MethodError, parse_method_name

    model = _load_model(args)
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
    return _execute(args, configs, model)


def _sweep(args) -> int:
    from .runner import sweep_configs

    model = _load_model(args)
    return _execute(args, sweep_configs(args.k_trans, args.m, args.blocks, tuple(args.methods), args.per_block),
                    model)


def _report(args) -> int:
    from .report import write_report
    from .runner import check_run_dir

    check_run_dir(args.out)
    report = write_report(args.out, min_preservation=args.min_preservation)
    print(f"{report['results']} results, {len(report['failed'])} failed; tables and plots in {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from .methods import VARIANTS, method_names
    from .tasks import MAX_PER_CATEGORY, SHAPES_CATEGORIES

    parser = argparse.ArgumentParser(prog="python -m riebench",
                                     description="Representation-based image editing benchmark.")
    commands = parser.add_subparsers(dest="command", required=True)

    t = commands.add_parser("tasks", help="write a task suite (the shapes world's, or a converted RIEBench file)")
    t.add_argument("--suite", default="shapes", help="'shapes' or a task file to convert")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--per-category", type=at_least(1, MAX_PER_CATEGORY), default=30,
                   help=f"tasks per category of the shapes suite (at most {MAX_PER_CATEGORY})")
    t.add_argument("--split", default="train", choices=("train", "held_out"),
                   help="world split both scenes of every task come from")
    t.add_argument("--max-objects", type=int, default=2)
    t.add_argument("--category", action="append", default=None, choices=list(SHAPES_CATEGORIES))
    t.add_argument("--masks", default=None, help="PNG mask directory (public RIEBench file)")
    add_out_argument(t, required=True)
    t.set_defaults(run=_tasks)

    r = commands.add_parser("run", help="run one method (a grid of k_trans x m) over a suite (resumable)")
    r.add_argument("--method", default="sae", choices=method_names())
    r.add_argument("--variant", default=None, choices=VARIANTS,
                   help="the method's variant (sae: static or adaptive; the same as --method sae-adaptive)")
    r.add_argument("--k-trans", type=int, nargs="+", default=[5], help="features added and subtracted")
    r.add_argument("--m", type=float, nargs="+", default=[1.0], help="multiplier")
    r.add_argument("--per-block", action="store_true", help="also run the method restricted to each block")
    _add_run_arguments(r)
    r.set_defaults(run=_run)

    s = commands.add_parser("sweep", help="the k_trans x m grid of every method, the baselines and the prompt swap")
    s.add_argument("--methods", nargs="+", default=method_names(edits_blocks=True),
                   choices=method_names(edits_blocks=True), help="the prompt swap is always run")
    s.add_argument("--k-trans", type=int, nargs="+", default=[1, 5, 20])
    s.add_argument("--m", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    s.add_argument("--per-block", action="store_true", help="also run each method restricted to each block")
    _add_run_arguments(s)
    s.set_defaults(run=_sweep)

    rep = commands.add_parser("report", help="(re)write the tables and plots of a run directory")
    rep.add_argument("out")
    rep.add_argument("--min-preservation", type=probability, default=0.9, help="0 to 1")
    rep.set_defaults(run=_report)

    return run_command(add_overwrite_options(parser).parse_args(argv),
                       interrupted="interrupted: rerun the same command to resume")


if __name__ == "__main__":
    sys.exit(main())

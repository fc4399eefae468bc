"""Image SAEBench on the toy's blocks across trainers (issue 44): every image eval (`saes.bench.image`) on each SAE,
timed, into one JSON and a markdown table (with, for several trainers, which wins each metric).

    # the six shipped SAEs (TopK, one per block): the timed run of the issue's speed goal
    python -m experiments.image_saebench run --out experiments/results/image_saebench_shipped.json
    # every trainer on the toy's 16 x 16 blocks: the like-for-like set of saes/pretrained/toy-trainers (its train.sh)
    # and the shipped TopK (topk-shipped) as an unranked reference
    python -m experiments.image_saebench run \
        --trainers topk-shipped topk batchtopk matryoshka jumprelu standard gated p-anneal \
        --blocks up_blocks.1.attentions.2 up_blocks.1.attentions.1 --trained saes/pretrained/toy-trainers \
        --out experiments/results/image_saebench_trainers_16x16.json
    python -m experiments.image_saebench report experiments/results/image_saebench_trainers_16x16.json
    python -m experiments.image_saebench training saes/pretrained/toy-trainers   # the set's training numbers

The trained set: 2M vectors each on the toy's store of 1500 world images, d_sae 256 (the shipped TopK SAEs had 10M
on 3000); docs/image-saebench.md reads the results.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from saes.bench.results import IMAGE_HEADLINE as HEADLINE  # (eval, metric, column title), shared with the UI
from saes.bench.results import SHIPPED_TRAINER, markdown_table, trainer_summary  # topk-shipped: the shipped TopK


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown"




def sae_directory(trainer: str, block: str, shipped: Path, trained: Path | None) -> Path | None:
    """Where `trainer`'s SAE of `block` is: `topk-shipped` is the shipped TopK; any other trainer is
    `<trained>/<trainer>/<block>`, but for `topk` without --trained (the shipped set, as before)."""
    if trainer == SHIPPED_TRAINER or (trainer == "topk" and trained is None):
        return shipped / block
    return trained / trainer / block if trained else None


def load_saes(trainers: list[str], blocks: list[str], shipped: Path, trained: Path | None) -> dict:
    """Every trainer's SAE of every block, checked to exist before any is loaded (a missing one: one line)."""
    from saes.sae import SAE

    directories = {}
    for trainer in trainers:
        for block in blocks:
            directory = sae_directory(trainer, block, shipped, trained)
            if directory is None or not (directory / "cfg.json").is_file():
                raise ValueError(f"no {trainer} SAE for {block} (looked in {directory}); train it or drop the trainer")
            directories[f"{trainer}/{block}"] = (block, directory)
    return {name: (block, SAE.load(directory)) for name, (block, directory) in directories.items()}


def run(args) -> None:
    import torch

    from interp.models.t2i import load_t2i
    from saes.bench.image import EVAL_TYPES, ImageBenchConfig, run_image_evals
    from saes.strict_json import write_json

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model = load_t2i(args.model)
    blocks = args.blocks or list(model.default_blocks)
    saes = load_saes(args.trainers, blocks, Path(args.shipped or f"saes/pretrained/{args.model}"),
                     Path(args.trained) if args.trained else None)
    config = ImageBenchConfig(n_images=args.n_images, probe_images=args.probe_images,
                              unlearn_images=args.unlearn_images, riebench_per_category=args.riebench_per_category)
    with tempfile.TemporaryDirectory() as work:
        results = run_image_evals(model, saes, args.evals or EVAL_TYPES, config, work_dir=work,
                                  progress=lambda line: print(line, flush=True))
    wall = time.perf_counter() - start
    data = {"command": "python -m experiments.image_saebench " + " ".join(sys.argv[2:]), "model": args.model,
            "config": config.to_dict(), "cpu": cpu_model(), "threads": args.threads, "wall_seconds": wall,
            "note": "the machine was shared with other jobs while this ran: wall times are upper bounds",
            "saes": {name: {"block": block, "trainer": name.split("/")[0], "architecture": sae.cfg.architecture,
                            "d_sae": sae.cfg.d_sae, "evals": results[name]} for name, (block, sae) in saes.items()}}
    out = Path(args.out)
    write_json(out, data)
    out.with_suffix(".md").write_text(report_markdown(data))
    write_plot(data, out.with_suffix(".png"))
    print(f"wrote {out} ({wall / 60:.1f} min)")


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"


def report_markdown(data: dict) -> str:
    saes = data["saes"]
    present = [(e, m, t) for e, m, t in HEADLINE if any(e in s["evals"] for s in saes.values())]
    lines = ["| SAE | block | " + " | ".join(t for _, _, t in present) + " |",
             "|---|---|" + "---:|" * len(present)]
    for name, entry in saes.items():
        cells = [_fmt(entry["evals"].get(e, {}).get("metrics", {}).get(m)) for e, m, _ in present]
        lines.append(f"| {entry['trainer']} | {entry['block']} | " + " | ".join(cells) + " |")
    trainers = list(dict.fromkeys(s["trainer"] for s in saes.values()))
    if len(trainers) > 1:  # the mean over blocks per trainer
        lines += ["", "Mean over blocks per trainer:", "",
                  "| trainer | " + " | ".join(t for _, _, t in present) + " |", "|---|" + "---:|" * len(present)]
        for trainer in trainers:
            cells = []
            for e, m, _ in present:
                values = [s["evals"][e]["metrics"].get(m) for s in saes.values()
                          if s["trainer"] == trainer and e in s["evals"]]
                values = [v for v in values if v is not None]
                cells.append(_fmt(sum(values) / len(values)) if values else "-")
            lines.append(f"| {trainer} | " + " | ".join(cells) + " |")
        headers, rows = trainer_summary(data)
        lines += ["", f"Which trainer wins each metric (mean over blocks; noise: twice the margin's standard error "
                  f"over the metric's items, paired where they are the same tasks; {SHIPPED_TRAINER}, trained on "
                  f"another budget, is not ranked):", "", markdown_table(headers, rows)]
    seconds, cpu = {}, {}
    for s in saes.values():
        for e, r in s["evals"].items():
            seconds[e] = seconds.get(e, 0.0) + r["seconds"]
            cpu[e] = cpu.get(e, 0.0) + r.get("cpu_seconds", float("nan"))
    lines += ["", f"Wall time {data['wall_seconds'] / 60:.1f} min on {data['cpu']} ({data['threads']} thread(s); "
              f"{data['note']}); per eval, summed over SAEs, wall"
              + (" (CPU) seconds: " + ", ".join(f"{e} {v:.0f} ({cpu[e]:.0f})" for e, v in seconds.items())
                 if all(c == c for c in cpu.values()) else  # NaN: a run from before CPU seconds were recorded
                 " seconds: " + ", ".join(f"{e} {v:.0f}" for e, v in seconds.items())) + ".", ""]
    return "\n".join(lines)


PLOTTED = [h for h in HEADLINE if h[1] not in ("l0", "n_labelled")]


def write_plot(data: dict, path: Path) -> None:
    """One panel per headline metric (but L0 and the count of labels): a bar per SAE, coloured by trainer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    saes = data["saes"]
    names = list(saes)
    trainers = list(dict.fromkeys(s["trainer"] for s in saes.values()))
    colours = {t: plt.get_cmap("tab10")(i) for i, t in enumerate(trainers)}
    panels = [(e, m, t) for e, m, t in PLOTTED if any(e in s["evals"] for s in saes.values())]
    cols = 4
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), squeeze=False)
    short = [n.split("/")[0] if len(trainers) > 1 and len({s["block"] for s in saes.values()}) == 1
             else n.replace("attentions.", "a").replace("_blocks", "") for n in names]
    for ax, (e, m, title) in zip(axes.flat, panels):
        values = [saes[n]["evals"].get(e, {}).get("metrics", {}).get(m) for n in names]
        ax.bar(range(len(names)), [v if v is not None else 0 for v in values],
               color=[colours[saes[n]["trainer"]] for n in names])
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(names)), short, rotation=60, fontsize=6, ha="right")
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"image SAEBench on {data['model']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def training_table(trained: Path) -> str:
    """The markdown table of a trained set's `train_summary.json` files (<trained>/<trainer>/<block>/): the training
    vectors, the options, and the last logged step's EV, L0 and dead latents on its training batch."""
    lines = ["| trainer | block | vectors | options | EV (train) | L0 (train) | dead |",
             "|---|---|---:|---|---:|---:|---:|"]
    for path in sorted(trained.glob("*/*/train_summary.json")):
        summary = json.loads(path.read_text())
        final, config = summary["final_metrics"], summary["config"]
        options = ", ".join(f"{k}={v}" for k, v in config["options"].items())
        if config["architecture"] in ("topk", "batchtopk", "matryoshka"):
            options = ", ".join(filter(None, [f"k={config['k']}", options]))
        lines.append(f"| {path.parent.parent.name} | {path.parent.name} | {summary['tokens']:,} | {options or '-'} | "
                     f"{final['explained_variance']:.3f} | {final['l0']:.1f} | {final.get('dead_features', '-')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.image_saebench")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", default="toy")
    r.add_argument("--trainers", nargs="+", default=["topk"])
    r.add_argument("--blocks", nargs="+")
    r.add_argument("--shipped", help="the TopK SAEs (default saes/pretrained/<model>)")
    r.add_argument("--trained", help="root of <trainer>/<block> SAE directories")
    r.add_argument("--evals", nargs="+")
    r.add_argument("--n-images", type=int, default=48)
    r.add_argument("--probe-images", type=int, default=400)
    r.add_argument("--unlearn-images", type=int, default=8)
    r.add_argument("--riebench-per-category", type=int, default=2)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--out", required=True)
    p = sub.add_parser("report")
    p.add_argument("results")
    t = sub.add_parser("training", help="print the markdown table of a trained set's final training metrics")
    t.add_argument("trained", help="root of <trainer>/<block> SAE directories with train_summary.json")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    elif args.command == "training":
        print(training_table(Path(args.trained)), end="")
    else:
        path = Path(args.results)
        data = json.loads(path.read_text())
        path.with_suffix(".md").write_text(report_markdown(data))
        write_plot(data, path.with_suffix(".png"))


if __name__ == "__main__":
    main()

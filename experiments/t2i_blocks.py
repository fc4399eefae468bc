"""Which block of the embedded text-to-image model does what: v1 (the shipped `toy`) beside v2 (`toy-v2`, built
in SDXL's proportions, issue 22), v3 (`toy-v3`, the same with attention only at 8 x 8) and v4 (`toy-v4`, v3 trained
without the pooled prompt embedding) beside SDXL Turbo's block roles from the seed study.

    python -m experiments.t2i_blocks run       # each step skipped when its output exists (about 1.5 h per
                                               # model's training, then 7-40 min per model on two CPU cores)
    python -m experiments.t2i_blocks run --models v3   # only some models
    python -m experiments.t2i_blocks report    # experiments/results/t2i_blocks.{json,md}; --docs: the docs page's block

Steps (`run`): train v2-v4 by their recipes and install them (zoo/weights/t2i-v2 ... t2i-v4); the quality
table of each model (`python -m zoo evaluate`, held-out captions; again with `--zero-pooled-text`, to see
which path carries the prompt); linear probes and ablations of every hookable block (`python -m saes probe
--ablate-images 200`); RIEBench's shapes suite with activation-difference steering on each hookable block alone
(`python -m riebench sweep --per-block`, no SAE needed, so the models are compared by the same method). The report
reads those outputs under `runs/`; the JSON it commits holds every figure the tables show, and a group of figures
whose output is not under `runs/` (a fresh clone) keeps its committed figures, its `sources` saying so.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results"
RUNS = REPO / "runs"
WEIGHTS = REPO / "zoo" / "weights"
MODELS = {"v1": "toy", "v2": "toy-v2", "v3": "toy-v3", "v4": "toy-v4"}
HOOKABLE = ("down_blocks.1.attentions.0", "down_blocks.1.attentions.1", "down_blocks.2.attentions.0",
            "down_blocks.2.attentions.1", "mid_block.attentions.0", "up_blocks.0.attentions.0",
            "up_blocks.0.attentions.1", "up_blocks.0.attentions.2", "up_blocks.1.attentions.0",
            "up_blocks.1.attentions.1", "up_blocks.1.attentions.2")
# v3 and v4 have transformer blocks only at 8 x 8 (`--config sdxl-blocks-only`)
EIGHT_BY_EIGHT = tuple(b for b in HOOKABLE if b.startswith(("down_blocks.2.", "mid_block.", "up_blocks.0.")))
BLOCKS = {"v1": HOOKABLE, "v2": HOOKABLE, "v3": EIGHT_BY_EIGHT, "v4": EIGHT_BY_EIGHT}
# SDXL Turbo's block roles as the seed study found them (edits through each block), and the shapes world's
# attributes and RIEBench categories that each role stands for here.
SDXL_ROLES = {
    "down_blocks.2.attentions.1": ("composition", ("position", "size"), ("add", "delete", "move")),
    "mid_block.attentions.0": ("abstract (edits do little)", (), ()),
    "up_blocks.0.attentions.0": ("local detail", ("texture", "shape"), ("texture", "shape")),
    "up_blocks.0.attentions.1": ("colour and style", ("colour", "texture"), ("colour", "texture", "background")),
}
CARRIED_DROP = 0.2  # an ablation that makes the probe misread an attribute on this share of objects carries it
# the trained models' recipes (v1's is the embedded `toy`'s own, docs/embedded-models.md)
# (v4: v3 with the pooled prompt embedding zero, so the prompt reaches the UNet only through the 8 x 8 blocks)
RECIPES = {version: ["-m", "zoo", "train", "t2i", *options, "--vae-from", "zoo/weights/t2i",
                     "--unet-steps", "4000", "--out", f"runs/t2i-{version}", "--threads", "2"]
           for version, options in (("v2", ["--config", "sdxl-proportions"]), ("v3", ["--config", "sdxl-blocks-only"]),
                                    ("v4", ["--config", "sdxl-blocks-only", "--zero-pooled-text"]))}


def _steps(versions) -> list[tuple[Path, list[str]]]:
    steps = []
    for version in versions:
        model = MODELS[version]
        if version in RECIPES:  # done once its weights are installed (committed), wherever they were trained
            steps.append((WEIGHTS / f"t2i-{version}" / "model_index.json", RECIPES[version]))
        steps += [
            (RUNS / f"t2i-{version}-eval" / "t2i_eval.json",
             ["-m", "zoo", "evaluate", "--model", model, "--n", "500", "--out", f"runs/t2i-{version}-eval"]),
            # which path carries the prompt: the same without the pooled text (the time-embedding path)
            (RUNS / f"t2i-{version}-eval-pooled-off" / "t2i_eval.json",
             ["-m", "zoo", "evaluate", "--model", model, "--n", "200", "--zero-pooled-text",
              "--out", f"runs/t2i-{version}-eval-pooled-off"]),
            (RUNS / "t2i-blocks" / version / "probes.json",
             ["-m", "saes", "probe", "--model", model, "--threads", "2", "--out", f"runs/t2i-blocks/{version}"]),
            # the sweep resumes its finished tasks and writes its report (report.json) when done
            (RUNS / "riebench" / f"blocks-{version}" / "report.json",
             ["-m", "riebench", "sweep", "--model", model, "--methods", "activation-diff", "--k-trans", "2", "8",
              "--m", "1", "2", "--per-block", "--blocks", *BLOCKS[version], "--limit-per-category", "8", "--threads", "2",
              "--out", f"runs/riebench/blocks-{version}"]),
        ]
    return steps


def run(args) -> int:
    for output, argv in _steps(args.models):
        if output.exists():
            print(f"have {output.relative_to(REPO)}: skipping python {' '.join(argv[:3])}")
        else:
            print("running: python " + " ".join(argv), flush=True)
            subprocess.run([sys.executable, *argv], cwd=REPO, check=True)
            if output.parent.parent == WEIGHTS:  # a recipe: install the pipeline it trained as the weights loaded by name
                shutil.copytree(RUNS / output.parent.name / "pipeline", output.parent)
    return 0


def _read(path: Path) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{path.relative_to(REPO)} is missing: run `python -m experiments.t2i_blocks run`")
    return json.loads(path.read_text())


def _outputs(version: str) -> dict[str, Path]:
    """Each group of a model's figures and the run output it is read from."""
    return {"quality": RUNS / f"t2i-{version}-eval" / "t2i_eval.json",
            "pooled_text_off": RUNS / f"t2i-{version}-eval-pooled-off" / "t2i_eval.json",
            "probes": RUNS / "t2i-blocks" / version / "probes.json",
            "riebench": RUNS / "riebench" / f"blocks-{version}" / "report.json"}


FIGURES = {"quality": ("quality",), "pooled_text_off": ("pooled_text_off",),
           "probes": ("probe_images", "block_probes", "probe_chance", "ablation"),
           "riebench": ("riebench_by_block", "riebench_all_blocks")}


def _figures(group: str, output: dict) -> dict:
    """The figures of one group, read from its run output (keys: FIGURES[group])."""
    if group in ("quality", "pooled_text_off"):
        return {group: output["results"]}
    if group == "probes":
        return {"probe_images": output["n_images"],
                "block_probes": {b: {a: e["accuracy"] for a, e in entry.items()}
                                 for b, entry in output["block_probes"].items()},
                "probe_chance": {a: e["chance"] for entry in output["block_probes"].values() for a, e in entry.items()},
                "ablation": output["ablation"]}
    return {"riebench_by_block": {row["block"]: {k: v for k, v in row.items() if k not in ("method", "block")}
                                  for row in output["best_by_block"]},
            "riebench_all_blocks": next((row for row in output["best_by_method"] if row["method"] != "prompt-swap"),
                                        None)}


def collect() -> dict:
    """Every figure the tables show, from the run outputs; a group of a model's figures whose output is not under
    runs/ keeps the figures committed in experiments/results/t2i_blocks.json (its `sources` say which)."""
    data = {"models": MODELS, "sdxl_turbo_roles": {b: {"role": r, "attributes": list(a), "categories": list(c)}
                                                  for b, (r, a, c) in SDXL_ROLES.items()},
            "carried_drop": CARRIED_DROP, "recipes": {v: "python " + " ".join(r) for v, r in RECIPES.items()}}
    committed_path = RESULTS / "t2i_blocks.json"
    committed = json.loads(committed_path.read_text()) if committed_path.exists() else {}
    for version in MODELS:
        kept = committed.get(version, {})
        data[version] = {"sources": {}}
        for group, path in _outputs(version).items():
            if path.exists():
                data[version] |= _figures(group, _read(path))
                data[version]["sources"][group] = "runs/"
            elif group in kept.get("sources", {}):
                data[version] |= {name: kept[name] for name in FIGURES[group]}
                data[version]["sources"][group] = "committed"
            else:
                _read(path)  # says which run output is missing
    return data


def _sources(data: dict) -> str:
    """Where each model's figures come from: runs/ outputs of `run`, or the committed JSON."""
    origins = {"runs/": "runs/ outputs of `python -m experiments.t2i_blocks run`",
               "committed": "committed experiments/results/t2i_blocks.json"}
    parts = []
    for version in MODELS:
        by_origin = {}
        for group, origin in data[version]["sources"].items():
            by_origin.setdefault(origin, []).append(group.replace("_", " "))
        parts.append(f"{version}: " + ", ".join(
            (", ".join(groups[:-1]) + " and " if len(groups) > 1 else "") + f"{groups[-1]} from {origins[origin]}"
            for origin, groups in by_origin.items()))
    return "; ".join(parts)


def _carried(ablation: dict, block: str) -> list[str]:
    drop = ablation["blocks"][block]["drop"]
    return [a for a in ("background", "shape", "colour", "size", "texture", "position") if drop[a] >= CARRIED_DROP]


def _edited(by_block: dict, block: str) -> list[str]:
    """Categories activation steering on this block alone edits at preservation >= 0.9 (success >= 0.5)."""
    row = by_block.get(block, {})
    return [c for c, text in row.items() if c != "all" and text not in ("0", "–") and float(text.split()[0]) >= 0.5]


def quality_table(data: dict, key: str = "quality") -> str:
    columns = ("shape", "colour", "background", "position", "size", "texture", "all")
    lines = ["| model | objects | n | " + " | ".join(columns) + " |", "|---|---|---|" + "---:|" * len(columns)]
    for version in MODELS:
        for count, scores in data[version][key].items():
            lines.append(f"| {version} | {count} | {scores['n']} | " + " | ".join(f"{scores[c]:.3f}" for c in columns) + " |")
    return "\n".join(lines) + "\n"


def _name(block: str) -> str:
    return f"**{block}**" if block in SDXL_ROLES else block


def role_table(data: dict) -> str:
    header = "| block | SDXL Turbo (seed study) | " + " | ".join(
        f"{v}: ablating it breaks | {v}: steering it edits" for v in MODELS) + " |"
    lines = [header, "|---|---|" + "---|---|" * len(MODELS)]
    for block in HOOKABLE:
        role = SDXL_ROLES.get(block, ("-",))[0]
        cells = []
        for version in MODELS:
            d = data[version]
            if block not in d["ablation"]["blocks"]:
                cells += ["(no such block)"] * 2
                continue
            cells += [", ".join(_carried(d["ablation"], block)) or "nothing",
                      ", ".join(_edited(d["riebench_by_block"], block)) or "nothing"]
        lines.append(f"| {_name(block)} | {role} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def probe_table(data: dict) -> str:
    """The attributes a linear probe of each block's update reads at >= 0.9 accuracy, per model."""
    lines = ["| block | " + " | ".join(MODELS) + " |", "|---|" + "---|" * len(MODELS)]
    for block in HOOKABLE:
        cells = []
        for version in MODELS:
            probes = data[version]["block_probes"].get(block)
            cells.append("(no such block)" if probes is None else
                         ", ".join(f"{a} {v:.2f}" for a, v in probes.items() if v >= 0.9) or "-")
        lines.append(f"| {_name(block)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def riebench_table(data: dict, version: str) -> str:
    by_block = data[version]["riebench_by_block"]
    categories = sorted({c for row in by_block.values() for c in row}, key=lambda c: (c == "all", c))
    lines = ["| block | " + " | ".join(categories) + " |", "|---|" + "---|" * len(categories)]
    for block in HOOKABLE:
        if block in by_block:
            lines.append(f"| {_name(block)} | " + " | ".join(by_block[block].get(c, "–") for c in categories) + " |")
    return "\n".join(lines) + "\n"


def ablation_tables(data: dict) -> str:
    from saes.fidelity import ablation_table

    return "".join(f"\n{version} ({MODELS[version]}), {data[version]['ablation']['n_images']} generations:\n\n"
                   + ablation_table(data[version]["ablation"], CARRIED_DROP) for version in MODELS)


def markdown(data: dict) -> str:
    riebench = "".join(f"\nRIEBench per block, {version} (best success at preservation >= 0.9, k_trans and m in "
                       f"brackets):\n\n" + riebench_table(data, version) for version in reversed(MODELS))
    return ("## Block roles: " + ", ".join(MODELS) + " and SDXL Turbo\n\n"
            "Quality on held-out captions (`python -m zoo evaluate --n 500`):\n\n" + quality_table(data)
            + "\nThe same with the pooled text embedding set to zero, so the prompt reaches the image only through "
            "the cross-attention blocks, not the time embedding (`--zero-pooled-text --n 200`):\n\n"
            + quality_table(data, "pooled_text_off")
            + f"\nWhat each block does (ablation: the probe misreads an attribute on >= {CARRIED_DROP:g} of objects; "
            "steering: activation-difference edits through that block alone succeed on >= 0.5 of a category's tasks "
            "at preservation >= 0.9; bold: SDXL's four analysed blocks):\n\n" + role_table(data)
            + "\nWhat a linear probe of each block's update reads (accuracy >= 0.9):\n\n" + probe_table(data)
            + riebench + "\nAblations:\n" + ablation_tables(data)
            + "\nSources: " + _sources(data) + ".\n")


# The docs page whose tables `report --docs` refills, between these markers (the prose around them is written by hand).
DOCS_PAGE = Path("docs") / "experiments" / "t2i-blocks.md"
DOCS_MARKERS = ("<!-- t2i-v2-blocks -->", "<!-- /t2i-v2-blocks -->")


def report(args) -> int:
    from interp.atomic import atomic_write_text

    data = collect()
    md = markdown(data)
    atomic_write_text(RESULTS / "t2i_blocks.json", json.dumps(data, indent=2, allow_nan=False) + "\n")
    atomic_write_text(RESULTS / "t2i_blocks.md", md)
    print(md, end="")
    if args.docs:
        from experiments.docs_page import refill

        refill(REPO / DOCS_PAGE, DOCS_MARKERS, md)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.t2i_blocks", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="train, evaluate, probe and sweep what is missing under runs/")
    run_parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS),
                            help="the models to run (default: all)")
    run_parser.set_defaults(run=run)
    rep = commands.add_parser("report", help="experiments/results/t2i_blocks.{json,md} from the runs")
    rep.add_argument("--docs", action="store_true", help=f"also fill the t2i-v2-blocks block of {DOCS_PAGE}")
    rep.set_defaults(run=report)
    args = parser.parse_args(argv)
    from interp.cli import run_command

    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())

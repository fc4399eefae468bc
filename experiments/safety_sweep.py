"""Issue 6 experiment: the safety-ratio sweep on the embedded chat models, resumable.

Models: the shipped fine-tunes ``zoo/weights/chat-safety-{r}[-seed{s}]`` and, for seeds not
shipped, ones fine-tuned from the same shipped base with the recipe's own command (data order and
batches depend on the seed):

    python -m zoo.chat.recipe --out runs/experiments/recipe-seed1 --save-to runs/experiments/weights \\
        --from-base zoo/weights/chat-base --seed 1 --finetune-steps 150 --threads 1

For each model: the lexical diversity of exactly the fine-tuning data it saw (the recipe's batches
are a function of seed, stage and step, so they are drawn again here), refusal metrics on held-out
chat-world prompts, and residual geometry at the last prompt token against the base model.

    python -m experiments.safety_sweep run [--seeds 0 1 2]   # skips measured models
    python -m experiments.safety_sweep report                # JSON, markdown, plot
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from .common import (BASE_MODEL, REPO, RESULTS, SHIPPED_WEIGHTS, eval_records, geometry_prompts, markdown_table,
                     mean_spread, measure_model, reference_residuals, show, write_json)

RUN_ROOT = REPO / "runs" / "experiments" / "safety"
EXTRA_WEIGHTS = REPO / "runs" / "experiments" / "weights"
RATIOS = (0.0, 0.1, 0.2, 0.4)
EQUAL_SIZE = 500  # completions per part when comparing safety with general data (distinct-n depends on size)


def model_dir(ratio: float, seed: int) -> Path:
    from zoo.chat.recipe import variant_name

    shipped = SHIPPED_WEIGHTS / variant_name(ratio, seed)  # the recipe's author may have shipped extra seeds
    if seed == 0 or (shipped / "model.safetensors").exists():
        return shipped
    return EXTRA_WEIGHTS / variant_name(ratio, seed)


def finetune_data(directory: Path) -> list[dict]:
    """The examples the recipe fine-tuned ``directory``'s model on, drawn again batch by batch."""
    from zoo.chat.recipe import sample_batch
    from zoo.chat.world import World, WorldConfig

    saved = json.loads((directory / "recipe.json").read_text())
    recipe, stage = saved["recipe"], saved["stage"]
    ratio, seed = stage["safety_ratio"], recipe["seed"]
    world = World(WorldConfig(**recipe["world"]))
    shares = {"general": 1 - ratio, "harmful": ratio} if ratio > 0 else {"general": 1.0}
    name = f"finetune-{ratio:g}" + (f"-seed{seed}" if seed else "")  # the recipe's stage name
    examples = []
    for step in range(stage["steps"]):
        examples += sample_batch(world, random.Random(f"{seed}-{name}-{step}"), recipe["batch_size"], shares)
    return examples


def diversity(examples: list[dict]) -> dict:
    """H1 and distinct-2 (word tokens) of completions: all, safety part, general part, and both at equal size."""
    from flowlens.diversity import lexical_diversity

    def measure(texts: list[str]) -> dict | None:
        if not texts:
            return None
        report = lexical_diversity(texts)
        return {"n_texts": report.n_texts, "H1": report.entropy[1], "H2": report.entropy[2],
                "distinct-2": report.distinct[2], "msttr": report.msttr}

    safety = [e["completion"] for e in examples if e["kind"] == "harmful"]
    general = [e["completion"] for e in examples if e["kind"] == "general"]
    rng = random.Random(0)
    return {"completions": measure([e["completion"] for e in examples]),
            "queries": measure([e["prompt"] for e in examples]),
            "safety_completions": measure(safety), "general_completions": measure(general),
            f"safety_completions_{EQUAL_SIZE}": measure(rng.sample(safety, EQUAL_SIZE))
            if len(safety) >= EQUAL_SIZE else None,
            f"general_completions_{EQUAL_SIZE}": measure(rng.sample(general, EQUAL_SIZE))
            if len(general) >= EQUAL_SIZE else None}


def run(args) -> int:
    import torch

    torch.set_num_threads(1)
    records, prompts = eval_records(), geometry_prompts()
    reference = reference_residuals(RUN_ROOT)
    jobs = [("base", None, None, BASE_MODEL)] + [(f"r{r:g}-s{s}", r, s, model_dir(r, s))
                                                 for s in args.seeds for r in RATIOS]
    from tqdm import tqdm

    for name, ratio, seed, directory in tqdm(jobs, desc="safety sweep"):
        path = RUN_ROOT / name / "measure.json"
        if path.exists():
            continue
        if not (directory / "model.safetensors").exists():
            print(f"skipping {name}: no model in {directory} (fine-tune it with the recipe first)", flush=True)
            continue
        result = {"name": name, "ratio": ratio, "seed": seed, "model": str(directory.relative_to(REPO)),
                  "recipe_evaluation": {k: v for k, v in json.loads((directory / "evaluation.json").read_text()).items()
                                        if k in ("general_exact_match", "harmful_refusal_rate",
                                                 "benign_false_refusal_rate", "n")}}
        if ratio is not None:
            result["diversity"] = diversity(finetune_data(directory))
        result.update(measure_model(directory, records, prompts, reference))
        write_json(path, result)
        print(f"done {name}", flush=True)
    return 0


# --------------------------------------------------------------------------- report

def report(args) -> int:
    results = [json.loads(p.read_text()) for p in sorted(RUN_ROOT.glob("*/measure.json"))]
    runs = [r for r in results if r["ratio"] is not None]
    base = next((r for r in results if r["name"] == "base"), None)
    if not runs:
        print(f"error: no measured models under {RUN_ROOT}; run `python -m experiments.safety_sweep run` first",
              file=sys.stderr)
        return 2
    n_layers = len(runs[0]["geometry"]["concentration"]["top_k_energy"])
    summary = []
    for ratio in sorted({r["ratio"] for r in runs}):
        chosen = [r for r in runs if r["ratio"] == ratio]
        stats = lambda get: mean_spread([get(r) for r in chosen])  # noqa: E731
        summary.append({
            "ratio": ratio, "seeds": sorted(r["seed"] for r in chosen),
            "data_H1": stats(lambda r: r["diversity"]["completions"]["H1"]),
            "data_distinct2": stats(lambda r: r["diversity"]["completions"]["distinct-2"]),
            "false_refusal_rate": stats(lambda r: r["refusals"]["false_refusal_rate"]),
            "harmful_refusal_rate": stats(lambda r: r["refusals"]["harmful_refusal_rate"]),
            "task_accuracy": stats(lambda r: r["refusals"]["task_accuracy"]),
            "recipe_false_refusal_rate": stats(lambda r: r["recipe_evaluation"]["benign_false_refusal_rate"]),
            "recipe_harmful_refusal_rate": stats(lambda r: r["recipe_evaluation"]["harmful_refusal_rate"]),
            "recipe_exact_match": stats(lambda r: r["recipe_evaluation"]["general_exact_match"]),
            "alignment_mean": stats(lambda r: r["geometry"]["alignment"]["mean"]),
            "alignment_pc1_by_layer": [stats(lambda r: r["geometry"]["alignment"]["pc1_by_layer"][l])
                                       for l in range(n_layers)],
            "top_k_energy_by_layer": [stats(lambda r: r["geometry"]["concentration"]["top_k_energy"][l])
                                      for l in range(n_layers)],
            "effective_rank_by_layer": [stats(lambda r: r["geometry"]["concentration"]["effective_rank"][l])
                                        for l in range(n_layers)]})
    part = [r["diversity"] for r in runs if r["diversity"].get(f"safety_completions_{EQUAL_SIZE}")]
    parts = {name: {m: mean_spread([d[f"{name}_completions_{EQUAL_SIZE}"][m] for d in part])
                    for m in ("H1", "distinct-2", "msttr")} for name in ("safety", "general")} if part else {}
    depth = runs[0]["geometry"]["concentration"]["depth"]
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / "safety_sweep.json", {"summary": summary, "safety_vs_general_completions": parts,
                                               "base": base, "depth": depth, "runs": [
                                                   {k: v for k, v in r.items() if k != "refusals"} |
                                                   {"refusals": {m: r["refusals"][m] for m in (
                                                       "false_refusal_rate", "harmful_refusal_rate",
                                                       "task_accuracy")}} for r in runs]})
    header = ["safety ratio", "seeds", "data H1 (bits)", "data distinct-2", "false refusal (benign)",
              "harmful refusal", "task accuracy", "alignment w/ base (mean |cos|)",
              "top-3 energy by layer (depth " + "/".join(f"{d:.2f}" for d in depth) + ")"]
    rows = []
    if base is not None:
        g = base["geometry"]["concentration"]["top_k_energy"]
        rows.append(["base (no fine-tune)", "-", "-", "-", f"{base['refusals']['false_refusal_rate']:.3f}",
                     f"{base['refusals']['harmful_refusal_rate']:.3f}", f"{base['refusals']['task_accuracy']:.3f}",
                     "1", " / ".join(f"{x:.3f}" for x in g)])
    for e in summary:
        rows.append([f"{e['ratio']:g}", str(len(e["seeds"])), show(e["data_H1"], 2), show(e["data_distinct2"]),
                     show(e["false_refusal_rate"]), show(e["harmful_refusal_rate"]), show(e["task_accuracy"]),
                     show(e["alignment_mean"]), " / ".join(f"{s['mean']:.3f}" for s in e["top_k_energy_by_layer"])])
    text = markdown_table(header, rows)
    text += "\nAlignment with the base model, PC1 |cos| by layer (mean ± std over seeds):\n\n"
    text += markdown_table(["safety ratio", *[f"depth {d:.2f}" for d in depth]],
                           [[f"{e['ratio']:g}", *[show(s) for s in e["alignment_pc1_by_layer"]]] for e in summary])
    text += "\nThe recipe's own evaluation (200 held-out harmful and benign prompts, 360 general):\n\n"
    text += markdown_table(["safety ratio", "false refusal", "harmful refusal", "exact match"],
                           [[f"{e['ratio']:g}", show(e["recipe_false_refusal_rate"]),
                             show(e["recipe_harmful_refusal_rate"]), show(e["recipe_exact_match"])] for e in summary])
    if parts:
        text += f"\nCompletions of the fine-tuning data, {EQUAL_SIZE} of each part (mean ± std over models):\n\n"
        text += markdown_table(["part", "H1 (bits)", "distinct-2", "MSTTR"],
                               [[name, show(p["H1"], 2), show(p["distinct-2"]), show(p["msttr"])]
                                for name, p in parts.items()])
    types = sorted({t.split("/", 1)[1] for r in runs for t in r["refusals"]["refusal_rate_by_type"]
                    if t.startswith("benign/")})
    if types:
        text += "\nFalse-refusal rate by benign prompt type (XSTest's types; mean over seeds):\n\n"
        text += markdown_table(["safety ratio", *types], [
            [f"{e['ratio']:g}", *[show(mean_spread([r["refusals"]["refusal_rate_by_type"].get(f"benign/{t}")
                                                   for r in runs if r["ratio"] == e["ratio"]]), 2) for t in types]]
            for e in summary])
    (RESULTS / "safety_sweep.md").write_text(text)
    plot(summary, depth, RESULTS / "safety_sweep.png")
    print(text)
    return 0


def plot(summary: list[dict], depth: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4))
    ratios = [e["ratio"] for e in summary]
    for metric, name in (("false_refusal_rate", "false refusal (benign)"), ("harmful_refusal_rate", "harmful refusal"),
                         ("task_accuracy", "task accuracy")):
        axes[0].errorbar(ratios, [e[metric]["mean"] for e in summary], yerr=[e[metric]["std"] for e in summary],
                         marker="o", capsize=3, label=name)
    axes[0].set_xlabel("safety-data ratio")
    axes[0].set_title("refusals and accuracy (mean ± std over seeds)")
    axes[0].legend(fontsize=8)
    for e in summary:
        for axis, key in ((axes[1], "top_k_energy_by_layer"), (axes[2], "alignment_pc1_by_layer")):
            axis.errorbar(depth, [s["mean"] for s in e[key]], yerr=[s["std"] for s in e[key]], marker="o", capsize=3,
                          label=f"ratio {e['ratio']:g}")
    axes[1].set_title("top-3 energy of last-token residuals")
    axes[2].set_title("PC1 alignment with the base model (|cos|)")
    for axis in axes[1:]:
        axis.set_xlabel("normalised depth l/(L-1)")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.safety_sweep", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="measure every model not yet measured")
    run_parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    run_parser.set_defaults(run=run)
    commands.add_parser("report", help="tables and plot of the measured models").set_defaults(run=report)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

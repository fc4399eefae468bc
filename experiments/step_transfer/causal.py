"""The step-transfer study's causal side: RIEBench's edits (`causal`) and painted labels (`paint`) with the shipped
1-step SAEs at 1, 2 and 4 steps (and on the base model's generations with --base), resumable under the study's run
directory, and their results as the report reads them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from .study import Study, _shown, base_column, base_sampling

CAUSAL_STEPS = (1, 2, 4)
CAUSAL_CATEGORIES = ("change colour", "change texture", "change shape")
CAUSAL_BLOCKS = ("up_blocks.1.attentions.1", "up_blocks.1.attentions.2")  # where the toy draws shape and colour
CAUSAL_MULTIPLIERS = (1.0, 2.0)
CAUSAL_K_TRANS = 5
CAUSAL_LIMIT = 20  # tasks per category


def causal(study: Study, args) -> int:
    """RIEBench's shapes suite with the shipped 1-step SAEs (the sae method, static, through the blocks that draw
    shape and colour) at 1, 2 and 4 steps: the same tasks, the same edit rule, applied at every step."""
    from riebench.methods import MethodConfig
    from riebench.runner import Runner, RunConfig as BenchConfig, load_saes

    torch.set_num_threads(args.threads)
    configs = [MethodConfig("sae", k_trans=CAUSAL_K_TRANS, multiplier=m, blocks=list(CAUSAL_BLOCKS))
               for m in CAUSAL_MULTIPLIERS]
    model = None
    for steps in CAUSAL_STEPS:
        study.log(f"RIEBench with the 1-step SAEs at {steps} step(s): {', '.join(CAUSAL_CATEGORIES)}, "
             f"{args.limit} tasks each")
        bench = BenchConfig(model=study.model, categories=list(CAUSAL_CATEGORIES), limit_per_category=args.limit,
                            saes=str(study.sae_root), steps=steps, configs=configs)
        runner = Runner(bench, study.sae_dir("riebench") / f"steps{steps}", model=model, progress=False)
        model = runner.model
        print(runner.run())
    if args.base:  # the same tasks and edits on the base model's generations, at its own steps and guidance
        column = base_column(args.base, study.model)
        study.log(f"RIEBench with the 1-step SAEs on {column} ({args.base}): {', '.join(CAUSAL_CATEGORIES)}, "
             f"{args.limit} tasks each")
        bench = BenchConfig(model=args.base, categories=list(CAUSAL_CATEGORIES), limit_per_category=args.limit,
                            saes=str(study.sae_root), steps=base_sampling(args.base, study.model)[0], configs=configs)
        # the toy's SAEs on another model, on purpose: given loaded, past the runner's check that they were
        # trained on the model they edit (the question here is whether they transfer)
        saes = load_saes(str(study.sae_root), list(CAUSAL_BLOCKS))
        print(Runner(bench, study.sae_dir("riebench") / "base", saes=saes, progress=False).run())
    return 0


def causal_results(study: Study, base: str | None = None) -> dict | None:
    """{steps: {config label: {category: {success, preservation, n}}}} from the causal runs, or None; with
    ``base`` (`toy-base` or a recipe's pipeline) and its run done, also {base_column(base): ...}."""
    from riebench.runner import load_results

    out = {}
    runs = [(str(steps), study.sae_dir("riebench") / f"steps{steps}") for steps in CAUSAL_STEPS]
    if base and load_results(study.sae_dir("riebench") / "base")[0]:
        runs.append((base_column(base, study.model), study.sae_dir("riebench") / "base"))
    for steps, directory in runs:
        done, failed = load_results(directory)
        if not done:
            return None
        table = {}
        for result in done:
            cell = table.setdefault(result["label"] + f", m {result['config']['multiplier']:g}", {}).setdefault(
                result["category"], {"success": [], "preservation": []})
            for key in ("success", "preservation"):
                cell[key].append(float(result["metrics"][key]))
        out[steps] = {label: {category: {"success": float(np.mean(v["success"])),
                                         "preservation": float(np.mean(v["preservation"])), "n": len(v["success"])}
                              for category, v in sorted(categories.items())}
                      for label, categories in sorted(table.items())}
        out[steps]["failed"] = len(failed)
    return out


# ----------------------------------------------------------------------------- painted labels

PAINT_STEPS = CAUSAL_STEPS
PAINT_BLOCKS = CAUSAL_BLOCKS
PAINT_ATTRIBUTES = ("colour", "texture", "shape")  # what the RIEBench categories above change
PAINT_PER_LABEL = 1      # features per label: the label search's first (`FeatureLibrary.search`: by the card's
                         # 1-step causal score, then AUROC): the feature the Paint tab offers for the label
PAINT_STRENGTHS = (3.0, 6.0, 12.0)  # x the feature's mean activation; 3: `saes causal`'s and the Paint tab's default
PAINT_SCENES = 24        # held-out scenes per label (`saes causal`'s default)
PAINT_SEED = 33          # the scenes' seed: other scenes than those of the cards' scores (seed 21), which chose
                         # the features, so that the 1-step figure is not the choice's own measurement


def paint_features(library, blocks=PAINT_BLOCKS, attributes=PAINT_ATTRIBUTES, per_label: int = PAINT_PER_LABEL):
    """[(block, feature, label)]: per block and label of `attributes`, the label search's first `per_label`
    features (the best painters at 1 step by the cards' `saes causal` scores, then by AUROC)."""
    from saes.library import label_rank

    chosen = []
    for block in blocks:
        by_label: dict[str, list[dict]] = {}
        for card in library.cards(block):
            if card.get("label") and card["label"].partition("=")[0] in attributes:
                by_label.setdefault(card["label"], []).append(card)
        for label in sorted(by_label):
            chosen += [(block, c["id"], label) for c in sorted(by_label[label], key=label_rank)[:per_label]]
    return chosen


def paint(study: Study, args) -> int:
    """Painted labels with the shipped 1-step SAEs at 1, 2 and 4 steps: `saes causal`'s measurement
    (`saes.causal.causal_label_scores`: the feature painted into held-out objects at every step, the world's probe
    reads whether the label shows there and whether the rest is kept), the same scenes and seeds at each step count.
    Resumable: one file per step count, strength and block under runs/step_transfer/paint/."""
    from interp.models.t2i import load_t2i
    from saes.causal import causal_label_scores
    from saes.library import FeatureLibrary
    from saes.strict_json import write_json

    torch.set_num_threads(args.threads)
    library = FeatureLibrary(args.sae)
    chosen = paint_features(library, args.block or PAINT_BLOCKS, per_label=args.per_label)
    # (run directory, model, steps, what the config adds): the toy at each step count, then the base model at its
    # own steps and guidance (its generations' unedited images are its own: one `originals` per model)
    runs = [(f"steps{steps}", study.model, steps, {}) for steps in args.steps]
    if args.base:
        runs.append(("base", args.base, base_sampling(args.base, study.model)[0],
                     {"model": args.base, "column": base_column(args.base, study.model)}))
    models: dict = {}
    originals: dict = {}
    for directory, name, steps, extra in runs:
        for strength in args.strength:
            for block in dict.fromkeys(b for b, _, _ in chosen):
                features = [f for b, f, _ in chosen if b == block]
                config = {"steps": steps, "strength": strength, "scenes": args.scenes, "seed": args.seed,
                          "block": block, "features": features, "sae": _shown(Path(args.sae).resolve()), **extra}
                path = study.sae_dir("paint") / directory / f"{block}-s{strength:g}.json"
                if path.exists() and json.loads(path.read_text())["config"] == config:
                    continue
                if name not in models:
                    models[name] = load_t2i(name)
                    models[name].pipe.set_progress_bar_config(disable=True)
                study.log(f"painting {len(features)} labelled features of {block} at {steps} step(s)"
                     f"{'' if name == study.model else ' of ' + extra['column']}, strength {strength:g}, "
                     f"{args.scenes} scenes each")
                start = time.perf_counter()
                scores = causal_label_scores(library, models[name], block, features, n_scenes=args.scenes,
                                             strength=strength, seed=args.seed,
                                             originals=originals.setdefault(name, {}), steps=steps,
                                             preservation=True)
                path.parent.mkdir(parents=True, exist_ok=True)
                write_json(path, {"config": config, "seconds": time.perf_counter() - start,
                                  "scores": {str(f): {"label": library.card(block, f)["label"],
                                                      "card_causal_label": library.card(block, f).get("causal_label"),
                                                      **scores[f]} for f in features}}, indent=2)
    study.log("painted labels done")
    return 0


def paint_results(study: Study, base: str | None = None) -> dict | None:
    """{"config", "features": [{block, feature, label, card_causal_label}], "scores": {steps: {strength: {block:
    {feature: {causal_label, causal_label_before, causal_label_n, preservation}}}}}} from the paint runs, or None;
    with ``base`` also the base model's run, under its column name ("base, 30 steps, CFG 5"). Every step count
    must have been run with the same features, scenes and seed."""
    root = study.sae_dir("paint")
    files = sorted(root.glob("steps*/*.json")) + (sorted(root.glob("base/*.json")) if base else [])
    if not files:
        return None
    scores: dict = {}
    features, shared = {}, None
    for path in files:
        data = json.loads(path.read_text())
        config = data["config"]
        common = {k: config[k] for k in ("scenes", "seed", "sae")}
        if shared is None:
            shared = common
        elif common != shared:
            raise ValueError(f"{_shown(path)} was painted with {common}, others with {shared}: run "
                             "`python -m experiments.step_transfer paint` again with one setting")
        block = config["block"]
        column = config.get("column", str(config["steps"]))  # the base model's: "base, 30 steps, CFG 5"
        scores.setdefault(column, {}).setdefault(f"{config['strength']:g}", {})[block] = {
            f: {k: v for k, v in entry.items() if k not in ("label", "card_causal_label")}
            for f, entry in data["scores"].items()}
        for f, entry in data["scores"].items():
            features[(block, int(f))] = {"block": block, "feature": int(f), "label": entry["label"],
                                         "card_causal_label": entry["card_causal_label"]}
    grid = {(s, st, b, f) for s, by_strength in scores.items() for st, by_block in by_strength.items()
            for b, by_feature in by_block.items() for f in by_feature}
    steps = sorted(scores, key=lambda column: (not column.isdigit(), int(column) if column.isdigit() else 0, column))
    strengths = sorted({st for v in scores.values() for st in v}, key=float)
    missing = [(s, st, b, str(f)) for s in steps for st in strengths for (b, f) in features
               if (s, st, b, str(f)) not in grid]
    if missing:
        raise ValueError(f"the paint runs are incomplete ({len(missing)} of {len(grid) + len(missing)} measurements "
                         f"missing, e.g. {missing[0]}): run `python -m experiments.step_transfer paint` to the end")
    ordered = sorted(features.values(), key=lambda e: (PAINT_BLOCKS.index(e["block"]) if e["block"] in PAINT_BLOCKS
                                                       else len(PAINT_BLOCKS), e["label"], e["feature"]))
    base_columns = [s for s in steps if not s.isdigit()]
    counts = {"steps": [int(s) for s in steps if s.isdigit()]} | ({"base": base_columns} if base_columns else {})
    return {"config": shared | counts | {"strengths": [float(st) for st in strengths]},
            "features": ordered,
            "scores": {s: {st: scores[s][st] for st in strengths} for s in steps}}



__all__ = ["CAUSAL_BLOCKS", "CAUSAL_CATEGORIES", "CAUSAL_K_TRANS", "CAUSAL_LIMIT", "CAUSAL_MULTIPLIERS", "CAUSAL_STEPS",
           "PAINT_ATTRIBUTES", "PAINT_BLOCKS", "PAINT_PER_LABEL", "PAINT_SCENES", "PAINT_SEED", "PAINT_STEPS",
           "PAINT_STRENGTHS", "causal", "causal_results", "paint", "paint_features", "paint_results"]

"""Evaluation report of a model's SAEs (one per block): reconstruction on fresh generations,
splice-in fidelity, and which blocks carry which attributes (from the feature analysis).

Written as `report.json` (everything) and `REPORT.md` (tables) by `python -m saes report`.
Targets checked (issue 4): explained variance >= 0.8, dead features <= 5%, and every value of the world's key
attributes (`GroundTruth.key_attributes`; the shapes world's colours and shapes) has a feature labelled with it at
AUROC >= 0.9 in some block. The report names its world ("world"), whose attributes order its tables.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from interp.atomic import atomic_write_text
from interp.cli import add_dtype_argument, add_out_argument, at_least

from .evaluate import evaluate
from .fidelity import fidelity_table, splice_fidelity
from .pool import generate_pool, load_model
from .probes import cell_probe_accuracy, direction_ceiling, mixture_distances
from .sae import SAE, load_sae_set
from .strict_json import write_json

TARGETS = {"explained_variance_min": 0.8, "dead_fraction_max": 0.05, "label_auroc_min": 0.9}
REPORT_JSON, REPORT_MD = "report.json", "REPORT.md"


def weights_fingerprint(model_dir: str | os.PathLike) -> dict[str, str]:
    """sha256 of every safetensors file of a pipeline directory, by path inside it."""
    import hashlib

    model_dir = Path(model_dir)
    return {str(path.relative_to(model_dir)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(model_dir.rglob("*.safetensors"))}


def _blocks(root: Path) -> dict[str, SAE]:
    return load_sae_set(root)


def label_coverage(features_summary: dict, min_auroc: float) -> dict[str, dict]:
    """Per attribute value: the best feature *labelled* with it over all blocks (block, id, AUROC)."""
    best: dict[str, dict] = {}
    for block, entry in features_summary["blocks"].items():
        for label, value in entry["attribute_values"].items():
            auroc = value.get("best_labelled_auroc")
            if auroc is not None and (label not in best or auroc > best[label]["auroc"]):
                best[label] = {"block": block, "feature": value["best_labelled_feature"], "auroc": auroc}
    return {label: {**v, "meets_target": v["auroc"] >= min_auroc} for label, v in best.items()}


def build_report(model, root: str | os.PathLike, n_eval_images: int = 500, n_fidelity_images: int = 64,
                 features_summary: dict | None = None, world_seed: int = 2, seed: int = 100_000,
                 store=None) -> dict:
    """Measure every block's SAE under `root` on fresh generations of `model` from its world's captions (the
    shapes world's, for the toy): a model without ground truth is refused (`interp.ground_truth`).

    store: the training `ActivationStore`, optional: dead features are then counted over all
    of its vectors (a few hundred fresh images are too few to see rare features fire)."""
    from interp.ground_truth import require_ground_truth

    truth = require_ground_truth(model, "the SAE report (its labels, block probes and attribute accuracy)",
                                 "`python -m saes eval --store DIR` measures its SAEs on its own activations")
    root = Path(root)
    saes = _blocks(root)
    for block in saes:
        if block not in model.blocks:
            raise ValueError(f"{model.name} has no block {block!r} (SAE directory under {root})")
    prompts = truth.prompts(max(n_eval_images, n_fidelity_images), world_seed)
    seeds = [seed + i for i in range(len(prompts))]
    # every hookable block is captured: the linear probes say where each attribute lives, SAE or not
    pool = generate_pool(model, list(dict.fromkeys([*saes, *model.blocks])), prompts[:n_eval_images],
                         seeds[:n_eval_images])
    blocks = {}
    for block, sae in saes.items():
        vectors = pool.updates[block].permute(0, 2, 3, 1).reshape(-1, sae.cfg.d_in)
        metrics = evaluate(sae, vectors.split(4096))
        on_store = None
        if store is not None and block in store.blocks:
            on_store = evaluate(sae, store.batches(block, batch_size=8192, shuffle=False))
        dead_fraction = on_store["dead_fraction"] if on_store else metrics["dead_fraction"]
        fidelity = splice_fidelity(model, sae, block, prompts[:n_fidelity_images], seeds[:n_fidelity_images],
                                   progress=True)
        blocks[block] = {
            "d_in": sae.cfg.d_in, "d_sae": sae.cfg.d_sae, "k": sae.cfg.k, "architecture": sae.cfg.architecture,
            **{key: metrics[key] for key in ("tokens", "explained_variance", "mse", "l0", "dead_features",
                                             "dead_fraction", "dense_features", "dense_threshold")},
            "store": {key: on_store[key] for key in ("tokens", "explained_variance", "l0", "dead_features",
                                                     "dead_fraction", "dense_features")} if on_store else None,
            # dead features counted over the store when given (see `store` above)
            "dead_fraction_for_target": dead_fraction,
            "meets_targets": bool(metrics["explained_variance"] >= TARGETS["explained_variance_min"]
                                  and dead_fraction <= TARGETS["dead_fraction_max"]),
            "splice_fidelity": fidelity,
        }
    report = {"model": model.name, "world": truth.name, "n_eval_images": n_eval_images,
              "n_fidelity_images": n_fidelity_images, "world_seed": world_seed, "seed": seed, "targets": TARGETS,
              "blocks": blocks}
    scenes = truth.scenes(pool.prompts)
    if scenes is not None:
        report |= block_geometry(pool.updates, scenes, ceiling_blocks=list(saes), truth=truth)
    if features_summary is not None:
        coverage = label_coverage(features_summary, TARGETS["label_auroc_min"])
        values = truth.attribute_values()
        wanted = [f"{a}={v}" for attribute in truth.key_attributes for a, v in values if a == attribute]
        report["attributes_by_block"] = {
            block: {label: entry["best_auroc"] for label, entry in summary["attribute_values"].items()}
            for block, summary in features_summary["blocks"].items()}
        report["best_block"] = features_summary.get("best_block", {})
        report["label_coverage"] = coverage
        report["key_values_labelled"] = {  # every value of the world's key attributes
            label: coverage.get(label, {"auroc": None, "meets_target": False}) for label in wanted}
        report["all_key_values_labelled"] = all(
            coverage.get(label, {}).get("meets_target", False) for label in wanted)
        report["features_n_images"] = features_summary.get("n_images")
    return report


def key_values_labelled(report: dict) -> dict[str, dict]:
    """{"attribute=value": {"auroc", "meets_target"}} for every value of the world's key attributes. Reports
    written before this name (the shipped toy report among them) call it `colours_and_shapes_labelled`."""
    return report.get("key_values_labelled", report.get("colours_and_shapes_labelled", {}))


def block_geometry(updates: dict[str, "torch.Tensor"], scenes: list, ceiling_blocks: list[str] | None = None,
                   *, truth) -> dict:
    """Where each attribute lives, SAE or not: per block the linear cell probe (accuracy and the dimensions
    spent, `cell_probe_accuracy`) and, for `ceiling_blocks` (default: all), the best single direction's AUROC
    per object attribute value (`direction_ceiling`); `truth`: the world of the scenes (its layout)."""
    ceiling_blocks = list(updates) if ceiling_blocks is None else ceiling_blocks
    probed = _attribute_order(truth)[:-1]  # the key attributes first, then the other object attributes
    return {"block_probes": {block: cell_probe_accuracy(u, scenes, probed, truth=truth)
                             for block, u in updates.items()},
            "direction_ceiling": {block: direction_ceiling(updates[block], scenes, truth.object_attributes,
                                                           truth=truth) for block in ceiling_blocks},
            "mixture_distance": {block: mixture_distances(updates[block], scenes, truth.key_attributes, truth=truth)
                                 for block in ceiling_blocks}}


def _attribute_order(truth) -> list[str]:
    """The order of the report's attribute columns and rows: the world's key attributes, its other object
    attributes, the background."""
    return list(dict.fromkeys([*truth.key_attributes, *truth.object_attributes, "background"]))


def _world_of(report: dict):
    """The GroundTruth a report or probe file was measured in (files written before they named it: the shapes
    world, the only one there was)."""
    from interp.ground_truth import world

    return world(report.get("world", "shapes"))


def probe_blocks(model, n_images: int = 300, world_seed: int = 2, seed: int = 100_000,
                 ablate_images: int = 0) -> dict:
    """`block_geometry` of every hookable block of `model` on `n_images` fresh generations of its world: the
    check of a new or retrained model before any SAE is trained on it (a colour that lives on a plane with its
    neighbours, 2 dimensions for 8 values, gets no feature of its own; see saes/pretrained/toy/notes.md).
    A model without ground truth (`interp.ground_truth`) is refused."""
    from interp.ground_truth import require_ground_truth

    truth = require_ground_truth(model, "probing blocks for attributes")
    prompts = truth.prompts(max(n_images, ablate_images), world_seed)
    seeds = [seed + i for i in range(len(prompts))]
    pool = generate_pool(model, list(model.blocks), prompts[:n_images], seeds[:n_images])
    probes = {"model": model.name, "world": truth.name, "n_images": n_images, "world_seed": world_seed, "seed": seed,
              **block_geometry(pool.updates, truth.scenes(pool.prompts), truth=truth)}
    if ablate_images:  # what the image needs from each block, beside what each block's update codes
        from .fidelity import block_ablations

        probes["ablation"] = block_ablations(model, list(model.blocks), prompts[:ablate_images],
                                             seeds[:ablate_images], progress=True)
    return probes


def probe_markdown(probes: dict) -> str:
    mixture = probes.get("mixture_distance", {})
    world = _world_of(probes).name
    lines = [f"# Where {probes['model']} codes each attribute", "",
             f"{probes['n_images']} fresh {world}-world generations. Linear probe accuracy per block (in brackets: "
             "the dimensions spent on the attribute, `saes.probes.value_mean_dims`):", "",
             _probe_table(probes).rstrip(), "",
             "The best single linear direction's held-out AUROC per value (`saes.probes.direction_ceiling`), "
             "the ceiling of any SAE feature's label in that block:", "",
             _per_value_table(probes["direction_ceiling"]).rstrip()]
    if "ablation" in probes:
        from .fidelity import ablation_table

        lines += ["", f"Ablating each block in turn ({probes['ablation']['n_images']} generations, the same seeds; "
                  "`saes.fidelity.block_ablations`): the probe's accuracy per attribute over every object, bold where "
                  "it drops by 0.2 or more from the unedited images (first row), and the attributes the block so "
                  "carries:", "", ablation_table(probes["ablation"]).rstrip()]
    if any(mixture.values()):
        lines += ["", "How far each value's mean lies from the nearest mixture of the other values' means, in units "
                  "of the spread of an object's interior update around its own value's mean "
                  "(`saes.probes.mixture_distances`). "
                  "A value near 0 is a mixture of others, and an SAE reconstructs it from their features rather "
                  "than giving it one of its own:", "", _per_value_table(mixture).rstrip()]
    return "\n".join(lines) + "\n"


def _per_value_table(by_block: dict[str, dict[str, float]]) -> str:
    """Blocks (rows) by attribute values (columns, "attribute=value" keys), bold where a value is largest."""
    labels = list(dict.fromkeys(label for entry in by_block.values() for label in entry))
    best = {label: max(by_block, key=lambda b: by_block[b].get(label, -1)) for label in labels}
    lines = ["| block | " + " | ".join(label.split("=")[1] for label in labels) + " |",
             "|---|" + "---:|" * len(labels)]
    for block, entry in by_block.items():
        lines.append(f"| {block} | " + " | ".join(
            ("**{:.2f}**" if best[label] == block else "{:.2f}").format(entry[label]) if label in entry else "-"
            for label in labels) + " |")
    return "\n".join(lines) + "\n"


def _attribute_table(report: dict) -> str:
    """Best AUROC per attribute (max over its values, and the mean over values) per block."""
    by_block = report["attributes_by_block"]
    blocks = list(by_block)
    attributes = _attribute_order(_world_of(report))
    lines = ["| attribute | " + " | ".join(blocks) + " |", "|---|" + "---:|" * len(blocks)]
    for attribute in attributes:
        cells = []
        for block in blocks:
            values = [v for label, v in by_block[block].items() if label.startswith(attribute + "=")]
            cells.append(f"{sum(values) / len(values):.3f} (min {min(values):.3f})" if values else "-")
        lines.append(f"| {attribute} (mean over values) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _probe_table(report: dict) -> str:
    """Linear-probe accuracy per block (rows) and attribute (columns), chance in the header."""
    probes = report["block_probes"]
    attributes = list(dict.fromkeys(a for entry in probes.values() for a in entry))
    chance = {a: next(e[a]["chance"] for e in probes.values() if a in e) for a in attributes}
    best = {a: max((b for b in probes if a in probes[b]), key=lambda b: probes[b][a]["accuracy"]) for a in attributes}
    sae_column = "blocks" in report  # a report of SAEs marks the blocks that have one
    lines = ["| block | " + ("SAE | " if sae_column else "") + " | ".join(f"{a} (chance {chance[a]:.2f})" for a in attributes)
             + " |", "|---|" + ("---|" if sae_column else "") + "---:|" * len(attributes)]
    for block, entry in probes.items():
        cells = [(("**{:.2f}**" if best[a] == block else "{:.2f}").format(entry[a]["accuracy"])
                  + (f" ({entry[a]['dims']:.1f})" if "dims" in entry[a] else "")) if a in entry else "-"
                 for a in attributes]
        sae = (" yes |" if block in report["blocks"] else " |") if sae_column else ""
        lines.append(f"| {block} |{sae} " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _value_table(report: dict) -> str:
    by_block = report["attributes_by_block"]
    blocks = list(by_block)
    labels = sorted({label for summary in by_block.values() for label in summary})
    ceiling = report.get("direction_ceiling", {})
    mixture = report.get("mixture_distance", {})
    lines = ["| attribute value | " + " | ".join(blocks) + " | labelled feature (block, AUROC) | one direction | "
             "mixture distance |", "|---|" + "---:|" * len(blocks) + "---|---:|---:|"]
    coverage = report["label_coverage"]
    for label in labels:
        best_block = max(blocks, key=lambda b: by_block[b].get(label, -1))
        cells = [(f"**{by_block[b][label]:.3f}**" if b == best_block else f"{by_block[b][label]:.3f}")
                 if label in by_block[b] else "-" for b in blocks]
        cov = coverage.get(label)
        cov_text = f"#{cov['feature']} in {cov['block']}, {cov['auroc']:.3f}" if cov else "none"
        reach = ceiling.get(best_block, {}).get(label)
        apart = mixture.get(best_block, {}).get(label)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {cov_text} | "
                     + (f"{reach:.3f}" if reach is not None else "-") + " | "
                     + (f"{apart:.2f}" if apart is not None else "-") + " |")
    return "\n".join(lines) + "\n"


def report_markdown(report: dict) -> str:
    t = report["targets"]
    truth = _world_of(report)
    key = " and ".join(truth.key_attributes)
    lines = [f"# SAEs of the {report['model']} model: evaluation report", "",
             f"Measured on {report['n_eval_images']} fresh {truth.name}-world generations (captions seed "
             f"{report['world_seed']}, image seeds from {report['seed']}); splice fidelity on the first "
             f"{report['n_fidelity_images']}. Targets: explained variance >= {t['explained_variance_min']}, "
             f"dead features <= {100 * t['dead_fraction_max']:.0f}%, every {key} labelled at "
             f"AUROC >= {t['label_auroc_min']} in some block.", "",
             "## Reconstruction", "",
             "On the fresh generations (explained variance, L0, dead, dense); dead features also over every "
             "vector of the training store where one was given (the target is judged on that count).", "",
             "| block | d_sae | k | explained variance | L0 | dead (fresh) | dense | store: vectors | store: EV | "
             "store: dead | targets met |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for block, r in report["blocks"].items():
        st = r.get("store")
        store_cells = (f"{st['tokens']} | {st['explained_variance']:.3f} | {st['dead_features']} "
                       f"({100 * st['dead_fraction']:.1f}%)") if st else "- | - | -"
        lines.append(f"| {block} | {r['d_sae']} | {r['k']} | {r['explained_variance']:.3f} | {r['l0']:.2f} | "
                     f"{r['dead_features']} ({100 * r['dead_fraction']:.1f}%) | {r['dense_features']} | "
                     f"{store_cells} | {'yes' if r['meets_targets'] else 'no'} |")
    lines += ["", "## Splice-in fidelity", "",
              "Each image generated with the block's update replaced by the SAE reconstruction (`splice`), "
              "the same plus the SAE error (`splice_with_error`), and with the block ablated, compared "
              "with the original generation. Probe columns: attribute accuracy of the probe's reading "
              "against the caption.", "",
              fidelity_table({b: r["splice_fidelity"] for b, r in report["blocks"].items()}).rstrip()]
    if "block_probes" in report:
        lines += ["", "## Which blocks carry which attributes", "",
                  "Linear probes, with or without an SAE: a logistic regression from each occupied grid cell's mean "
                  "update (standardised) to its object's attribute, fitted on half of the images and scored on the "
                  "other half; every hookable block (bold: the best block). In brackets: the dimensions the block "
                  "spends on the attribute (participation ratio of the centred value means, at most values - 1; "
                  "`saes.probes.value_mean_dims`).", "", _probe_table(report).rstrip()]
    if "attributes_by_block" in report:
        lines += ["", "## Which SAE features carry which attributes", "",
                  f"Best feature AUROC per attribute value per block over block positions, from the feature "
                  f"analysis of {report.get('features_n_images')} images (bold: the best block). \"one direction\": "
                  f"the AUROC the best single linear feature of the bold block reaches on held-out images, scored the "
                  f"same way (`saes.probes.direction_ceiling`): the ceiling of any SAE feature's label there. "
                  f"\"mixture distance\": how far the value's mean update lies from every mixture of the other "
                  f"values' means there, in units of an object's spread around its value's mean "
                  f"(`saes.probes.mixture_distances`); near 0, an SAE rebuilds the value from the others' "
                  f"features and gives it none of its own.", "",
                  _attribute_table(report).rstrip(), "", _value_table(report).rstrip(), "",
                  f"Every {key} labelled at AUROC >= {t['label_auroc_min']}: "
                  f"{'yes' if all(v['meets_target'] for v in key_values_labelled(report).values()) else 'no'}"]
        missing = [label for label, v in key_values_labelled(report).items() if not v["meets_target"]]
        if missing:
            lines.append(f"(not met: {', '.join(missing)})")
    if report.get("notes"):
        lines += ["", "## Notes", "", report["notes"]]
    return "\n".join(lines) + "\n"


def write_report(report: dict, out_dir: str | os.PathLike) -> str:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = report_markdown(report)  # rendered first: a report that cannot render replaces nothing
    write_json(out / REPORT_JSON, report, indent=2)
    atomic_write_text(out / REPORT_MD, md)
    return md


def add_report_arguments(parser) -> None:
    """`saes report`: the SAEs under --root, the fresh generations they are measured on, the feature analysis."""
    parser.add_argument("--model", default="toy")
    parser.add_argument("--root", required=True, help="directory with one SAE per block (e.g. saes/pretrained/toy)")
    parser.add_argument("--features-summary", default=None, help="features_summary.json of `python -m saes features`")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    parser.add_argument("--guidance", type=float, default=None, help="classifier-free guidance (default: the model's)")
    parser.add_argument("--store", default=None, help="the training activation store: dead features over all of it")
    parser.add_argument("--eval-images", type=int, default=500, help="fresh images for EV, L0, dead features")
    parser.add_argument("--fidelity-images", type=int, default=64, help="images for splice fidelity")
    parser.add_argument("--world-seed", type=int, default=2, help="seed of the fresh captions")
    parser.add_argument("--seed", type=int, default=100_000, help="image i is generated with seed + i")
    parser.add_argument("--notes-file", default=None, help="markdown appended to REPORT.md as its Notes section")
    parser.add_argument("--model-name", default=None, help="the model's name in the report (default: --model)")
    add_dtype_argument(parser, default=None)
    parser.add_argument("--threads", type=at_least(1), default=1)
    add_out_argument(parser, default=None, help="default: --root")
    parser.add_argument("--overwrite", action="store_true",
                        help="rewrite REPORT.md and report.json shipped with the repository (saes/pretrained/...)")


def report_command(args) -> int:
    from interp.shipped import refuse_shipped

    if not args.overwrite:
        refuse_shipped([args.out or args.root], "saes report", "pass --out DIR to write the report elsewhere")
    model = load_model(args)
    if args.model_name:
        model.name = args.model_name
    summary = json.loads(Path(args.features_summary).read_text()) if args.features_summary else None
    store = None
    if args.store:
        from interp.store import ActivationStore

        store = ActivationStore(args.store)
    report = build_report(model, args.root, n_eval_images=args.eval_images, n_fidelity_images=args.fidelity_images,
                          features_summary=summary, world_seed=args.world_seed, seed=args.seed, store=store)
    if args.notes_file:
        report["notes"] = Path(args.notes_file).read_text().strip()
    from interp.models.t2i import resolve

    source = resolve(args.model)[0]
    if os.path.isdir(source):  # which weights the SAEs were measured on: checkable later
        report["model_weights_sha256"] = weights_fingerprint(source)
    md = write_report(report, args.out or args.root)
    print(md, end="")
    return 0


def add_probe_arguments(parser) -> None:
    """`saes probe`: the model and the fresh generations its blocks are probed on."""
    parser.add_argument("--model", default="toy", help="toy, a saved pipeline directory (e.g. a recipe run's), ...")
    parser.add_argument("--images", type=int, default=300, help="fresh shapes-world generations")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    parser.add_argument("--guidance", type=float, default=None, help="classifier-free guidance (default: the model's)")
    parser.add_argument("--world-seed", type=int, default=2, help="seed of the fresh captions")
    parser.add_argument("--seed", type=int, default=100_000, help="image i is generated with seed + i")
    parser.add_argument("--ablate-images", type=at_least(0), default=200,
                        help="generations with each block ablated in turn, read by the probe (0: none)")
    add_dtype_argument(parser, default=None)
    parser.add_argument("--threads", type=at_least(1), default=1)
    add_out_argument(parser, required=True, help="directory for probes.json and PROBES.md")


def probe_command(args) -> int:
    from interp.atomic import atomic_write_text

    from .strict_json import write_json

    model = load_model(args)
    probes = probe_blocks(model, n_images=args.images, world_seed=args.world_seed, seed=args.seed,
                          ablate_images=args.ablate_images)
    md = probe_markdown(probes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "probes.json", probes, indent=2)
    atomic_write_text(out / "PROBES.md", md)
    print(md, end="")
    return 0

"""Splice-in fidelity: does the image survive when a block's update is replaced by the SAE's
reconstruction of it?

For each prompt the image is generated four ways with the same seed:

    original            no intervention
    splice              the block's update replaced by decode(encode(update))   (Edit mode "splice", keep_error=False)
    splice_with_error   the same plus the SAE's error (update - reconstruction) (keep_error=True: equal to the
                        original up to float error; checks that the splice path itself changes nothing)
    ablate              the block writes nothing (the reference for "no information from this block")

and compared with the original: mean absolute pixel difference (0-255), root mean square
difference and PSNR. When every prompt is a caption of a world with ground truth (the shapes world:
`interp.ground_truth.ground_truth_of`), each image is also read by the world's probe (`probe().score` against
the prompt's scene), giving each variant's attribute accuracy beside the original's.
"""

from __future__ import annotations

import math

import numpy as np
import torch

VARIANTS = ("original", "splice", "splice_with_error", "ablate")


def probe_attributes(truth) -> tuple[str, ...]:
    """What the world's probe scores an image on, in the order of the tables: every object attribute and the
    background at once ("all"), the background, then each object attribute (`GroundTruth.object_attributes`)."""
    return ("all", "background", *truth.object_attributes)


def _images(model, prompts, seeds, steps, guidance) -> np.ndarray:
    from interp.hooks import generate

    array = generate(model, prompts, steps=steps, seed=seeds, guidance=guidance, output_type="np")
    return np.clip(np.rint(np.asarray(array) * 255), 0, 255).astype(np.uint8)


def _world_scenes(prompts: list[str]) -> tuple[object, list] | None:
    """(the world's ground truth, the scene of every prompt), or None when any prompt is outside every world."""
    from interp.ground_truth import ground_truth_of

    truth = ground_truth_of(prompts)
    scenes = truth.scenes(prompts) if truth is not None else None
    if scenes is None or any(scene is None for scene in scenes):
        return None
    return truth, scenes


def _compare_variants(model, edits: dict, prompts: list[str], seeds: list[int], steps, guidance, batch_size: int,
                      saes: dict | None, world, desc: str, progress: bool) -> tuple[dict, dict]:
    """Generate `prompts` unedited ("original") and under each named list of edits, with the same seeds.
    Returns (per variant the RMS pixel distance to the original of every image, per variant and attribute the
    world's probe score of every image, or {} without a world)."""
    from tqdm import tqdm

    from interp.hooks import apply_edits

    reader, scenes = (world[0].probe(), world[1]) if world is not None else (None, None)
    attributes = probe_attributes(world[0]) if world is not None else ()
    distances = {name: {"pixel_mae": [], "pixel_rmse": []} for name in edits}
    scores = {name: {a: [] for a in attributes} for name in ["original", *edits]} if reader else {}
    for start in tqdm(range(0, len(prompts), batch_size), desc=desc, unit="batch", disable=not progress):
        chunk, chunk_seeds = prompts[start:start + batch_size], seeds[start:start + batch_size]
        generated = {"original": _images(model, chunk, chunk_seeds, steps, guidance)}
        original = generated["original"].astype(np.float64)
        for name, variant_edits in edits.items():
            with apply_edits(model, variant_edits, saes=saes):
                generated[name] = _images(model, chunk, chunk_seeds, steps, guidance)
            diff = generated[name].astype(np.float64) - original
            distances[name]["pixel_mae"] += np.abs(diff).mean(axis=(1, 2, 3)).tolist()
            distances[name]["pixel_rmse"] += np.sqrt((diff ** 2).mean(axis=(1, 2, 3))).tolist()
        if reader is not None:
            for name, images in generated.items():
                for image, scene in zip(images, scenes[start:start + batch_size]):
                    score = reader.score(image, scene)
                    for attribute in attributes:
                        scores[name][attribute].append(score[attribute])
    return distances, scores


def _check_seeds(prompts: list[str], seeds: list[int] | None) -> list[int]:
    seeds = list(range(len(prompts))) if seeds is None else list(seeds)
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
    return seeds


@torch.no_grad()
def splice_fidelity(model, sae, block: str, prompts: list[str], seeds: list[int] | None = None,
                    steps: int | None = None, guidance: float | None = None, batch_size: int = 16,
                    probe: bool | None = None, progress: bool = False) -> dict:
    """Generate `prompts` as original, spliced (with and without the error term) and ablated.

    probe: score attributes with the world's probe (default: when every prompt is a caption of a world with
    ground truth, the shapes world's for the toy). Returns JSON data: per variant the pixel distances to the
    original (mean over images) and, with the probe, attribute accuracy (mean over images).
    """
    from interp.edits import Edit

    if not prompts:
        raise ValueError("splice fidelity needs at least one prompt")
    seeds = _check_seeds(prompts, seeds)
    world = _world_scenes(prompts) if probe in (None, True) else None
    if probe and world is None:
        raise ValueError("the probe reads only captions of the shapes world; some prompts are not")
    edits = {"splice": [Edit(block=block, mode="splice", keep_error=False)],
             "splice_with_error": [Edit(block=block, mode="splice", keep_error=True)],
             "ablate": [Edit(block=block, mode="ablate")]}
    distances, scores = _compare_variants(model, edits, prompts, seeds, steps, guidance, batch_size, {block: sae},
                                          world, f"splice fidelity {block}", progress)
    result = {"block": block, "n_images": len(prompts), "probe": world is not None, "variants": {}}
    for variant in VARIANTS:
        entry = {}
        if variant != "original":
            mae, rmse = float(np.mean(distances[variant]["pixel_mae"])), float(np.mean(distances[variant]["pixel_rmse"]))
            entry.update(pixel_mae=mae, pixel_rmse=rmse, psnr=_psnr(rmse))
        if world is not None:
            entry["probe_accuracy"] = {a: float(np.mean(v)) for a, v in scores[variant].items()}
        result["variants"][variant] = entry
    return result


@torch.no_grad()
def block_ablations(model, blocks: list[str], prompts: list[str], seeds: list[int] | None = None,
                    steps: int | None = None, guidance: float | None = None, batch_size: int = 50,
                    progress: bool = False) -> dict:
    """What the image needs from each block: generate `prompts` with each of `blocks` ablated in turn (it writes
    nothing, Edit mode "ablate", no SAE) and read every image with its world's probe against the prompt's scene.

    Returns JSON data: the unedited images' probe accuracy per attribute (`original`) and per block the ablated
    images' accuracy, the drop from the original per attribute and the pixel distance to the original. A block
    *carries* an attribute when ablating it makes the probe misread it; accuracy is over every object (and the
    background), so a drop of 0.5 means half of them changed. Only captions of a world with ground truth."""
    from interp.edits import Edit

    if not prompts or not blocks:
        raise ValueError("block ablations need at least one prompt and one block")
    seeds = _check_seeds(prompts, seeds)
    world = _world_scenes(prompts)
    if world is None:
        raise ValueError("block ablations are read by a world's probe; some prompts are not captions of one")
    edits = {block: [Edit(block=block, mode="ablate")] for block in blocks}
    distances, scores = _compare_variants(model, edits, prompts, seeds, steps, guidance, batch_size, None, world,
                                          "block ablations", progress)
    accuracy = {name: {a: float(np.mean(v)) for a, v in by.items()} for name, by in scores.items()}
    original = accuracy.pop("original")
    result = {"n_images": len(prompts), "original": original, "blocks": {}}
    for block in blocks:
        rmse = float(np.mean(distances[block]["pixel_rmse"]))
        result["blocks"][block] = {"probe_accuracy": accuracy[block],
                                   "drop": {a: original[a] - accuracy[block][a] for a in original},
                                   "pixel_rmse": rmse, "psnr": _psnr(rmse)}
    return result


def ablation_table(ablations: dict, carried_drop: float = 0.2) -> str:
    """Markdown: per block the probe's accuracy with the block ablated (bold: a drop of at least `carried_drop`
    from the unedited images, the first row), PSNR to the unedited images, and the attributes it carries."""
    original = ablations["original"]
    attributes = [a for a in original if a != "all"]  # the world's (`probe_attributes`), as measured
    lines = ["| block ablated | " + " | ".join(attributes) + " | all | PSNR (dB) | carries |",
             "|---|" + "---:|" * (len(attributes) + 2) + "---|",
             "| (none) | " + " | ".join(f"{original[a]:.2f}" for a in attributes) + f" | {original['all']:.2f} | - | - |"]
    for block, entry in ablations["blocks"].items():
        acc, drop = entry["probe_accuracy"], entry["drop"]
        cells = [("**{:.2f}**" if drop[a] >= carried_drop else "{:.2f}").format(acc[a]) for a in attributes]
        carried = [a for a in attributes if drop[a] >= carried_drop]
        psnr = "inf" if entry["psnr"] is None else f"{entry['psnr']:.1f}"
        lines.append(f"| {block} | " + " | ".join(cells) + f" | {acc['all']:.2f} | {psnr} | "
                     + (", ".join(carried) or "nothing") + " |")
    return "\n".join(lines) + "\n"


def _psnr(rmse: float) -> float | None:
    """Peak signal-to-noise ratio in dB (None for identical images: infinite)."""
    return None if rmse == 0 else 20 * math.log10(255.0 / rmse)


def fidelity_table(results: dict[str, dict]) -> str:
    """name (block) -> splice_fidelity result -> markdown table, one row per block and variant."""
    probe = any(r["probe"] for r in results.values())
    header = "| block | variant | pixel MAE | PSNR (dB) |"
    rule = "|---|---|---:|---:|"
    if probe:  # the world's probe attributes (`probe_attributes`), as measured
        attributes = next(list(r["variants"]["original"]["probe_accuracy"]) for r in results.values() if r["probe"])
        header += " probe " + " | ".join(attributes) + " |"
        rule += "---:|" * len(attributes)
    lines = [header, rule]
    for name, result in results.items():
        for variant in VARIANTS:
            entry = result["variants"][variant]
            mae = f"{entry['pixel_mae']:.2f}" if "pixel_mae" in entry else "-"
            psnr = "-" if "pixel_mae" not in entry else ("inf" if entry["psnr"] is None else f"{entry['psnr']:.1f}")
            row = f"| {name} | {variant} | {mae} | {psnr} |"
            if probe:
                acc = entry.get("probe_accuracy")
                row += "".join(f" {acc[a]:.3f} |" if acc else " - |" for a in attributes)
            lines.append(row)
    return "\n".join(lines) + "\n"

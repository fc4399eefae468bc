"""Feature analysis, the `saes features` command's work: each block's SAE analysed on one image pool
(`saes.pool`), its feature cards labelled against the pool's world (`saes.probes.analyse_block`), and the files.

Written as `features.json` beside the SAE (the web UI and `saes.library` read it), the
image pool as `analysis_images.npz` + `analysis_prompts.json` in the parent directory (one
pool shared by every block of a model), and an HTML page of feature cards (`saes.render`) plus a JSON
summary (per attribute value: the best feature and its AUROC, per block).

Cards point into the pool by image index, so a card file records the pool's fingerprint
(`saes.pool.pool_fingerprint`, a hash of its images and prompts) and `saes.library` refuses cards whose
pool has changed since. A new pool is not written where it would leave other blocks' cards
pointing into a pool that is gone, and nothing shipped with the repository (the SAEs under
`saes/pretrained/`, the models under `zoo/weights/`) is rewritten unless asked to.
"""

from __future__ import annotations

import os
from pathlib import Path

from interp.atomic import atomic_write_text
from interp.shipped import refuse_shipped

from .pool import FEATURES_FILENAME, AnalysisPool, orphaned_cards, pool_fingerprint, write_pool
from .probes import AnalysisConfig, analyse_block, check_block_grid
from .render import render_html
from .sae import SAE
from .strict_json import write_json

SUMMARY_FILENAME = "features_summary.json"
HTML_FILENAME = "features.html"
# How to analyse shipped SAEs without rewriting them.
ANALYSE_ELSEWHERE = ("copy the SAEs out first (e.g. cp -r saes/pretrained/toy runs/toy-saes) and analyse the copies, "
                     "with --out and --pool-dir outside the shipped directories")


class FeaturesError(ValueError):
    """Feature cards or an image pool that cannot be written where asked, and what to do instead."""


# ----------------------------------------------------------------------------- files

def write_features(sae_dir: str | os.PathLike, block: str, model_name: str, n_images: int,
                   cards: list[dict], pool_sha256: str) -> Path:
    """features.json beside the SAE, in the format `saes.library.FeatureLibrary` reads, with the
    fingerprint of the pool its image indices point into."""
    path = Path(sae_dir) / FEATURES_FILENAME
    payload = {"block": block, "model": model_name, "n_images": int(n_images), "pool_sha256": pool_sha256,
               "features": cards}
    write_json(path, payload, separators=(",", ":"))
    return path


def _round_heatmaps(cards: list[dict], digits: int = 3) -> list[dict]:
    """Heatmaps rounded (features.json stays small; three digits are plenty to draw them)."""
    for card in cards:
        for top in card["top_images"]:
            top["heatmap"] = [[round(v, digits) if v else 0 for v in row] for row in top["heatmap"]]
    return cards


# ----------------------------------------------------------------------------- the whole command

def default_pool_dir(sae_dirs) -> Path:
    """Where the pool goes unless told: the parent of the first SAE (one pool for a model's blocks)."""
    return Path(next(iter(sae_dirs))).parent


def analyse(saes: dict[str, tuple[SAE, Path]], pool: AnalysisPool, model_name: str, out_dir: str | os.PathLike,
            config: AnalysisConfig | None = None, pool_dir: str | os.PathLike | None = None,
            overwrite: bool = False) -> dict:
    """Analyse each block's SAE on the pool; write features.json beside each SAE, the pool in
    `pool_dir` (default: the parent of the first SAE), the HTML page and summary in `out_dir`.

    Unless `overwrite`, nothing shipped with the repository is written and a pool is not replaced
    while other blocks' cards point into it (FeaturesError, before anything is written).
    saes: block -> (SAE, its directory). Returns the summary written to out_dir.
    """
    config = config or AnalysisConfig()
    out_dir = Path(out_dir)
    pool_dir = Path(pool_dir) if pool_dir is not None else default_pool_dir(d for _, d in saes.values())
    fingerprint = pool_fingerprint(pool.images, pool.prompts)
    if not overwrite:
        refuse_shipped([d for _, d in saes.values()] + [pool_dir, out_dir], "saes features", ANALYSE_ELSEWHERE)
        orphaned = orphaned_cards(pool_dir, {Path(d).resolve() for _, d in saes.values()}, fingerprint)
        if orphaned:
            raise FeaturesError(f"writing a new image pool to {pool_dir} would leave the cards of other blocks "
                                f"({', '.join(orphaned)}) pointing into a pool that is gone; analyse those blocks "
                                f"in the same run, choose another --pool-dir, or pass --overwrite")
    truth = pool.truth()
    scenes = truth.scenes(pool.prompts) if truth is not None else None
    if scenes is not None:  # cards label features by the world's cells: a block too coarse for them is refused
        for block in saes:
            check_block_grid(block, *pool.updates[block].shape[-2:], truth)
    out_dir.mkdir(parents=True, exist_ok=True)
    results, summaries = {}, {}
    for block, (sae, sae_dir) in saes.items():
        cards, summary = analyse_block(sae, pool.updates[block], scenes, config, truth=truth)
        _round_heatmaps(cards)
        write_features(sae_dir, block, model_name, len(pool.images), cards, fingerprint)
        results[block], summaries[block] = cards, summary
    write_pool(pool, pool_dir)
    summary = {
        "model": model_name, "n_images": len(pool.images), "labelled": scenes is not None,
        "config": config.to_dict(),
        "blocks": {block: {"features": len(cards), "live_features": sum(c["frequency"] > 0 for c in cards),
                           "labelled_features": sum(c["label"] is not None for c in cards),
                           "attribute_values": summaries[block]}
                   for block, cards in results.items()},
        "best_block": best_blocks(summaries),
    }
    write_json(out_dir / SUMMARY_FILENAME, summary, indent=2)
    atomic_write_text(out_dir / HTML_FILENAME, render_html(results, pool.images, pool.prompts, model_name,
                                                            summaries, config))
    return summary


def best_blocks(summaries: dict[str, dict]) -> dict[str, dict]:
    """Per attribute value: the block (and feature) whose best feature predicts it best."""
    best = {}
    for block, summary in summaries.items():
        for label, entry in summary.items():
            if label not in best or entry["best_auroc"] > best[label]["auroc"]:
                best[label] = {"block": block, "feature": entry["best_feature"], "auroc": entry["best_auroc"]}
    return best

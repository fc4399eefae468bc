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
from interp.cli import MIXED_DEFAULT, add_backend_argument, add_dtype_argument, add_out_argument, at_least, probability
from interp.shipped import refuse_shipped

from .pool import (FEATURES_FILENAME, AnalysisPool, load_model, model_block, orphaned_cards, pool_fingerprint,
                   write_pool)
from .probes import AnalysisConfig, analyse_block, check_block_grid
from .render import render_html
from .sae import CFG_FILENAME, SAE
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


STORE_POOL_IMAGES = 400  # `saes features --store` without --images: the pool's size


def sae_dirs(paths: list[str]) -> list[Path]:
    """SAE directories: each path is one (cfg.json inside) or holds one per block."""
    dirs = []
    for path in map(Path, paths):
        if (path / CFG_FILENAME).is_file():
            dirs.append(path)
        elif path.is_dir() and any(path.glob(f"*/{CFG_FILENAME}")):
            dirs.extend(sorted(p.parent for p in path.glob(f"*/{CFG_FILENAME}")))
        else:
            raise ValueError(f"{path} is not an SAE directory (no {CFG_FILENAME}) nor a directory of them")
    return dirs


def add_features_arguments(parser) -> None:
    """`saes features`: the SAEs, the analysis images (a store or --world N generations), the cards' options, and
    for a language model's SAEs the --text corpus."""
    parser.add_argument("--model", default="toy", help="the model the SAEs belong to (images are generated with it)")
    parser.add_argument("--sae", required=True, nargs="+",
                        help="SAE directories, or a directory with one SAE per block (e.g. saes/pretrained/toy)")
    parser.add_argument("--store", default=None, help="analyse the first --images images of this activation store")
    parser.add_argument("--world", type=int, default=None, metavar="N", help="analyse N fresh shapes-world images")
    parser.add_argument("--world-seed", type=int, default=1, help="seed of the --world captions")
    parser.add_argument("--seed", type=int, default=0, help="image i is generated with seed + i (--world)")
    parser.add_argument("--images", type=at_least(1), default=None,
                        help=f"with --store: how many of its images (default: {STORE_POOL_IMAGES}, or all it holds if "
                             f"fewer)")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    parser.add_argument("--guidance", type=float, default=None, help="classifier-free guidance (default: the model's)")
    parser.add_argument("--top", type=int, default=6, help="top-activating images per feature")
    parser.add_argument("--label-min-auroc", type=probability, default=0.7, help="AUROC a label needs (0 to 1)")
    parser.add_argument("--pool-dir", default=None, help="where the image pool goes (default: parent of the first SAE)")
    parser.add_argument("--model-name", default=None, help="the model's name in features.json (default: --model)")
    parser.add_argument("--overwrite", action="store_true",
                        help="rewrite files shipped with the repository (saes/pretrained/...) and replace an image "
                             "pool that other blocks' cards point into; without it either is an error")
    add_dtype_argument(parser, default=None, said=MIXED_DEFAULT)
    parser.add_argument("--threads", type=at_least(1), default=1)
    add_out_argument(parser, default=None, help="directory for features.html and features_summary.json (LM "
                                                    "SAEs: for features.json and features.html; default: the SAE's)")
    parser.add_argument("--text", default=None, help="SAEs on a language model's residual stream: the corpus (JSONL "
                                                     "with Dolly's or text fields, or plain text lines)")
    parser.add_argument("--tokens", type=at_least(1), default=20_000, help="--text: corpus tokens analysed")
    add_backend_argument(parser, what="--text: ")


def image_features_command(args) -> int:
    """`saes features` for SAEs on a text-to-image model's blocks: cards over an image pool (`saes.lm_features`'
    `features_command` sends a language model's SAEs to `lm_features_command`)."""
    from .pool import generate_pool, store_pool
    from .sae import check_sae_model

    if args.out is None:
        raise ValueError("give --out DIR, where features.html and features_summary.json go")
    if (args.store is None) == (args.world is None):
        raise ValueError("give exactly one source of analysis images: --store DIR or --world N")
    if args.world is not None and args.world < 1:
        raise ValueError("the number of analysis images must be at least 1")
    if args.top < 1:
        raise ValueError("--top must be at least 1")
    directories = sae_dirs(args.sae)
    if not args.overwrite:  # before any image is generated; analyse checks the rest before writing
        refuse_shipped(directories + [args.pool_dir or default_pool_dir(directories), args.out], "saes features",
                       ANALYSE_ELSEWHERE)
    model = load_model(args)
    saes = {}
    for directory in directories:
        sae = SAE.load(directory)
        check_sae_model({directory.name: sae}, args.model, directory)  # cards of toy-v2's SAEs on toy mean nothing
        block = sae.cfg.metadata.get("hook_name") or directory.name
        block = model_block(model, block)
        if sae.cfg.d_in != model.blocks[block].channels:
            raise ValueError(f"the SAE in {directory} reads {sae.cfg.d_in} channels but {block} has "
                             f"{model.blocks[block].channels}")
        if block in saes:
            raise ValueError(f"two SAEs given for {block}: {saes[block][1]} and {directory}")
        saes[block] = (sae, directory)
    if args.store is not None:
        from interp.store import ActivationStore

        store = ActivationStore(args.store)
        missing = [b for b in saes if b not in store.blocks]
        if missing:
            raise ValueError(f"the store at {args.store} lacks {', '.join(missing)}; it has: {', '.join(store.blocks)}")
        if args.images is not None and args.images > len(store):
            raise ValueError(f"--images {args.images}: the store at {args.store} holds {len(store)} images; "
                             f"give at most {len(store)}")
        pool = store_pool(model, store, list(saes), args.images or min(STORE_POOL_IMAGES, len(store)))
    else:
        from interp.ground_truth import world

        for block in saes:  # the cards label by the world's cells: a block too coarse for them, before any image
            check_block_grid(block, model.blocks[block].height, model.blocks[block].width, world("shapes"))
        prompts = world("shapes").prompts(args.world, args.world_seed)  # --world N: the shapes world's captions
        pool = generate_pool(model, list(saes), prompts, [args.seed + i for i in range(args.world)],
                             steps=args.steps)
    config = AnalysisConfig(n_top_images=args.top, label_min_auroc=args.label_min_auroc)
    summary = analyse(saes, pool, args.model_name or args.model, args.out, config, pool_dir=args.pool_dir,
                      overwrite=args.overwrite)
    for block, entry in summary["blocks"].items():
        print(f"{block}: {entry['live_features']} of {entry['features']} features fire on the pool, "
              f"{entry['labelled_features']} labelled (AUROC >= {args.label_min_auroc})")
    print(f"wrote features.json beside each SAE, the image pool, {Path(args.out) / 'features.html'} and "
          f"{Path(args.out) / 'features_summary.json'}")
    return 0

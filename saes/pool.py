"""The image pool feature cards point into: the analysed images, their prompts and seeds, and the analysed
blocks' updates at the last denoising step (`AnalysisPool`), generated (`generate_pool`) or read from an activation
store (`store_pool`).

On disk the pool is `analysis_images.npz` + `analysis_prompts.json` in the directory above the SAEs (one pool
shared by every block of a model), and each block's cards (`features.json`, `saes.features`) point into it by
image index. So a card file records the pool's fingerprint (`pool_fingerprint`, a hash of its images and prompts),
`cards_match_pool` checks one against a pool (`saes.library` refuses cards whose pool has changed since), and
`orphaned_cards` finds the cards a new pool would leave pointing into one that is gone.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from interp.atomic import atomic_write
from interp.cli import parse_dtype

from .strict_json import dumps, write_json

FEATURES_FILENAME = "features.json"
IMAGES_FILENAME = "analysis_images.npz"
PROMPTS_FILENAME = "analysis_prompts.json"
SEEDS_FILENAME = "analysis_seeds.json"  # image i's generation seed (pools written before it recorded none)


@dataclass
class AnalysisPool:
    """Images and the updates of the analysed blocks at the last denoising step."""

    images: np.ndarray                 # (N, H, W, 3) uint8
    prompts: list[str]
    seeds: list[int]
    updates: dict[str, torch.Tensor]   # block -> (N, channels, height, width) float32

    def truth(self):
        """The world its prompts are captions of (`interp.ground_truth.ground_truth_of`), or None (a real
        model's prompts)."""
        from interp.ground_truth import ground_truth_of

        return ground_truth_of(self.prompts)

    def scenes(self) -> list | None:
        """The scene of each prompt in the world its prompts are captions of (`truth`; None where a prompt is
        outside it); None when no prompt is of a world with ground truth (a real model's prompts): the cards
        then get statistics and no labels."""
        truth = self.truth()
        return truth.scenes(self.prompts) if truth is not None else None


def generate_pool(model, blocks: list[str], prompts: list[str], seeds: list[int], steps: int | None = None,
                  guidance: float | None = None, batch_size: int = 16, progress: bool = True) -> AnalysisPool:
    """Generate the pool's images while capturing the blocks' updates (last step kept)."""
    from tqdm import tqdm

    from interp.hooks import capture_updates, generate

    images, updates = [], {b: [] for b in blocks}
    for start in tqdm(range(0, len(prompts), batch_size), desc="analysis images", unit="batch",
                      disable=not progress):
        chunk, chunk_seeds = prompts[start:start + batch_size], seeds[start:start + batch_size]
        with capture_updates(model, blocks, device="cpu", dtype=torch.float32) as cap:
            array = generate(model, chunk, steps=steps, seed=chunk_seeds, guidance=guidance, output_type="np")
        images.append(np.clip(np.rint(np.asarray(array) * 255), 0, 255).astype(np.uint8))
        for block in blocks:
            updates[block].append(cap.updates(block)[-1])
    return AnalysisPool(np.concatenate(images), list(prompts), list(seeds),
                        {b: torch.cat(v) for b, v in updates.items()})


def store_pool(model, store, blocks: list[str], n_images: int, batch_size: int = 16,
               progress: bool = True) -> AnalysisPool:
    """The first n images of an activation store: updates read from the store, images
    regenerated from its prompts and seeds (the store keeps no pixels)."""
    from tqdm import tqdm

    from interp.hooks import generate

    n = min(n_images, len(store))
    plan = store.manifest
    prompts, seeds = store.prompts[:n], list(plan["seeds"][:n])
    images = []
    for start in tqdm(range(0, n, batch_size), desc="analysis images", unit="batch", disable=not progress):
        array = generate(model, prompts[start:start + batch_size], steps=plan["steps"],
                         seed=seeds[start:start + batch_size], guidance=plan["guidance"], output_type="np")
        images.append(np.clip(np.rint(np.asarray(array) * 255), 0, 255).astype(np.uint8))
    updates = {b: torch.stack([store.image(i, b)[-1] for i in range(n)]) for b in blocks}
    return AnalysisPool(np.concatenate(images), prompts, seeds, updates)


# ----------------------------------------------------------------------------- files

def pool_fingerprint(images: np.ndarray, prompts: list[str]) -> str:
    """sha256 of a pool's images (shape and pixels) and prompts: what its cards' image indices refer to."""
    images = np.ascontiguousarray(images, dtype=np.uint8)
    digest = hashlib.sha256(dumps([list(images.shape), list(prompts)]).encode())
    digest.update(images.data)
    return digest.hexdigest()


def write_pool(pool: AnalysisPool, directory: str | os.PathLike) -> None:
    """analysis_images.npz (key "images", (N, H, W, 3) uint8, compressed) + analysis_prompts.json +
    analysis_seeds.json."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    def save_images(tmp: str) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to the temporary name
            np.savez_compressed(f, images=pool.images)

    atomic_write(directory / IMAGES_FILENAME, save_images)
    write_json(directory / PROMPTS_FILENAME, pool.prompts)
    write_json(directory / SEEDS_FILENAME, [int(s) for s in pool.seeds])


def load_pool_seeds(root: str | Path) -> list[int] | None:
    """Each pool image's seed, or None for a pool written before pools recorded them."""
    path = Path(root) / SEEDS_FILENAME
    return json.loads(path.read_text()) if path.is_file() else None


def load_analysis_images(root: str | Path) -> tuple[np.ndarray, list[str]] | None:
    """The pool of analysed images that feature cards point into: (N, H, W, 3) uint8 and prompts."""
    root = Path(root)
    if not (root / IMAGES_FILENAME).exists():
        return None
    with np.load(root / IMAGES_FILENAME) as data:
        images = data["images"]
    prompts = json.loads((root / PROMPTS_FILENAME).read_text())
    return images, prompts


def cards_match_pool(cards: dict, fingerprint: str, n_images: int) -> bool:
    """Whether a card file (the content of features.json) points into the pool of this fingerprint and size.

    Cards written before card files recorded their pool's fingerprint are checked by size: made on a
    pool of `n_images` images, with every top image one of them."""
    if "pool_sha256" in cards:
        return cards["pool_sha256"] == fingerprint
    return cards.get("n_images") == n_images and all(
        0 <= top["index"] < n_images for card in cards["features"] for top in card.get("top_images", []))


def orphaned_cards(pool_dir: Path, blocks_written: set[Path], new_fingerprint: str) -> list[str]:
    """Card files beside the pool in `pool_dir`, of blocks this analysis does not rewrite, that point into
    the pool there now: writing a different pool over it would leave their image indices pointing
    at other images (or past the end)."""
    pool = load_analysis_images(pool_dir)
    if pool is None:
        return []
    images, prompts = pool
    current = pool_fingerprint(images, prompts)
    if current == new_fingerprint:
        return []
    orphaned = []
    for cards_path in sorted(pool_dir.glob(f"*/{FEATURES_FILENAME}")):
        if cards_path.parent.resolve() in blocks_written:
            continue
        if cards_match_pool(json.loads(cards_path.read_text()), current, len(images)):
            orphaned.append(str(cards_path))
    return orphaned


def load_model(args):
    """The text-to-image model a `saes` command generates with: --model in --dtype (on --device), torch using
    --threads, and --steps / --guidance as its defaults."""
    from interp.models import load_t2i

    torch.set_num_threads(args.threads)
    model = load_t2i(args.model, device=getattr(args, "device", None), dtype=parse_dtype(getattr(args, "dtype", None)))
    # --steps / --guidance replace the model's defaults for every generation of the command
    # (a pipeline outside the known names defaults to its pipeline class's own steps and guidance).
    if getattr(args, "steps", None) is not None:
        model.check_request(args.steps)
        model.default_steps = args.steps
    if getattr(args, "guidance", None) is not None:
        model.default_guidance = float(args.guidance)
    return model


def model_block(model, block: str) -> str:
    """The block's name in the model (`unet.` prefix dropped), or a clear error."""
    name = block[len("unet."):] if block.startswith("unet.") else block
    if name in getattr(model, "text_sites", {}):
        raise ValueError(f"{name} is a text stream (tokens, no image grid): feature cards, heatmaps and splice "
                         f"fidelity read a block's image grid; train and evaluate its SAE on a store "
                         f"(saes train / saes eval --store)")
    if name not in model.blocks:
        raise ValueError(f"{model.name} has no block {block!r}; its blocks are: {', '.join(model.blocks)}")
    return name

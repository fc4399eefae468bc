"""The text-to-image models known by name: their registry entries (`KnownModel`: where they load from, the steps and
guidance they sample with, the blocks they are analysed at, the world they were made in), and what is known of a
pipeline directory the toy's recipe saved or of a Hugging Face cache snapshot of a known model.

Nothing here imports torch or diffusers: `interp.models.spec.model_spec` reads it to make a model's spec (its kind,
source, entry and defaults) before anything is loaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..embedded import weights_dir

SDXL_BLOCKS = ("down_blocks.2.attentions.1", "mid_block.attentions.0",
               "up_blocks.0.attentions.0", "up_blocks.0.attentions.1")
# The embedded models lay out their scene in SDXL's four blocks but v1 draws an object's shape and colour one
# level up, at 16 x 16 (the linear probes and ablations: saes/pretrained/toy/REPORT.md, README): their SAEs and
# edits cover both sets.
TOY_BLOCKS = SDXL_BLOCKS + ("up_blocks.1.attentions.1", "up_blocks.1.attentions.2")


@dataclass(frozen=True)
class KnownModel:
    location: str  # a hub repository id or a directory; embedded: a folder of the registered weights directory
    default_steps: int
    default_guidance: float
    embedded: bool = False
    blocks: tuple[str, ...] = SDXL_BLOCKS  # analysed by default: SAEs trained, edits applied, features shown
    world: str | None = None  # the world whose ground truth it was made in (`interp.ground_truth.WORLDS`)

    @property
    def source(self) -> str:
        """What loads it: the hub id or directory; an embedded model's folder in the weights directory `zoo`
        registers (`interp.embedded.weights_dir`: one line when nothing registered it)."""
        return str(weights_dir() / self.location) if self.embedded else self.location


KNOWN_MODELS = {
    "toy": KnownModel("t2i", 1, 0.0, embedded=True, blocks=TOY_BLOCKS, world="shapes"),
    # v2 (issue 22): SDXL's proportions, most transformer layers at 8 x 8 (`--config sdxl-proportions`)
    "toy-v2": KnownModel("t2i-v2", 1, 0.0, embedded=True, blocks=TOY_BLOCKS, world="shapes"),
    # v3 (issue 22): v2 with transformer blocks only at 8 x 8 (`--config sdxl-blocks-only`), so SDXL's four
    "toy-v3": KnownModel("t2i-v3", 1, 0.0, embedded=True, blocks=SDXL_BLOCKS, world="shapes"),
    # v4 (issue 22): v3 trained with the pooled prompt embedding zero (`--zero-pooled-text`), so the prompt reaches
    # the UNet only through the 8 x 8 cross-attentions
    "toy-v4": KnownModel("t2i-v4", 1, 0.0, embedded=True, blocks=SDXL_BLOCKS, world="shapes"),
    # toy-base (issue 33): v1's sizes trained as SDXL base is (`--objective v_prediction`, prompt dropout), sampled in
    # 30 steps with guidance 5; the toy's VAE, so the two share one latent space (docs/experiments/step-transfer.md)
    "toy-base": KnownModel("t2i-base", 30, 5.0, embedded=True, blocks=TOY_BLOCKS, world="shapes"),
    # toy-turbo (issue 33): the one-step model trained from toy-base's weights (`--init-from`), as SDXL Turbo was
    # distilled from SDXL base: the pair shares a lineage, as the toy and toy-base do not
    "toy-turbo": KnownModel("t2i-turbo", 1, 0.0, embedded=True, blocks=TOY_BLOCKS, world="shapes"),
    "sdxl-turbo": KnownModel("stabilityai/sdxl-turbo", 1, 0.0),
    "sdxl-base": KnownModel("stabilityai/stable-diffusion-xl-base-1.0", 30, 5.0),
}

RECIPE_FILE = "recipe.json"  # written by `python -m zoo train t2i` next to the pipeline it saves


def recipe_made(path: str) -> KnownModel | None:
    """A pipeline directory saved by the toy's recipe (a retrained, variant or base toy): the toy's analysed blocks
    and world, and the steps and guidance its recipe.json says it samples with (a `toy-base` trained with
    --objective v_prediction: 30 steps with guidance; a recipe.json without them: the toy's one step, no guidance)."""
    if os.path.isdir(path) and (Path(path) / RECIPE_FILE).exists():
        toy = KNOWN_MODELS["toy"]
        try:
            recipe = json.loads((Path(path) / RECIPE_FILE).read_text())
        except (OSError, ValueError):
            recipe = {}
        config = recipe.get("config", recipe) if isinstance(recipe, dict) else {}
        steps = config.get("sampling_steps", toy.default_steps) if isinstance(config, dict) else toy.default_steps
        guidance = config.get("guidance", toy.default_guidance) if isinstance(config, dict) else toy.default_guidance
        return KnownModel(path, int(steps), float(guidance), blocks=toy.blocks, world=toy.world)
    return None


def known_model(name_or_path: str) -> KnownModel | None:
    """What is known of a model by its name, or of a pipeline directory the toy's recipe saved; None otherwise."""
    return KNOWN_MODELS.get(name_or_path) or recipe_made(name_or_path)


def default_blocks(name_or_path: str) -> tuple[str, ...]:
    """The blocks a model is analysed at by default (SDXL's four for any model not known by name)."""
    known = known_model(name_or_path)
    return known.blocks if known else SDXL_BLOCKS

class ModelError(ValueError):
    """A model that cannot be loaded or a request it cannot serve, with what to do about it."""


def registry_entry(source: str) -> KnownModel | None:
    """The KNOWN_MODELS entry of a hub repository id given as such (`stabilityai/sdxl-turbo`), or of a Hugging Face
    cache snapshot of it (`.../models--stabilityai--sdxl-turbo/snapshots/<commit>`: the cache's own layout)."""
    repo = source
    parts = Path(source).parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        repo = parts[-3][len("models--"):].replace("--", "/")
    return next((m for m in KNOWN_MODELS.values() if not m.embedded and m.source == repo), None)


__all__ = ["KNOWN_MODELS", "RECIPE_FILE", "SDXL_BLOCKS", "TOY_BLOCKS", "KnownModel", "ModelError", "default_blocks",
           "known_model", "recipe_made", "registry_entry"]

"""A model's trained SAEs and their feature cards, ready for exploring and painting.

Layout on disk (one directory per hooked block, named by the block):

    ROOT/<block>/cfg.json, sae_weights.safetensors   the SAE (sae-lens format)
    ROOT/<block>/features.json                        feature cards (`python -m saes features`)
    ROOT/analysis_images.npz, analysis_prompts.json   the image pool the cards' top images point into

`FeatureLibrary.for_model("toy")` opens the SAEs shipped for the embedded model. Cards are
checked against the pool when they are loaded: a card file made on another pool is an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .pool import FEATURES_FILENAME, IMAGES_FILENAME, cards_match_pool, load_analysis_images, pool_fingerprint
from .sae import CFG_FILENAME, SAE, SAEFormatError, load_sae_set

PRETRAINED_DIR = Path(__file__).resolve().parent / "pretrained"


class LibraryError(ValueError):
    """A block, feature or request the library cannot serve, with the valid choices."""


@dataclass
class PaintResult:
    original: np.ndarray  # (H, W, 3) uint8
    edited: np.ndarray    # (H, W, 3) uint8
    difference: np.ndarray  # (H, W, 3) uint8, |edited - original| amplified for display
    edit: dict            # the Edit that produced it, as JSON data


class FeatureLibrary:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        try:
            self._saes = load_sae_set(self.root)
        except SAEFormatError as err:
            raise LibraryError(str(err)) from None
        dirs = [self.root / block for block in self._saes]
        self._cards: dict[str, list[dict]] = {}
        self._causal: dict[str, dict] = {}
        pool = load_analysis_images(self.root)
        fingerprint = pool_fingerprint(*pool) if pool is not None else None
        for d in dirs:
            cards = d / FEATURES_FILENAME
            if not cards.exists():
                continue
            data = json.loads(cards.read_text())
            if pool is not None and not cards_match_pool(data, fingerprint, len(pool[0])):
                raise LibraryError(f"{cards} was made on another image pool than {self.root / IMAGES_FILENAME} "
                                   f"({len(pool[0])} images): its top images would show other pictures; run "
                                   f"`python -m saes features` again on every SAE of {self.root} at once")
            self._cards[d.name] = data["features"]
            self._causal[d.name] = data.get("causal", {})

    @classmethod
    def for_model(cls, model_name: str) -> "FeatureLibrary | None":
        """The SAEs shipped for a model known by name ("toy"); None when there are none."""
        from interp.models.spec import T2I, model_spec

        if not model_name:
            return None
        spec = model_spec(model_name)
        if spec.kind != T2I or spec.source != "embedded":  # a directory, a hub id or a language model: none shipped
            return None
        root = PRETRAINED_DIR / model_name
        return cls(root) if any(root.glob(f"*/{CFG_FILENAME}")) else None

    @property
    def blocks(self) -> list[str]:
        return list(self._saes)

    @property
    def saes(self) -> dict[str, SAE]:
        return dict(self._saes)

    def sae(self, block: str) -> SAE:
        if block not in self._saes:
            raise LibraryError(f"no SAE for block {block!r}; blocks with SAEs: {', '.join(self._saes)}")
        return self._saes[block]

    def n_features(self, block: str) -> int:
        return self.sae(block).cfg.d_sae

    def cards(self, block: str) -> list[dict]:
        """Feature cards of a block (id, frequency, mean_activation, label, auroc, top_images, ...)."""
        self.sae(block)
        return self._cards.get(block, [])

    def causal_config(self, block: str) -> dict:
        """How the causal label scores in a block's cards were measured (`python -m saes causal`: scenes,
        strength, seed, ...); {} when they were not."""
        self.sae(block)
        return self._causal.get(block, {})

    def card(self, block: str, feature: int) -> dict:
        self.check_feature(block, feature)
        cards = self.cards(block)
        if feature < len(cards) and cards[feature]["id"] == feature:
            return cards[feature]
        return next((c for c in cards if c["id"] == feature), {"id": feature})

    def check_feature(self, block: str, feature) -> int:
        n = self.n_features(block)
        if isinstance(feature, float) and feature.is_integer():
            feature = int(feature)
        if not isinstance(feature, (int, np.integer)) or not 0 <= feature < n:
            raise LibraryError(f"feature must be an integer from 0 to {n - 1} for {block}, not {feature!r}")
        return int(feature)

    def mean_activation(self, block: str, feature: int) -> float:
        """Mean activation when the feature fires: the natural unit of edit strength."""
        value = self.card(block, feature).get("mean_activation")
        if value:
            return float(value)
        return float(self.sae(block).W_dec.norm(dim=-1).mean().item())  # no card: one decoder norm

    def search(self, block: str, text: str) -> list[int]:
        """Features whose label contains every word of `text` (case-insensitive), the best painter first.

        A label says what a feature's activation predicts (AUROC), not what adding the feature draws, so
        features whose card has a causal label score (`saes.causal`: how often painting the feature into an
        object makes the probe read the labelled value) come first, highest score first, AUROC breaking ties;
        then features without one, by AUROC."""
        words = text.lower().split()
        hits = [c for c in self.cards(block) if c.get("label") and all(w in c["label"].lower() for w in words)]
        return [c["id"] for c in sorted(hits, key=label_rank)]

    # ----- explaining an image --------------------------------------------------------------
    def top_features(self, updates: dict[str, torch.Tensor], n: int = 8) -> dict[str, list[dict]]:
        """For each block's update (channels, height, width): the n features most specific to this
        image, each with its heatmap (height, width).

        Specific: total activation over positions divided by what the feature gives a typical
        image (frequency x mean activation x positions, from its card), so that dense features
        that fire everywhere do not crowd out the ones this image is about. Without cards: the
        largest total activation."""
        result = {}
        for block, update in updates.items():
            sae = self.sae(block)
            c, h, w = update.shape
            latents = sae.encode(update.reshape(c, h * w).T.to(sae.W_enc.dtype).float())  # (positions, features)
            total = latents.sum(0)
            score = total
            cards = self.cards(block)
            if len(cards) == sae.cfg.d_sae:
                typical = torch.tensor([(c.get("frequency") or 0.0) * (c.get("mean_activation") or 0.0)
                                        for c in cards]) * h * w
                score = total / typical.clamp_min(1e-3 * float(typical.max().clamp_min(1e-6)))
            top = torch.argsort(score, descending=True)[:n]
            result[block] = [
                {"id": int(f), "total": float(total[f]), "max": float(latents[:, f].max()),
                 "label": self.card(block, int(f)).get("label"),
                 "heatmap": latents[:, f].reshape(h, w).tolist()}
                for f in top if total[f] > 0
            ]
        return result

    def by_relevance(self, tops: dict[str, list[dict]]) -> list[tuple[str, dict]]:
        """Every block's top features (`top_features`) in one list, the most telling first, as (block, feature).

        Labelled features come before unlabelled ones; within each, a feature that fires on at most half of
        this image's positions (an object or a region) before one that lights most of it (the background,
        or everything); then labelled features by their card's label score (AUROC), unlabelled ones in their
        block's own order (how specific the feature is to this image), blocks in the library's order."""
        order = {block: i for i, block in enumerate(self.blocks)}

        def key(item):
            (block, rank), feature = item
            label_score = float(self.card(block, feature["id"]).get("auroc") or 0.0) if feature.get("label") else 0.0
            return (not feature.get("label"), heatmap_coverage(feature["heatmap"]) > 0.5, -label_score,
                    order.get(block, len(order)), rank)

        ranked = sorted((((b, i), f) for b, feats in tops.items() for i, f in enumerate(feats)), key=key)
        return [(block, feature) for (block, _), feature in ranked]

    def explain(self, model, prompt: str, seed: int = 0, steps: int | None = None, n: int = 8):
        """Generate an image and name the features each block used: (image, {block: [feature...]})."""
        from interp.hooks import capture_updates

        with capture_updates(model, self.blocks, device="cpu", dtype=torch.float32) as cap:
            image = model.generate(prompt, steps=steps, seed=seed)[0]
        # The features at the last step: what the block wrote into the final image.
        updates = {b: cap.updates(b)[-1, 0] for b in self.blocks}
        return image, self.top_features(updates, n)

    # ----- painting ----------------------------------------------------------------------------
    def paint(self, model, prompt: str, seed: int, block: str, feature: int, strength: float,
              mask: np.ndarray | None = None, steps: int | None = None, act_steps: list[int] | None = None,
              allow_empty_prompt: bool = False) -> PaintResult:
        """Add `strength` x (mean activation) of a feature's decoder direction to the block's
        update inside `mask` (image-space, any size, nonzero = painted; None = everywhere)
        at `act_steps` (None = all) and regenerate with the same seed.

        Negative strength removes the feature: the feature's own activation is scaled by
        (1 + strength) where it fires (down to zero), rather than pushing past zero.
        """
        from interp.hooks import apply_edits

        edit = self.paint_edit(model, block, feature, strength, mask, act_steps)
        if allow_empty_prompt and not prompt.strip():
            original = np.asarray(_generate_any(model, "", seed, steps))
            with apply_edits(model, [edit], saes={block: self.sae(block)}):
                edited = np.asarray(_generate_any(model, "", seed, steps))
        else:
            original = np.asarray(model.generate(prompt, steps=steps, seed=seed)[0])
            with apply_edits(model, [edit], saes={block: self.sae(block)}):
                edited = np.asarray(model.generate(prompt, steps=steps, seed=seed)[0])
        diff = np.abs(edited.astype(np.int16) - original.astype(np.int16))
        diff = np.clip(diff * 3, 0, 255).astype(np.uint8)
        return PaintResult(original, edited, diff, edit.to_dict())

    def paint_edit(self, model, block: str, feature: int, strength: float, mask: np.ndarray | None = None,
                   act_steps: list[int] | None = None):
        """The `interp.edits.Edit` that `paint` applies (see there): the feature at `strength` x its mean
        activation inside the image-space `mask`, downsampled to the block's positions."""
        from interp.edits import Edit, downsample_mask

        feature = self.check_feature(block, feature)
        if not np.isfinite(strength):
            raise LibraryError(f"strength must be a finite number, not {strength!r}")
        info = model.blocks.get(block)
        if info is None:
            raise LibraryError(f"{model.name} has no block {block!r}")
        block_mask = None
        if mask is not None:
            mask = np.asarray(mask, dtype=np.float32)
            if mask.ndim == 3:
                mask = mask.max(axis=-1)
            if mask.ndim != 2 or not mask.size:
                raise LibraryError(f"a mask is a 2-D image, got shape {mask.shape}")
            if not (mask > 0).any():
                raise LibraryError("the painted region is empty: paint where the feature should act")
            block_mask = downsample_mask(mask > 0, (info.height, info.width))
        if strength >= 0:
            edit = Edit(block=block, mode="add", feature=feature, strength=float(strength) *
                        self.mean_activation(block, feature), mask=block_mask, steps=act_steps)
        else:
            edit = Edit(block=block, mode="scale", feature=feature, strength=max(0.0, 1.0 + float(strength)),
                        mask=block_mask, steps=act_steps)
        return edit

    def feature_icon(self, model, block: str, feature: int, strength: float = 4.0, seed: int = 0):
        """The feature alone: added everywhere to the generation of an empty prompt."""
        return self.paint(model, "", seed, block, feature, strength, allow_empty_prompt=True).edited


def _generate_any(model, prompt: str, seed: int, steps: int | None):
    """Generation that accepts the empty prompt (the unconditional image)."""
    from interp.models.t2i import generate

    return generate(model, prompt, steps=steps, seed=seed, allow_empty_prompt=True)[0]


def label_rank(card: dict) -> tuple:
    """The label search's order (`FeatureLibrary.search`): cards with a causal label score first, highest
    first, then by AUROC."""
    causal = card.get("causal_label")
    return (causal is None, -(causal or 0.0), -(card.get("auroc") or 0.0))


def label_scores(card: dict) -> str:
    """A labelled card's two scores in words: "AUROC 0.936, causal label 0.12 = 3/24"; "" without a
    label. The causal score: how often the probe reads the labelled value after the feature is painted in."""
    if not card.get("label") or card.get("auroc") is None:
        return ""
    text = f"AUROC {card['auroc']:.3f}"
    if card.get("causal_label") is not None:
        n = card.get("causal_label_n")
        hits = f" = {round(card['causal_label'] * n)}/{n}" if n else ""
        text += f", causal label {card['causal_label']:.2f}{hits}"
    return text


def heatmap_coverage(heatmap) -> float:
    """The share of an image's positions where a feature fires (its heatmap above zero)."""
    heatmap = np.asarray(heatmap, dtype=np.float32)
    return float((heatmap > 0).mean()) if heatmap.size else 0.0

"""Edits of block updates, as data.

An `Edit` says what to change in one block's update (batch, channels, height, width) at
some denoising steps: add a direction, scale or set one SAE feature, ablate the update,
or splice in an SAE reconstruction, optionally only inside a spatial mask (height x
width at the block's resolution) and only in one half of a classifier-free-guidance
batch. Edits serialise to JSON, so the UI, the CLI and a benchmark build the same
objects and a result file says exactly which edit produced it.

Modes (u: the update at one position, a_f: feature f's activation there, d_f: its
decoder row `W_dec[f]`, m: the mask value there, s: strength):

- add:    u + m * s * direction           (direction given, or d_f of `feature`)
- scale:  u + m * (s - 1) * a_f * d_f     (the feature's own contribution times s; s=0 zeroes it)
- set:    u + m * (s - a_f) * d_f         (the feature's activation becomes s)
- ablate: u * (1 - m)                     (the block writes nothing inside the mask)
- splice: (1 - m) * u + m * decode(encode(u)) [+ m * (u - decode(encode(u))) if keep_error]

An SAE is any object with `encode(x: (N, C)) -> (N, F)`, `decode(z: (N, F)) -> (N, C)` and
`W_dec: (F, C)`; `interp` does not import the SAE package (dependencies point one way).
Applying edits during generation: `interp.hooks.apply_edits`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch
import torch.nn.functional as F

from .names import block_name

MODES = ("add", "scale", "set", "ablate", "splice")
CFG_HALVES = (None, "cond", "uncond")
FEATURE_MODES = ("scale", "set")  # need a feature and an SAE


class EditError(ValueError):
    """An edit that cannot be applied, and why."""


@dataclass
class Edit:
    block: str                                   # e.g. "up_blocks.0.attentions.1"
    mode: str                                    # add | scale | set | ablate | splice
    steps: list[int] | None = None               # denoising step indices; None: every step
    direction: list[float] | None = None         # (channels,) for add
    feature: int | None = None                   # SAE feature index (add, scale, set)
    strength: float = 1.0
    mask: list[list[float]] | None = None        # (height, width) at the block's resolution; None: everywhere
    cfg_half: str | None = None                  # None: both halves; "cond" or "uncond": only that half
    keep_error: bool = True                      # splice: add back the SAE's reconstruction error

    def __post_init__(self):
        if self.mode not in MODES:
            raise EditError(f"unknown edit mode {self.mode!r}; use one of {', '.join(MODES)}")
        if self.cfg_half not in CFG_HALVES:
            raise EditError(f"cfg_half must be None, 'cond' or 'uncond', not {self.cfg_half!r}")
        if isinstance(self.strength, bool) or not isinstance(self.strength, (int, float, np.floating, np.integer)) \
                or not math.isfinite(float(self.strength)):
            raise EditError(f"strength must be a finite number, not {self.strength!r}")
        self.strength = float(self.strength)
        if self.direction is not None:
            self.direction = [float(v) for v in np.asarray(self.direction, dtype=np.float64).reshape(-1)]
        if self.mask is not None:
            mask = np.asarray(self.mask)
            if mask.ndim != 2:
                raise EditError(f"mask must be a (height, width) grid, not an array of shape {tuple(mask.shape)}")
            self.mask = mask.astype(np.float64).tolist()
        if self.steps is not None:
            steps = list(self.steps) if not isinstance(self.steps, (int, np.integer)) else [self.steps]
            if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in steps):
                raise EditError(f"steps must be step indices (integers), not {self.steps!r}")
            if any(s < 0 for s in steps):
                raise EditError(f"step indices start at 0, got {sorted(steps)}")
            self.steps = sorted({int(s) for s in steps})
        if self.feature is not None:
            if isinstance(self.feature, bool) or not isinstance(self.feature, (int, np.integer)) or self.feature < 0:
                raise EditError(f"feature must be a non-negative index, not {self.feature!r}")
            self.feature = int(self.feature)
        if self.mode == "add" and (self.direction is None) == (self.feature is None):
            raise EditError("an add edit needs exactly one of `direction` or `feature`")
        if self.mode in FEATURE_MODES and self.feature is None:
            raise EditError(f"a {self.mode} edit needs `feature` (an SAE feature index)")
        if self.mode in FEATURE_MODES + ("ablate", "splice") and self.direction is not None:
            raise EditError(f"a {self.mode} edit takes no `direction`")
        if self.mode in ("ablate", "splice") and self.feature is not None:
            raise EditError(f"a {self.mode} edit takes no `feature`")

    @property
    def is_identity(self) -> bool:
        """An edit that changes nothing (add at strength 0, scale by 1): applying it leaves the block's output
        bit-identical instead of recomputing input + update."""
        return (self.mode == "add" and self.strength == 0.0) or (self.mode == "scale" and self.strength == 1.0)

    @property
    def needs_sae(self) -> bool:
        return self.feature is not None or self.mode == "splice"

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "Edit":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise EditError(f"unknown edit field(s) {', '.join(unknown)}; an edit has: {', '.join(sorted(known))}")
        missing = sorted({"block", "mode"} - set(d))
        if missing:
            raise EditError(f"an edit needs {', '.join(missing)}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "Edit":
        return cls.from_dict(json.loads(text))


def edits_to_json(edits: list[Edit]) -> str:
    return json.dumps([e.to_dict() for e in edits], indent=2)


def edits_from_json(text: str) -> list[Edit]:
    data = json.loads(text)
    if isinstance(data, dict):
        data = [data]
    return [Edit.from_dict(d) for d in data]


# ----------------------------------------------------------------------------- masks

def downsample_mask(mask, size, threshold: float | None = None) -> list[list[float]]:
    """An image-space mask (height, width; bools, floats or a PIL image) at a block's resolution.

    size: (height, width) or anything with .height and .width (a BlockInfo). Each block
    position gets the fraction of its pixels inside the mask; with `threshold`, 1.0 where
    that fraction is at least the threshold and 0.0 elsewhere.
    """
    h, w = (size.height, size.width) if hasattr(size, "height") else tuple(size)
    array = np.asarray(mask, dtype=np.float32)
    if array.ndim == 3:  # an image: any channel counts
        array = array.max(axis=-1)
    if array.ndim != 2:
        raise EditError(f"an image mask is (height, width), not shape {array.shape}")
    if array.max(initial=0.0) > 1.0:
        array = array / 255.0  # an 8-bit image
    pooled = F.adaptive_avg_pool2d(torch.from_numpy(array)[None, None], (h, w))[0, 0]
    if threshold is not None:
        pooled = (pooled >= threshold).float()
    return pooled.double().tolist()


# ----------------------------------------------------------------------------- validation

def _sae_shape(sae) -> tuple[int, int]:
    w_dec = getattr(sae, "W_dec", None)
    if w_dec is None or not hasattr(sae, "encode") or not hasattr(sae, "decode"):
        raise EditError(f"{type(sae).__name__} is not an SAE: it needs encode, decode and W_dec (features, channels)")
    return int(w_dec.shape[0]), int(w_dec.shape[1])


def validate_edits(edits: list[Edit], blocks: dict, saes: dict | None = None, n_steps: int | None = None) -> None:
    """Check edits against a model's blocks (name -> BlockInfo, or TextStreamInfo for a joint block's text stream),
    SAEs and step count; EditError if not."""
    saes = saes or {}
    for i, edit in enumerate(edits):
        where = f"edit {i} ({edit.mode} on {edit.block})"
        name = block_name(edit.block)
        if name not in blocks:
            raise EditError(f"{where}: unknown block {edit.block!r}; the model's blocks are: {', '.join(blocks)}")
        info = blocks[name]
        if edit.direction is not None and len(edit.direction) != info.channels:
            raise EditError(f"{where}: direction has {len(edit.direction)} values but the block has "
                            f"{info.channels} channels")
        if edit.mask is not None and getattr(info, "stream", "image") == "text":
            raise EditError(f"{where}: {name} is a text stream, a sequence of tokens with no spatial grid: a mask "
                            f"cannot apply to it; edit it without a mask, or paint the image stream {info.block}")
        if edit.mask is not None:
            shape = (len(edit.mask), len(edit.mask[0]) if edit.mask else 0)
            if shape != (info.height, info.width):
                raise EditError(f"{where}: mask is {shape[0]} x {shape[1]} but the block has {info.height} x "
                                f"{info.width} positions (use downsample_mask for an image-space mask)")
        if n_steps is not None and edit.steps is not None and edit.steps and edit.steps[-1] >= n_steps:
            raise EditError(f"{where}: step {edit.steps[-1]} is out of range: the generation has {n_steps} "
                            f"step(s), 0 to {n_steps - 1}")
        if edit.needs_sae:
            if name not in saes:
                raise EditError(f"{where}: needs an SAE for block {name}; SAEs given for: "
                                f"{', '.join(saes) or 'none'}")
            n_features, channels = _sae_shape(saes[name])
            if channels != info.channels:
                raise EditError(f"{where}: the SAE reads {channels} channels but the block has {info.channels}")
            if edit.feature is not None and not edit.feature < n_features:
                raise EditError(f"{where}: feature {edit.feature} is out of range: the SAE has {n_features} "
                                f"features, 0 to {n_features - 1}")


# ----------------------------------------------------------------------------- application

def _positions(update: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B*H*W, C)."""
    return update.permute(0, 2, 3, 1).reshape(-1, update.shape[1])


def _unpositions(vectors: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(B*H*W, C) -> (B, C, H, W) shaped, typed and placed like `like`."""
    b, c, h, w = like.shape
    return vectors.reshape(b, h, w, c).permute(0, 3, 1, 2).to(device=like.device, dtype=like.dtype)


def _sae_inputs(sae, vectors: torch.Tensor) -> torch.Tensor:
    w = sae.W_dec
    return vectors.to(device=w.device, dtype=w.dtype)


def edit_update(update: torch.Tensor, edit: Edit, sae=None) -> torch.Tensor:
    """Apply one edit to one block update (batch, channels, height, width); returns a new tensor."""
    b, c, h, w = update.shape
    mask = None
    if edit.mask is not None:
        mask = torch.tensor(edit.mask, dtype=torch.float32)
        if mask.shape != (h, w):  # a generation at another resolution: the mask covers the same region
            mask = F.interpolate(mask[None, None], size=(h, w), mode="bilinear", align_corners=False)[0, 0]
        mask = mask.to(device=update.device, dtype=update.dtype)[None, None]
    inside = (lambda delta: delta) if mask is None else (lambda delta: delta * mask)

    if edit.mode == "ablate":
        return torch.zeros_like(update) if mask is None else update * (1 - mask)
    if edit.mode == "add":
        if edit.direction is not None:
            direction = torch.tensor(edit.direction, dtype=update.dtype, device=update.device)
        else:
            direction = sae.W_dec[edit.feature].detach().to(device=update.device, dtype=update.dtype)
        return update + inside(edit.strength * direction.view(1, c, 1, 1))
    vectors = _sae_inputs(sae, _positions(update))
    with torch.no_grad():
        if edit.mode in FEATURE_MODES:
            activation = sae.encode(vectors)[:, edit.feature]  # (N,)
            target = activation * edit.strength if edit.mode == "scale" else torch.full_like(activation,
                                                                                            edit.strength)
            delta = (target - activation)[:, None] * sae.W_dec[edit.feature][None, :]
            return update + inside(_unpositions(delta, update))
        # splice
        reconstruction = sae.decode(sae.encode(vectors))
        spliced = reconstruction + (vectors - reconstruction) if edit.keep_error else reconstruction
        spliced = _unpositions(spliced, update)
        return spliced if mask is None else update * (1 - mask) + spliced * mask


class PreparedEdits:
    """Edits grouped by block, applied in the order given to the updates of one generation."""

    def __init__(self, edits: list[Edit], saes: dict):
        self.by_block: dict[str, list[Edit]] = {}
        for edit in edits:
            name = block_name(edit.block)
            self.by_block.setdefault(name, []).append(edit)
        self.saes = saes

    def apply(self, block: str, update: torch.Tensor, step: int, cfg: bool) -> torch.Tensor:
        """The edited update (batch, C, H, W); the same tensor object when no edit acts at this step.

        Under CFG the batch is [uncond, cond]; an edit with cfg_half touches only its half.
        Without CFG the whole batch is the conditional half.
        """
        result = update
        for edit in self.by_block.get(block, ()):
            if edit.is_identity or (edit.steps is not None and step not in edit.steps):
                continue
            if edit.cfg_half is None:
                rows = slice(None)
            elif not cfg:
                if edit.cfg_half == "uncond":
                    continue
                rows = slice(None)
            else:
                half = update.shape[0] // 2
                rows = slice(half, None) if edit.cfg_half == "cond" else slice(0, half)
            sae = self.saes.get(block) if edit.needs_sae else None
            if rows == slice(None):
                result = edit_update(result, edit, sae)
            else:
                result = result.clone() if result is update else result
                result[rows] = edit_update(result[rows], edit, sae)
        return result


def prepare_edits(edits: list[Edit], saes: dict | None = None) -> PreparedEdits:
    return PreparedEdits(edits, {block_name(k): v for k, v in (saes or {}).items()})

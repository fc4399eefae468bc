"""A language model's feature edits as data, their checks against a model and an SAE, and their arithmetic
(`interp.hooks.lm_steer` applies them while the model runs).

An `LMEdit` is data, like the diffusion side's `interp.edits.Edit`: which residual hook
(``blocks.{l}.hook_resid_post``, also ``resid_pre`` / ``resid_mid``, TransformerLens' names as in
`interp.hooks.lm`), which mode, which SAE feature (or a raw direction), how strong, and at which
positions. The arithmetic is `interp.edits.edit_update`'s, on each position's residual vector x
(a_f: feature f's activation at x, d_f: the SAE's decoder row ``W_dec[f]``, s: strength):

- add:    x + s * d_f                 (or x + s * direction)
- scale:  x + (s - 1) * a_f * d_f     (the feature's own contribution times s)
- set:    x + (s - a_f) * d_f         (the feature's activation becomes s)
- ablate: x - a_f * d_f               (the feature's contribution removed: scale with s = 0)
          or, with a raw direction u, x - (x . u) u / |u|^2 (u's component projected out: the directional
          ablation of Arditi et al. 2024)
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, fields
from typing import Sequence

import numpy as np
import torch

from ..edits import Edit, EditError, edit_update
from .lm import LMHookError, parse_hook_name

LM_EDIT_MODES = ("add", "scale", "set", "ablate")
POSITIONS = ("prompt", "generated", "all")
RESIDUAL_HOOK = re.compile(r"^blocks\.\d+\.hook_resid_(pre|mid|post)$")  # any model's; parse_hook_name checks one's


# |strength| of an LM edit: far above any residual norm, far below float32's overflow in a norm layer (at 1e20 the
# squares overflow and a completion came back empty; -1e39 as a "set" overflowed float32 itself)
MAX_LM_STRENGTH = 1e4


@dataclass
class LMEdit:
    """One feature edit at one residual hook of a language model, as JSON data."""

    hook: str                            # blocks.{l}.hook_resid_post (or resid_pre, resid_mid)
    mode: str                            # add | scale | set | ablate
    feature: int | None = None           # SAE feature index
    strength: float = 1.0
    direction: list[float] | None = None  # (d_model,) for add or ablate, instead of a feature
    positions: str = "all"               # prompt | generated | all

    def __post_init__(self):
        if self.mode not in LM_EDIT_MODES:
            raise EditError(f"unknown edit mode {self.mode!r}; use one of {', '.join(LM_EDIT_MODES)}")
        if self.positions not in POSITIONS:
            raise EditError(f"positions must be one of {', '.join(POSITIONS)}, not {self.positions!r}")
        if not isinstance(self.hook, str) or not self.hook:
            raise EditError(f"hook must be a hook name such as blocks.2.hook_resid_post, not {self.hook!r}")
        if isinstance(self.strength, bool) or not isinstance(self.strength, (int, float, np.floating, np.integer)) \
                or not math.isfinite(float(self.strength)):
            raise EditError(f"strength must be a finite number, not {self.strength!r}")
        self.strength = float(self.strength)
        if abs(self.strength) > MAX_LM_STRENGTH:
            raise EditError(f"strength {self.strength:g} is out of range: use -{MAX_LM_STRENGTH:g} to "
                            f"{MAX_LM_STRENGTH:g} (a residual stream's norm is far smaller; beyond that the model "
                            f"overflows and writes nothing)")
        if self.feature is not None:
            if isinstance(self.feature, bool) or not isinstance(self.feature, (int, np.integer)) or self.feature < 0:
                raise EditError(f"feature must be a non-negative index, not {self.feature!r}")
            self.feature = int(self.feature)
        if self.direction is not None:
            self.direction = [float(v) for v in np.asarray(self.direction, dtype=np.float64).reshape(-1)]
            if not all(math.isfinite(v) for v in self.direction):
                raise EditError("direction must hold finite numbers")
        if self.mode in ("add", "ablate") and (self.direction is None) == (self.feature is None):
            raise EditError(f"an {self.mode} edit needs exactly one of `direction` or `feature`")
        if self.mode not in ("add", "ablate") and self.feature is None:
            raise EditError(f"a {self.mode} edit needs `feature` (an SAE feature index)")
        if self.mode not in ("add", "ablate") and self.direction is not None:
            raise EditError(f"a {self.mode} edit takes no `direction`")
        if self.mode == "ablate" and self.direction is not None and not any(self.direction):
            raise EditError("an ablate edit's direction must not be all zeros")

    @property
    def needs_sae(self) -> bool:
        return self.feature is not None

    def as_edit(self) -> Edit:
        """The diffusion-side `Edit` with the same arithmetic (ablate is scale with strength 0)."""
        if self.mode == "ablate":
            return Edit(self.hook, "scale", feature=self.feature, strength=0.0)
        return Edit(self.hook, self.mode, feature=self.feature, strength=self.strength, direction=self.direction)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "LMEdit":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise EditError(f"unknown edit field(s) {', '.join(unknown)}; an LM edit has: {', '.join(sorted(known))}")
        missing = sorted({"hook", "mode"} - set(d))
        if missing:
            raise EditError(f"an LM edit needs {', '.join(missing)}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "LMEdit":
        return cls.from_dict(json.loads(text))


def lm_edits_from_json(text: str) -> list[LMEdit]:
    data = json.loads(text)
    return [LMEdit.from_dict(d) for d in ([data] if isinstance(data, dict) else data)]


# ----------------------------------------------------------------------------- validation

def _sae_shape(sae) -> tuple[int, int]:
    w_dec = getattr(sae, "W_dec", None)
    if w_dec is None or not hasattr(sae, "encode"):
        raise EditError(f"{type(sae).__name__} is not an SAE: it needs encode and W_dec (features, d_model)")
    return int(w_dec.shape[0]), int(w_dec.shape[1])


def is_residual_hook(name) -> bool:
    """Whether a hook name is a language model's residual hook (blocks.{l}.hook_resid_pre|mid|post)."""
    return isinstance(name, str) and RESIDUAL_HOOK.match(name) is not None


def sae_hook(sae) -> str | None:
    """The hook an SAE says it was trained on (its cfg metadata's hook_name), if it says."""
    metadata = getattr(getattr(sae, "cfg", None), "metadata", None) or {}
    return metadata.get("hook_name")


def check_sae_fits(lm, sae, hook: str | None = None, where: str = "the SAE") -> str:
    """The hook the SAE is for, checked against the model: a known residual hook and d_in = d_model.
    ``hook``: the hook it is to be used at (default: the one its metadata names)."""
    recorded = sae_hook(sae)
    hook = hook or recorded
    if hook is None:
        raise EditError(f"{where} does not say which hook it reads (no metadata.hook_name in its cfg.json); "
                        f"name the hook, e.g. blocks.2.hook_resid_post")
    if recorded is not None and recorded != hook:
        raise EditError(f"{where} was trained on {recorded}, not {hook}")
    metadata = getattr(getattr(sae, "cfg", None), "metadata", None) or {}
    trained_for = f"; it was trained on {metadata['model_name']}" if metadata.get("model_name") else \
        " (an SAE of another model?)"
    try:
        parse_hook_name(hook, lm.n_layers)
    except LMHookError as err:
        raise EditError(f"{where} reads {hook}, which {lm.name} does not have{trained_for} ({err})") from None
    _, d_in = _sae_shape(sae)
    if d_in != lm.d_model:
        raise EditError(f"{where} reads {d_in} dimensions but {lm.name}'s residual stream has {lm.d_model}"
                        f"{trained_for}")
    return hook


def validate_lm_edits(lm, edits: Sequence[LMEdit], saes: dict | None = None) -> None:
    """Check edits against a model (hook names, d_model) and their SAEs; EditError / LMHookError if not."""
    saes = saes or {}
    for i, edit in enumerate(edits):
        where = f"edit {i} ({edit.mode} at {edit.hook})"
        try:
            parse_hook_name(edit.hook, lm.n_layers)
        except LMHookError as err:
            raise EditError(f"{where}: {err}") from None
        if edit.direction is not None and len(edit.direction) != lm.d_model:
            raise EditError(f"{where}: direction has {len(edit.direction)} values but the model's residual stream "
                            f"has {lm.d_model}")
        if edit.needs_sae:
            if edit.hook not in saes:
                raise EditError(f"{where}: needs an SAE for {edit.hook}; SAEs given for: {', '.join(saes) or 'none'}")
            sae = saes[edit.hook]
            check_sae_fits(lm, sae, edit.hook, where=f"{where}: the SAE")
            n_features, _ = _sae_shape(sae)
            if not edit.feature < n_features:
                raise EditError(f"{where}: feature {edit.feature} is out of range: the SAE has {n_features} "
                                f"features, 0 to {n_features - 1}")


# ----------------------------------------------------------------------------- the arithmetic

def edit_residual(vectors: torch.Tensor, edit: LMEdit, sae=None) -> torch.Tensor:
    """Apply one edit to residual vectors (N, d_model); a new tensor, typed and placed like the input.

    The arithmetic is `interp.edits.edit_update`'s: the vectors go through it as N positions of one
    channel column each."""
    n, d = vectors.shape
    if edit.mode == "ablate" and edit.direction is not None:  # project the direction out
        unit = torch.tensor(edit.direction, dtype=torch.float64)
        unit = (unit / unit.norm()).to(device=vectors.device, dtype=torch.float32)
        x = vectors.float()
        return (x - (x @ unit)[:, None] * unit[None, :]).to(vectors.dtype)
    edited = edit_update(vectors.reshape(n, d, 1, 1), edit.as_edit(), sae)
    return edited.reshape(n, d).to(device=vectors.device, dtype=vectors.dtype)


__all__ = ["LMEdit", "LM_EDIT_MODES", "MAX_LM_STRENGTH", "POSITIONS", "RESIDUAL_HOOK", "check_sae_fits", "edit_residual",
           "is_residual_hook", "lm_edits_from_json", "sae_hook", "validate_lm_edits"]

"""VCL, the Variance Concentration Loss: a term on the singular values of mid-layer residuals.

For each layer of a window (given as normalised depth [a, b]) the residuals at the chosen
positions form R in R^{B x d}, centred over the batch. With singular values s_j,

    ratio_k(R) = sum_{j<=k} s_j^2 / sum_j s_j^2         (the top-k energy ratio, in [0, 1])
    VCL = +lambda * ratio   (sign "penalize", the default, as the study's abstract says)
        = -lambda * ratio   (sign "encourage")

pooled over the window's layers either per layer then averaged (``mean``) or on all rows of the
window stacked into one matrix (``stacked``).

Numerics: s_j^2 are the eigenvalues of the Gram matrix R R^T (or R^T R, whichever is smaller),
computed in float32 (float64 when the input is float64). Eigenvalue gradients are v v^T, with no
1/(s_i - s_j) terms, so they stay finite when singular values repeat (rank-deficient or constant
batches), unlike the gradients of an SVD. The denominator is the trace (the exact sum of
squares) plus a small epsilon, so a constant batch gives ratio 0 with finite gradients.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import torch

SIGNS = ("penalize", "encourage")
POOLINGS = ("mean", "stacked")
POSITIONS = ("last_prompt", "response")


@dataclass
class VCLConfig:
    """Settings of the loss; validated on construction. ``window`` is [a, b] in normalised depth."""

    k: int = 2
    weight: float = 1.0
    window: tuple[float, float] = (0.3, 0.5)
    sign: str = "penalize"
    pooling: str = "mean"
    positions: str = "last_prompt"
    eps: float = 1e-8

    def __post_init__(self):
        self.window = tuple(float(x) for x in self.window)
        if len(self.window) != 2:
            raise ValueError(f"window must be two normalised depths [a, b], got {self.window}")
        a, b = self.window
        if not (0.0 <= a <= 1.0 and 0.0 <= b <= 1.0):
            raise ValueError(f"window [{a}, {b}] lies outside [0, 1] (normalised depth l/(L-1))")
        if a > b:
            raise ValueError(f"window [{a}, {b}] is empty: its start is after its end")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k must be a positive integer, got {self.k!r}")
        if not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight):
            raise ValueError(f"lambda (the VCL weight) must be a finite number, got {self.weight!r}")
        if self.sign not in SIGNS:
            raise ValueError(f"sign must be one of {SIGNS}, got {self.sign!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise ValueError(f"eps must be positive, got {self.eps!r}")

    def check_against(self, batch_size: int, width: int, n_layers: int) -> list[int]:
        """Errors for a k the batch or the width cannot support; returns the window's layers."""
        if self.k > batch_size:
            raise ValueError(f"k = {self.k} is larger than the batch size {batch_size}: the top-k energy "
                             f"of {batch_size} residuals is always 1")
        if self.k > width:
            raise ValueError(f"k = {self.k} is larger than the residual width {width}")
        return window_layers(self.window, n_layers)

    def to_json(self) -> dict:
        out = asdict(self)
        out["window"] = list(self.window)
        return out


def window_layers(window: Sequence[float], n_layers: int) -> list[int]:
    """Layers l with l/(L-1) in [a, b] (a contiguous range); an error when the window holds none."""
    a, b = window
    if n_layers < 1:
        raise ValueError("the model has no layers")
    depth = [0.0] if n_layers == 1 else [layer / (n_layers - 1) for layer in range(n_layers)]
    tolerance = 1e-9
    layers = [layer for layer, x in enumerate(depth) if a - tolerance <= x <= b + tolerance]
    if not layers:
        raise ValueError(f"window [{a}, {b}] holds no layer of a model with {n_layers} layers "
                         f"(layer depths step by {1 / max(n_layers - 1, 1):.3f}); widen it")
    return layers


def _compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32


def top_k_energy_ratio(rows: torch.Tensor, k: int, eps: float = 1e-8) -> torch.Tensor:
    """sum of the k largest s_j^2 over sum of all s_j^2 of the batch-centred ``rows`` ``(B, d)``.

    Returns a 0-dim tensor in float32 (float64 for float64 input); finite with finite gradients
    for any B >= 1, rank-deficient rows, fp16/bf16 input. Centred B rows have rank at most B - 1,
    so k >= B - 1 gives 1 (up to eps); a constant batch (or B = 1) has no energy and gives 0.
    """
    if rows.ndim != 2:
        raise ValueError(f"rows must have shape (B, d), got {tuple(rows.shape)}")
    rows = rows.to(_compute_dtype(rows))
    centred = rows - rows.mean(dim=0, keepdim=True)
    # The ratio is scale-invariant; dividing by the (detached) largest entry keeps the Gram matrix
    # O(1) whatever the residual norms, so neither overflow nor eps depends on the model's scale.
    centred = centred / centred.detach().abs().max().clamp_min(torch.finfo(centred.dtype).tiny)
    # The smaller Gram matrix has the same non-zero eigenvalues s_j^2.
    gram = centred @ centred.T if centred.shape[0] <= centred.shape[1] else centred.T @ centred
    gram = 0.5 * (gram + gram.T)
    try:
        eigenvalues = torch.linalg.eigvalsh(gram)  # ascending
    except torch.linalg.LinAlgError:  # rare non-convergence on near-degenerate spectra: jitter the diagonal
        eigenvalues = torch.linalg.eigvalsh(gram + eps * torch.eye(gram.shape[0], dtype=gram.dtype,
                                                                   device=gram.device))
    eigenvalues = eigenvalues.clamp_min(0.0)
    top = eigenvalues.flip(0)[:k].sum()
    total = (centred * centred).sum()  # trace: the exact total energy, with a simple gradient
    return top / (total + eps)


def variance_concentration_loss(window_residuals: Sequence[torch.Tensor], config: VCLConfig) -> dict:
    """VCL on the residuals of each window layer, each ``(rows, d)``.

    Returns ``loss`` (signed, weighted, differentiable) and ``ratio`` (the pooled top-k energy
    ratio, detached), both 0-dim float tensors.
    """
    if not window_residuals:
        raise ValueError("VCL needs the residuals of at least one layer")
    if config.pooling == "mean":
        ratio = torch.stack([top_k_energy_ratio(r, config.k, config.eps) for r in window_residuals]).mean()
    else:
        ratio = top_k_energy_ratio(torch.cat(list(window_residuals), dim=0), config.k, config.eps)
    signed = ratio if config.sign == "penalize" else -ratio
    return {"loss": config.weight * signed, "ratio": ratio.detach()}


def select_positions(hidden: torch.Tensor, prompt_mask: torch.Tensor, response_mask: torch.Tensor,
                     positions: str) -> torch.Tensor:
    """Rows of ``hidden`` ``(B, T, d)`` that VCL acts on.

    ``last_prompt``: the last True of ``prompt_mask`` ``(B, T)`` per row -> ``(B, d)``;
    ``response``: every True of ``response_mask`` ``(B, T)`` -> ``(n_response_tokens, d)``.
    """
    if positions == "last_prompt":
        if not bool(prompt_mask.any(dim=1).all()):
            raise ValueError("a sequence has no prompt token")
        index = torch.arange(prompt_mask.shape[1], device=prompt_mask.device).expand_as(prompt_mask)
        last = torch.where(prompt_mask.bool(), index, torch.full_like(index, -1)).max(dim=1).values
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    if positions == "response":
        return hidden[response_mask.bool()]
    raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")

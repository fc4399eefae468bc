"""Pieces the embedded models' recipes share: the learning-rate schedule and atomic checkpoints."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from interp.atomic import atomic_write


def lr_at(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up to `peak`, then cosine decay to `floor * peak` at `total` steps."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def save_checkpoint(path: Path, state: dict) -> None:
    """torch.save to a temporary file, then rename: a crash mid-write never replaces a good checkpoint."""
    atomic_write(path, lambda tmp: torch.save(state, tmp))

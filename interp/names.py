"""Canonical names of hook sites, shared by every package (imports nothing)."""

from __future__ import annotations

UNET_PREFIX = "unet."


def block_name(name: str) -> str:
    """A U-Net block's canonical name: ``unet.mid_block.attentions.0`` and ``mid_block.attentions.0`` name the same
    block, and stores, SAE directories, edits and ``metadata.hook_name`` all use the form without ``unet.``."""
    return name[len(UNET_PREFIX):] if name.startswith(UNET_PREFIX) else name


__all__ = ["UNET_PREFIX", "block_name"]

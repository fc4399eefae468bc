"""Canonical names of hook sites and of the two kinds of model, shared by every package (imports nothing)."""

from __future__ import annotations

import re

# The two kinds of model, in the one vocabulary of objects and files (`interp.models.spec` decides which a model is).
LM, T2I = "lm", "t2i"
KINDS = (LM, T2I)


def kind_word(word) -> str:
    """A kind as a saved file says it, in the one vocabulary: ``"lm"``, else ``"t2i"`` (absent, ``"t2i"``, or
    ``"diffusion"``, the word activation stores were read with before the vocabulary was one)."""
    return LM if word == LM else T2I

# A language model's hook names (TransformerLens'): a residual site, or the MLP side's input / output a transcoder
# reads; anything else a saved SAE names is a denoiser's site (`interp.models.spec.saved_kind`).
LM_HOOK = re.compile(r"^blocks\.(\d+)\.(hook_resid_pre|hook_resid_mid|hook_resid_post|mlp\.hook_in|mlp\.hook_out)$")


def is_lm_hook(name) -> bool:
    """Whether ``name`` is one of a language model's hook names (a residual site or the MLP side's input/output)."""
    return isinstance(name, str) and LM_HOOK.match(name) is not None


UNET_PREFIX = "unet."


def block_name(name: str) -> str:
    """A U-Net block's canonical name: ``unet.mid_block.attentions.0`` and ``mid_block.attentions.0`` name the same
    block, and stores, SAE directories, edits and ``metadata.hook_name`` all use the form without ``unet.``."""
    return name[len(UNET_PREFIX):] if name.startswith(UNET_PREFIX) else name


TEXT_SUFFIX = ":text"  # `<block>:text`: the text stream of a joint (MMDiT) block, SD3's and FLUX's


def text_site(block: str) -> str:
    """The site of a joint block's text stream: ``transformer_blocks.3`` -> ``transformer_blocks.3:text``."""
    return block_name(block) + TEXT_SUFFIX


def split_site(name: str) -> tuple[str, str]:
    """(block, stream) of a site name: ``transformer_blocks.3:text`` -> (``transformer_blocks.3``, ``text``); a
    block's own name is its image stream (the update every family has)."""
    name = block_name(name)
    if name.endswith(TEXT_SUFFIX):
        return name[: -len(TEXT_SUFFIX)], "text"
    return name, "image"


def is_text_site(name: str) -> bool:
    return split_site(name)[1] == "text"


__all__ = ["KINDS", "LM", "LM_HOOK", "T2I", "TEXT_SUFFIX", "is_lm_hook", "kind_word", "UNET_PREFIX", "block_name", "is_text_site", "split_site", "text_site"]

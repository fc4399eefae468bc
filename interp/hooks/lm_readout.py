"""The unembedding: the model's own final norm and output head as a function of the stream leaving the last block
(`readout`), and `logit_effects`: what a direction written into the residual stream does to the next-token
logits through the model's own final norm and output head (linearised), for feature cards' promoted
and suppressed tokens.
"""

from __future__ import annotations

import torch

from .lm import LMHookError, language_model
from .lm_sites import find_family, linear_logit_effects, lm_sites


def _table_model(model):
    """The Hugging Face model a TransformerBridge wraps when the site table has its family (None otherwise, and
    for a HookedTransformer)."""
    wrapped = getattr(model, "original_model", None)
    if isinstance(wrapped, torch.nn.Module) and hasattr(wrapped, "config") and \
            find_family(wrapped.config, type(wrapped).__name__) is not None:
        return wrapped
    return None


def readout(lm):
    """x (n, d_model), the stream leaving the last block -> the logits the model computes from it, through the
    model's own final-norm module and output head (`interp.hooks.lm_sites`; a TransformerLens model: its
    ``ln_final`` and ``unembed``, or for a TransformerBridge the wrapped Hugging Face model's)."""
    lm = language_model(lm)
    model = lm.model
    if lm.backend == "transformer_lens":
        wrapped = _table_model(model)
        if wrapped is not None:
            return lm_sites(wrapped).readout()
        checked = model.__dict__.get("_interp_readout")  # set by interp.models.lm.verify_transformer_lens
        if checked is not None and checked is not True:
            raise LMHookError(checked)
        norm, unembed = getattr(model, "ln_final", None), model.unembed

        def read(x: torch.Tensor) -> torch.Tensor:
            x = x[:, None, :]
            if isinstance(norm, torch.nn.Module):
                x = norm(x)
            return unembed(x)[:, 0, :]

        return read
    if model.get_output_embeddings() is None:
        raise LMHookError(f"{type(model).__name__} has no output embedding: no unembedding to read features through")
    return lm_sites(model).readout()


@torch.no_grad()
def logit_effects(lm, directions: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    """(F, vocab): the change in next-token logits per unit of each direction (F, d_model) added to the
    stream leaving the last block, linearised through the model's own final norm and output head (with
    Gemma's ``1 + weight`` gains, LayerNorm's centring, OPT's ``project_out`` and Granite's logit scaling,
    whatever the module does) at a point where the norm divides by 1 and has no component along the
    direction: for a LayerNorm that is W_U (gain * centred direction), the usual folded-norm logit weights.
    Gemma 2/3's final soft-cap ``c * tanh(logits / c)`` is part of the readout, so the effect is linearised
    through it at that point. A TransformerLens model of a family the site table lacks reads out through its own
    ``ln_final`` and ``unembed``, which `interp.models.lm.load_lm` checked against the model's logits."""
    lm = language_model(lm)
    read = readout(lm)
    parameter = next(lm.model.parameters())
    directions = directions.detach()
    d_model = lm.d_model
    if directions.dim() != 2 or directions.shape[1] != d_model:
        raise LMHookError(f"directions must be (n, {d_model}), got {tuple(directions.shape)}")
    directions = directions.to(device=parameter.device, dtype=parameter.dtype)
    return linear_logit_effects(read, directions, batch_size=batch_size)


__all__ = ["logit_effects", "readout"]

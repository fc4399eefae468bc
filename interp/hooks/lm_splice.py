"""Replacing a language model's residual stream at one TransformerLens hook name, for one ``with`` block.

    with residual_replacement(lm, "blocks.2.hook_resid_post", lambda x: sae(x)):
        logits = lm.model(input_ids).logits            # the block's output is sae(output) from position 1 on

``fn`` maps (batch, positions, d_model) to the same shape; positions before ``start`` (default 1: the
start token, an attention sink no SAE is trained on) keep their clean value. The stream downstream of
the hook sees the replacement: resid_pre replaces the block's input, resid_post its output, and
resid_mid the stream the MLP side reads and adds to (where that is, per model family, is
`interp.hooks.lm_sites`' to say). Both backends
(``hf``: the decoder layers and their attention module; ``transformer_lens``: the hook point) give
the same result. The replacement acts only in the context (thread, asyncio task) that entered the
``with`` (a `ScopedHooks`): another thread's forward pass on the same shared model stays clean.
Every hook is removed when the block ends, also when it raises.
"""

from __future__ import annotations

from typing import Callable

import torch

from .lm import LMHookError, language_model, parse_hook_name, tl_stream_shape
from .lm_sites import lm_sites, register_stream_hooks
from .scoped import ScopedHooks


def _replace(x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor], start: int) -> torch.Tensor:
    if start <= 0:
        new = fn(x)
    else:
        new = x.clone()
        if x.shape[1] > start:
            new[:, start:] = fn(x[:, start:])
    if new.shape != x.shape:
        raise LMHookError(f"the replacement has shape {tuple(new.shape)}, the residual {tuple(x.shape)}")
    return new.to(x.dtype)


class ResidualReplacement(ScopedHooks):
    """Hooks that replace the residual at one hook name by ``fn`` of it, in the forward passes of the context
    (thread, asyncio task) that entered it only (a `ScopedHooks`). Use through `residual_replacement`."""

    def __init__(self, lm, name: str, fn: Callable[[torch.Tensor], torch.Tensor], start: int = 1):
        self.lm = lm = language_model(lm)
        self.name, self.fn, self.start = name, fn, start
        self.layer, self.hook = parse_hook_name(name, lm.n_layers)
        if lm.backend == "transformer_lens":
            if name not in lm.model.hook_dict:
                raise LMHookError(f"the model has no hook {name!r}")
        else:
            lm_sites(lm.model).check(self.hook)
        self._handles: list = []

    def _replaced(self, x: torch.Tensor) -> torch.Tensor:
        return _replace(x, self.fn, self.start)

    def _register(self) -> None:
        if self.lm.backend == "transformer_lens":
            shape = tl_stream_shape(self, self.lm.model, [self.layer])

            def on_point(module, inputs, output):
                if not self._active():
                    return None
                return self._replaced(shape.unflatten(output)).reshape(output.shape)

            self._handles.append(self.lm.model.hook_dict[self.name].register_forward_hook(on_point))
            return
        register_stream_hooks(self, lm_sites(self.lm.model), self.layer, self.hook, self._replaced, writes=True)


def residual_replacement(lm, name: str, fn: Callable[[torch.Tensor], torch.Tensor],
                         start: int = 1) -> ResidualReplacement:
    """Context manager: every forward pass run inside it, in this context, has the residual at ``name``
    replaced by ``fn`` of it."""
    return ResidualReplacement(lm, name, fn, start)


__all__ = ["ResidualReplacement", "residual_replacement"]

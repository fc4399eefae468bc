"""Replacing a language model's residual stream at one TransformerLens hook name, for one ``with`` block.

    with residual_replacement(lm, "blocks.2.hook_resid_post", lambda x: sae(x)):
        logits = lm.model(input_ids).logits            # the block's output is sae(output) from position 1 on

``fn`` maps (batch, positions, d_model) to the same shape; positions before ``start`` (default 1: the
start token, an attention sink no SAE is trained on) keep their clean value. The stream downstream of
the hook sees the replacement: resid_pre replaces the block's input, resid_post its output, and
resid_mid the attention output so that input + attention output is the replacement. Both backends
(``hf``: the decoder layers and their attention module; ``transformer_lens``: the hook point) give
the same result. The replacement acts only in the context (thread, asyncio task) that entered the
``with`` (a `ScopedHooks`): another thread's forward pass on the same shared model stays clean.
Every hook is removed when the block ends, also when it raises.
"""

from __future__ import annotations

from typing import Callable

import torch

from .lm import LMHookError, _is_parallel, attention_module, decoder_layers, language_model, parse_hook_name
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


def _with_first(output, tensor):
    if isinstance(output, tuple):
        return (tensor,) + output[1:]
    if isinstance(output, list):
        return [tensor] + output[1:]
    return tensor


def _first(output) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


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
        elif self.hook == "resid_mid" and _is_parallel(lm.model.config):
            raise LMHookError(f"{type(lm.model).__name__} computes attention and MLP in parallel: it has no "
                              f"resid_mid; use resid_pre or resid_post")
        self._stream_in: dict[str, torch.Tensor] = {}
        self._handles: list = []

    def _replaced(self, x: torch.Tensor) -> torch.Tensor:
        return _replace(x, self.fn, self.start)

    def _register(self) -> None:
        if self.lm.backend == "transformer_lens":
            def on_point(module, inputs, output):
                return self._replaced(output) if self._active() else None

            self._handles.append(self.lm.model.hook_dict[self.name].register_forward_hook(on_point))
            return
        block = decoder_layers(self.lm.model)[self.layer]
        # kwargs optional: torch can call a kwargs hook without them while registering it (see scoped.py)
        if self.hook == "resid_pre":
            def on_input(module, args, kwargs=None):
                if not self._active():
                    return None
                if args:
                    return (self._replaced(args[0]),) + tuple(args[1:]), kwargs
                return args, {**kwargs, "hidden_states": self._replaced(kwargs["hidden_states"])}

            self._handles.append(block.register_forward_pre_hook(on_input, with_kwargs=True))
        elif self.hook == "resid_post":
            def on_output(module, inputs, output):
                if not self._active():
                    return None
                return _with_first(output, self._replaced(_first(output)))

            self._handles.append(block.register_forward_hook(on_output))
        else:
            def remember_input(module, args, kwargs=None):
                if self._active():
                    self._stream_in["x"] = args[0] if args else kwargs["hidden_states"]
                return None

            def on_attention(module, inputs, output):
                if not self._active():
                    return None
                attended = _first(output)
                mid = self._stream_in["x"] + attended
                # attention output + (replacement - mid): positions left alone keep their exact value
                return _with_first(output, attended + (self._replaced(mid) - mid))

            self._handles.append(block.register_forward_pre_hook(remember_input, with_kwargs=True))
            self._handles.append(attention_module(block).register_forward_hook(on_attention))

    def _remove(self) -> None:
        super()._remove()
        self._stream_in.clear()


def residual_replacement(lm, name: str, fn: Callable[[torch.Tensor], torch.Tensor],
                         start: int = 1) -> ResidualReplacement:
    """Context manager: every forward pass run inside it, in this context, has the residual at ``name``
    replaced by ``fn`` of it."""
    return ResidualReplacement(lm, name, fn, start)


__all__ = ["ResidualReplacement", "residual_replacement"]

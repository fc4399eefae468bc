"""Replacing a language model's residual stream at one TransformerLens hook name, for one ``with`` block.

    with residual_replacement(lm, "blocks.2.hook_resid_post", lambda x: sae(x)):
        logits = lm.model(input_ids).logits            # the block's output is sae(output) from position 1 on

``fn`` maps (batch, positions, d_model) to the same shape; positions before ``start`` (default 1: the
start token, an attention sink no SAE is trained on) keep their clean value. The stream downstream of
the hook sees the replacement: resid_pre replaces the block's input, resid_post its output, and
resid_mid the attention output so that input + attention output is the replacement. Both backends
(``hf``: the decoder layers and their attention module; ``transformer_lens``: the hook point) give
the same result. Every hook is removed when the block ends, also when it raises.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch

from .lm import LMHookError, _is_parallel, attention_module, decoder_layers, parse_hook_name


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


@contextmanager
def residual_replacement(lm, name: str, fn: Callable[[torch.Tensor], torch.Tensor], start: int = 1):
    """Context manager: every forward pass inside it has the residual at ``name`` replaced by ``fn`` of it."""
    layer, hook = parse_hook_name(name, lm.n_layers)
    handles = []
    try:
        if lm.backend == "transformer_lens":
            point = lm.model.hook_dict.get(name)
            if point is None:
                raise LMHookError(f"the model has no hook {name!r}")
            handles.append(point.register_forward_hook(lambda module, inputs, output: _replace(output, fn, start)))
        else:
            if hook == "resid_mid" and _is_parallel(lm.model.config):
                raise LMHookError(f"{type(lm.model).__name__} computes attention and MLP in parallel: it has no "
                                  f"resid_mid; use resid_pre or resid_post")
            block = decoder_layers(lm.model)[layer]
            if hook == "resid_pre":
                def on_input(module, args, kwargs):
                    if args:
                        return (_replace(args[0], fn, start),) + tuple(args[1:]), kwargs
                    return args, {**kwargs, "hidden_states": _replace(kwargs["hidden_states"], fn, start)}

                handles.append(block.register_forward_pre_hook(on_input, with_kwargs=True))
            elif hook == "resid_post":
                handles.append(block.register_forward_hook(
                    lambda module, inputs, output: _with_first(output, _replace(_first(output), fn, start))))
            else:
                stream_in: dict[str, torch.Tensor] = {}

                def remember_input(module, args, kwargs):
                    stream_in["x"] = args[0] if args else kwargs["hidden_states"]

                def on_attention(module, inputs, output):
                    attended = _first(output)
                    mid = stream_in["x"] + attended
                    # attention output + (replacement - mid): positions left alone keep their exact value
                    return _with_first(output, attended + (_replace(mid, fn, start) - mid))

                handles.append(block.register_forward_pre_hook(remember_input, with_kwargs=True))
                handles.append(attention_module(block).register_forward_hook(on_attention))
        yield
    finally:
        for handle in handles:
            handle.remove()


__all__ = ["residual_replacement"]

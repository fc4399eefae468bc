"""Stop a language model's forward pass after the last layer a capture needs.

A capture of ``blocks.15.hook_resid_post`` on a 30-layer model needs layers 0-15 only; the other 14
layers, the final norm and the LM head (the largest matrix of a small model) are work thrown away.
`stop_after` is a hook session (`interp.hooks.scoped.ScopedHooks`) whose forward hook on the last
needed decoder layer raises a private exception; the ``with`` block swallows it, so the call inside
simply returns early (its return value is lost: only hooks' captures survive):

    with residual_capture(lm, names) as capture, stop_after(lm, names):
        forward_padded(lm, ids, mask)

The layers that do run get exactly the inputs they get in a full pass, so the captured tensors are bit
for bit the full pass's (tests/test_dtype.py). Enter it *after* the capture: hooks on one module run in
the order they were registered, so the capture's hook on the last layer records before this one raises.
Like every session it acts only in the context that entered it: another thread's pass on the same
shared model runs to the end.
"""

from __future__ import annotations

from typing import Sequence

from .lm import decoder_layers, language_model, parse_hook_name
from .scoped import ScopedHooks


class _StopForward(Exception):
    """Raised by the last needed layer's hook; never leaves `StopAfter`'s ``with`` block."""


def last_needed_layer(names: Sequence[str], n_layers: int) -> int:
    """The last decoder layer whose computation any of the hook ``names`` reads (a resid_pre of layer l reads
    layers < l, but stopping at the end of layer l keeps the rule one line and costs one layer at most)."""
    if not names:
        raise ValueError("no hook names to stop after")
    return max(parse_hook_name(name, n_layers)[0] for name in names)


class StopAfter(ScopedHooks):
    """Ends every forward pass run in this context once decoder layer ``layer`` has run (`stop_after`)."""

    def __init__(self, lm, layer: int):
        self.lm = language_model(lm)
        if not 0 <= layer < self.lm.n_layers:
            raise ValueError(f"layer {layer} is not one of the model's 0..{self.lm.n_layers - 1}")
        self.layer = layer
        self._handles: list = []

    def _block(self):
        if self.lm.backend == "transformer_lens":
            return self.lm.model.blocks[self.layer]
        return decoder_layers(self.lm.model)[self.layer]

    def _register(self) -> None:
        def on_output(module, inputs, output):
            if self._active():
                raise _StopForward
            return None

        self._handles.append(self._block().register_forward_hook(on_output))

    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        return exc_type is not None and issubclass(exc_type, _StopForward)


def stop_after(lm, names: Sequence[str]) -> StopAfter:
    """A `StopAfter` at the last layer the hook ``names`` need (see the module's docstring)."""
    lm = language_model(lm)
    return StopAfter(lm, last_needed_layer(names, lm.n_layers))


__all__ = ["StopAfter", "last_needed_layer", "stop_after"]

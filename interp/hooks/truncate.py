"""Stop a language model's forward pass, or a generation's final denoiser call, after the last layer or block a
capture needs.

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

The denoiser's version, `stop_after_blocks` (or `capture_updates(..., stop_after_last=True)`, which enters one
after its own hooks), is for captures whose caller throws the image away (the store's collectors,
`stream_vectors`). Every denoiser call of a generation but the last runs whole: later steps read its output. The
final call runs until the last needed block, in the order the call runs them (a U-Net's down, mid, then up blocks;
a DiT's blocks in turn: `DenoiserFamily.execution_order`), and ends there; the rest of the denoiser, the scheduler's
last step and the VAE decode never run. A one-step model (the toy, SDXL Turbo) captured at its mid block skips its
whole up path. Which call is the last is the scheduler's own count (`GenerationCall.last_call`: one call per entry
of its timesteps, Heun's 2 a step but the last); where it cannot be known (outside `run_pipeline`, options that
cut the timesteps, a scheduler that starts part-way) the generation runs whole. The ``with`` block swallows the
private exception, so the pipeline call inside returns nothing:

    with capture_updates(model, ["mid_block.attentions.0"], stop_after_last=True) as cap:
        generate(model, prompts, output_type="latent")   # returns nothing: ended at the final call's mid block

Other sessions active in the same context are respected: if one records a block of the same denoiser that runs
later (an outer capture), or is not a session this module knows, the final call runs whole.
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


# ----------------------------------------------------------------------------- a denoiser's final call

def last_needed_block(model_or_unet, sites: Sequence[str]) -> str:
    """The block, of those the ``sites`` (blocks, or joint blocks' `<block>:text`) name, that a denoiser call runs
    last."""
    from ..models.denoisers import family_of_module
    from ..names import split_site
    from .diffusion import resolve_blocks, unet_of

    denoiser = unet_of(model_or_unet)
    blocks = {split_site(site)[0] for site in resolve_blocks(model_or_unet, list(sites))}
    order = family_of_module(denoiser).execution_order(denoiser)
    return max(blocks, key=order.index)


def _reads_after(session, denoiser, position: int, order: list[str]) -> bool:
    """Whether another active session may need the denoiser past block ``order[position]`` (True when unsure)."""
    from ..names import split_site
    from .diffusion import EditSession, NeuronCapture, UNetSession

    if isinstance(session, StopAfterBlocks):
        return session.unet is denoiser and order.index(session.block) > position
    if isinstance(session, EditSession):
        return False  # it changes outputs this generation throws away; what it edits earlier runs
    if isinstance(session, (UNetSession, NeuronCapture)):
        if session.unet is not denoiser:
            return False
        blocks = session.sites if isinstance(session, NeuronCapture) else session.modules
        return any(order.index(split_site(site)[0]) > position for site in blocks)
    if getattr(session, "lm", None) is not None:
        return False  # a language model's session
    unet = getattr(session, "unet", None)
    return unet is None or unet is denoiser  # hooks of its own on this denoiser, or unknown: it may read on


class _StopGeneration(_StopForward):
    """Raised by a `StopAfterBlocks` hook; never leaves that session's ``with`` block."""

    def __init__(self, session):
        super().__init__()
        self.session = session


class StopAfterBlocks(ScopedHooks):
    """Ends each generation run in this context at its final denoiser call, once ``block`` has run
    (`stop_after_blocks`). ``stopped``: how many generations it ended early."""

    def __init__(self, model_or_unet, block: str):
        from ..models.denoisers import family_of_module
        from ..names import block_name
        from .diffusion import resolve_blocks, unet_of

        self.unet = unet_of(model_or_unet)
        self.block = block_name(block)
        self.module = resolve_blocks(model_or_unet, [self.block])[self.block]
        self.order = family_of_module(self.unet).execution_order(self.unet)
        self.position = self.order.index(self.block)
        self.stopped = 0
        self._generation = None  # the GenerationCall of the generation in progress
        self._call = -1          # its denoiser call in progress
        self._final = False      # that call is the generation's last: stop it after the block
        self._handles: list = []

    def _on_denoiser_call(self, module, args, kwargs=None):
        from ..models.t2i import current_generation_call
        from .scoped import _ACTIVE_SESSIONS

        if not self._active():
            return None
        call = current_generation_call()
        if call is None:  # outside `run_pipeline`: the scheduler, and so the last call, is unknown
            self._final = False
            return None
        self._call = 0 if call is not self._generation else self._call + 1
        self._generation = call
        last = call.last_call()
        self._final = (last is not None and self._call == last and not any(
            _reads_after(s, self.unet, self.position, self.order) for s in _ACTIVE_SESSIONS.get() if s is not self))
        return None

    def _on_block(self, module, args, output):
        from ..models.t2i import report_last_step

        if not self._active() or not self._final:
            return None
        self._final = False
        self.stopped += 1
        report_last_step(self._generation)
        raise _StopGeneration(self)

    def _register(self) -> None:
        self._handles.append(self.unet.register_forward_pre_hook(self._on_denoiser_call, with_kwargs=True))
        self._handles.append(self.module.register_forward_hook(self._on_block))

    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        return isinstance(exc, _StopGeneration) and exc.session is self


def stop_after_blocks(model_or_unet, sites: Sequence[str]) -> StopAfterBlocks:
    """A `StopAfterBlocks` at the block of ``sites`` a denoiser call runs last (see the module's docstring). Enter it
    after the capture it serves, so that the capture's hook on that block records first:

        with capture_updates(model, sites) as cap, stop_after_blocks(model, sites):
            generate(model, prompts, output_type="latent")
    """
    return StopAfterBlocks(model_or_unet, last_needed_block(model_or_unet, sites))


__all__ = ["StopAfter", "StopAfterBlocks", "last_needed_block", "last_needed_layer", "stop_after",
           "stop_after_blocks"]

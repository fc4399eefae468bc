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

Each kind's truncation lives with its kind's hooks, so that neither imports this module: `StopAfter` / `stop_after`
in `interp.hooks.lm` (`forward_padded(stop_after=names)`), `StopAfterBlocks` / `stop_after_blocks` in
`interp.hooks.diffusion` (`capture_updates(stop_after_last=True)`); this module names both.
"""

from .diffusion import StopAfterBlocks, last_needed_block, stop_after_blocks
from .lm import StopAfter, last_needed_layer, stop_after

__all__ = ["StopAfter", "StopAfterBlocks", "last_needed_block", "last_needed_layer", "stop_after",
           "stop_after_blocks"]

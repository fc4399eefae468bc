"""Capture and intervention on named sites of a model, as context managers: one layer for both model kinds.

Every session is a `ScopedHooks` (`interp.hooks.scoped`): its forward hooks are registered when the
``with`` starts, removed when it ends (also when it raises), and act only in the context (thread,
asyncio task) that entered it, so sessions on one shared model in several threads never see each
other's forward passes. Each model kind has its table of sites:

- text-to-image (a `T2IModel`, a diffusers pipeline or its U-Net; `interp.hooks.diffusion`): the
  U-Net's transformer blocks (``mid_block.attentions.0``, ...: `hookable_blocks`), whose *update*
  (output - input) is captured and edited per denoising step, and their MLP neurons (`capture_neurons`);
- language models (an `interp.models.lm.LanguageModel`; `interp.hooks.lm`): the residual stream under
  TransformerLens' names, ``blocks.{l}.hook_resid_pre|resid_mid|resid_post``, on both backends;
  edits are `LMEdit`s (`interp.hooks.lm_steer`), SAE splices `interp.hooks.lm_splice`.

`capture(model, sites)` and `intervene(model, edits)` serve both kinds::

    with capture(t2i, ["mid_block.attentions.0"]) as cap:          # a T2IModel: capture_updates
        generate(t2i, "a red circle", steps=4)
    cap.updates("mid_block.attentions.0")                           # (steps, batch, C, H, W)

    with capture(lm, ["blocks.2.hook_resid_post"]) as cap:         # a LanguageModel: residual_capture
        lm.model(input_ids)
    cap.activations["blocks.2.hook_resid_post"]                     # (batch, positions, d_model)

    with intervene(t2i, [Edit("mid_block.attentions.0", "ablate")]):           # apply_edits
        image = generate(t2i, "a red circle", steps=4)
    with intervene(lm, [LMEdit("blocks.2.hook_resid_post", "add", direction=d, strength=4.0)]):
        logits = lm.model(input_ids).logits                                   # apply_lm_edits
"""

from .diffusion import (
    BlockCapture,
    Cancelled,
    EditSession,
    HookError,
    StepRecord,
    apply_edits,
    capture_updates,
    generate,
    hookable_blocks,
    on_each_step,
    private_pipeline,
    resolve_blocks,
    run_pipeline,
)
from ..models.protocol import register_sessions
from ..names import LM, T2I
from .scoped import ScopedHooks

__all__ = [
    "BlockCapture", "Cancelled", "EditSession", "HookError", "ScopedHooks", "StepRecord", "apply_edits", "capture",
    "capture_updates", "generate", "hookable_blocks", "intervene", "model_kind", "on_each_step", "private_pipeline",
    "resolve_blocks", "run_pipeline",
]

# The language-model side lives in its own module.
from . import lm  # noqa: E402,F401
from .lm import *  # noqa: E402,F401,F403
from .lm import __all__ as _lm_all  # noqa: E402

__all__ += list(_lm_all)


def model_kind(model) -> str:
    """``"lm"`` or ``"t2i"``: `interp.models.protocol.kind_of` (a loaded model says its kind; a bare one is told
    by what it has), with its refusal as a HookError."""
    from ..models.protocol import kind_of

    try:
        return kind_of(model)
    except ValueError as error:
        raise HookError(f"cannot hook: {error}") from None


def capture(model, sites, **options):
    """Context manager recording ``sites`` of ``model`` in the forward passes of this context.

    A text-to-image model: ``sites`` are U-Net block names and this is `capture_updates(model, sites,
    **options)` (``keep_output``, ``device``, ``dtype``, ``stop_after_last``); read ``.updates(block)``. A
    language model: ``sites`` are residual hook names and this is `residual_capture(model, sites, **options)`
    (``last_index``, ``keep_graph``); read ``.activations[name]``.
    """
    if model_kind(model) == LM:
        return lm.residual_capture(model, sites, **options)
    return capture_updates(model, sites, **options)


def intervene(model, edits, **options):
    """Context manager applying ``edits`` to the forward passes of this context.

    A text-to-image model: `interp.edits.Edit`s (or their dicts) on block updates, `apply_edits(model, edits,
    **options)` (``saes``, ``n_steps``). A language model: `interp.hooks.lm_steer.LMEdit`s (or their dicts) on
    the residual stream, `apply_lm_edits(model, edits, **options)` (``saes``, ``prompt_length``).
    """
    if model_kind(model) == LM:
        return _intervene_lm(model, edits, **options)
    return apply_edits(model, edits, **options)


def _lm_sites(model) -> list[str]:
    return lm.residual_hook_names(model.n_layers, lm.model_sites(model))


def _intervene_lm(model, edits, **options):
    from .lm_steer import apply_lm_edits

    return apply_lm_edits(lm.language_model(model), edits, **options)


# A loaded model's capture / intervene (`interp.models.protocol.LoadedModel`) are these sessions.
register_sessions(LM, lm.residual_capture, _intervene_lm, _lm_sites)
register_sessions(T2I, capture_updates, apply_edits)

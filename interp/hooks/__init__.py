"""Capture and intervention on named modules, as context managers.

Diffusion (`interp.hooks.diffusion`): block updates of a diffusers U-Net, edits applied
during generation. Language models: `interp.hooks.lm`.
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

__all__ = [
    "BlockCapture", "Cancelled", "EditSession", "HookError", "StepRecord", "apply_edits", "capture_updates",
    "generate", "hookable_blocks", "on_each_step", "private_pipeline", "resolve_blocks", "run_pipeline",
]

# The language-model side lives in its own module.
from . import lm  # noqa: E402,F401
from .lm import *  # noqa: E402,F401,F403
from .lm import __all__ as _lm_all  # noqa: E402

__all__ += list(_lm_all)

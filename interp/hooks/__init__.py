"""Capture and intervention on named modules, as context managers.

Diffusion (`interp.hooks.diffusion`): block updates of a diffusers U-Net, edits applied
during generation. Language models: `interp.hooks.lm`.
"""

from .diffusion import (
    BlockCapture,
    EditSession,
    HookError,
    StepRecord,
    apply_edits,
    capture_updates,
    generate,
    hookable_blocks,
    private_pipeline,
    resolve_blocks,
    run_pipeline,
)

__all__ = [
    "BlockCapture", "EditSession", "HookError", "StepRecord", "apply_edits", "capture_updates", "generate",
    "hookable_blocks", "private_pipeline", "resolve_blocks", "run_pipeline",
]

try:  # the language-model side lives in its own module
    from . import lm  # noqa: F401
    from .lm import *  # noqa: F401,F403
    from .lm import __all__ as _lm_all
    __all__ += list(_lm_all)
except ImportError:
    pass

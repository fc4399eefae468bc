"""Loading models by one code path: embedded toys, SDXL Turbo / SDXL base, LLMs.

The names below are imported from their modules on first use, so that `interp.models.spec` (which only looks at
names and files) answers without importing torch, transformers and diffusers: the app checks its arguments so."""

import importlib

_EXPORTS = {"LanguageModel": "lm", "LMError": "lm", "embedded_lms": "lm", "load_lm": "lm",
            "KNOWN_MODELS": "t2i", "SDXL_BLOCKS": "t2i", "TOY_BLOCKS": "t2i", "BlockInfo": "t2i", "ModelError": "t2i",
            "T2IModel": "t2i", "block_info": "t2i", "default_blocks": "t2i", "load_t2i": "t2i",
            "ModelSpec": "spec", "model_spec": "spec", "LoadedModel": "protocol", "kind_of": "protocol"}

__all__ = ["KNOWN_MODELS", "SDXL_BLOCKS", "TOY_BLOCKS", "BlockInfo", "LMError", "LanguageModel", "LoadedModel",
           "ModelError", "ModelSpec", "T2IModel", "block_info", "default_blocks", "embedded_lms", "kind_of", "load_lm",
           "load_t2i", "model_spec"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    try:  # a submodule reached as an attribute (interp.models.t2i) before anything imported it
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

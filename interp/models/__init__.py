"""Loading models by one code path: embedded toys, SDXL Turbo / SDXL base, LLMs."""

from .lm import LanguageModel, LMError, embedded_lms, load_lm
from .t2i import (KNOWN_MODELS, SDXL_BLOCKS, TOY_BLOCKS, BlockInfo, ModelError, T2IModel, block_info, default_blocks,
                  load_t2i)

__all__ = ["KNOWN_MODELS", "SDXL_BLOCKS", "TOY_BLOCKS", "BlockInfo", "LMError", "LanguageModel", "ModelError",
           "T2IModel", "block_info", "default_blocks", "embedded_lms", "load_lm", "load_t2i"]

"""Loading models by one code path: embedded toys, SDXL Turbo / SDXL base, LLMs."""

from .t2i import KNOWN_MODELS, SDXL_BLOCKS, BlockInfo, ModelError, T2IModel, block_info, load_t2i

__all__ = ["KNOWN_MODELS", "SDXL_BLOCKS", "BlockInfo", "ModelError", "T2IModel", "block_info", "load_t2i"]

"""The loaded language model's type, below both the loader (`interp.models.lm`) and the hooks (`interp.hooks.lm`).

`LanguageModel` is what `load_lm` returns and what every LM hook takes (`interp.hooks.lm.language_model` wraps a bare
Hugging Face or TransformerLens model in one). It lives here, not in the loader, so that the hooks read it without
importing the loader, which checks TransformerLens' bridge with the hooks: no import circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..names import LM
from .protocol import Hookable, lm_form, sessions  # noqa: F401 - lm_form: also named here


class LMError(ValueError):
    """A model that cannot be loaded as asked; the message says what is missing and what to do."""


@dataclass
class LanguageModel(Hookable):
    """A loaded causal LM: the model, its tokenizer and the sizes hooks need; a `interp.models.protocol.LoadedModel`
    (``kind`` "lm", ``sites``, ``capture``, ``intervene``, ``describe``).

    ``model`` is a Hugging Face ``PreTrainedModel`` (backend ``"hf"``) or a TransformerLens
    ``HookedTransformer`` (backend ``"transformer_lens"``), in eval mode.
    """

    kind = LM  # the protocol's: a class attribute, not a field

    model: Any
    tokenizer: Any
    n_layers: int
    d_model: int
    n_ctx: int
    backend: str
    name: str

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def sites(self) -> list[str]:
        """Every residual hook name a capture accepts (the site table's, or the TransformerLens hook points checked
        at load), in forward order (`interp.hooks.lm.model_sites`, through the hooks' registration)."""
        return sessions(LM).sites(self)

    def describe(self) -> dict:
        return {"model": self.name, "kind": LM, "backend": self.backend, "n_layers": self.n_layers,
                "d_model": self.d_model, "n_ctx": self.n_ctx, "sites": self.sites}


def use_chat_template(tokenizer, requested: bool | None = None) -> bool:
    """Whether prompts go through the tokenizer's chat template: ``None`` (the default everywhere) means
    yes for a chat model (a tokenizer with a template), no otherwise; ``True`` without a template is an error."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if requested and not has_template:
        raise LMError("a chat template was asked for but the tokenizer has none (use --no-chat-template)")
    return has_template if requested is None else bool(requested)


def context_length(config) -> int | None:
    """The model's context in tokens, or None when its config does not say."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "n_ctx"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def hf_n_ctx(config) -> int:
    """The model's context in tokens (2048 when its config does not say)."""
    return context_length(config) or 2048


__all__ = ["LMError", "LanguageModel", "hf_n_ctx", "lm_form", "use_chat_template"]

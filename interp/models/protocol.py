"""What a loaded model of either kind offers, as one small protocol: `LoadedModel` (``kind``, ``name``, ``sites``,
``capture``, ``intervene``, ``describe``), which `interp.models.language_model.LanguageModel` and
`interp.models.t2i_model.T2IModel` both implement, so commands and the UI ask the model instead of testing its
name, its type or its files.

    model = model_spec("toy-chat").load()
    model.kind                                  # "lm" (interp.names' vocabulary)
    model.sites                                 # every name a capture accepts
    with model.capture(["blocks.2.hook_resid_post"]) as cap: ...   # interp.hooks.capture(model, sites)
    with model.intervene([LMEdit(...)]): ...                        # interp.hooks.intervene(model, edits)

The sessions themselves are `interp.hooks`' (above this module): it registers its capture and intervention for each
kind when it is imported (`register_sessions`), as the nnsight backend registers with the site table, and a loaded
model asking before anything imported the hooks imports them by name (`sessions`). `kind_of` answers for anything a
hook takes: a `LoadedModel` says its kind; a bare Hugging Face or TransformerLens model (`lm_form`) or a diffusers
pipeline or denoiser is told by what it has (the one duck typing of bare models).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

from ..names import KINDS, LM, T2I


@runtime_checkable
class LoadedModel(Protocol):
    """A loaded model of either kind, as commands and the UI use it."""

    name: str

    @property
    def kind(self) -> str:
        """``"lm"`` or ``"t2i"`` (`interp.names`)."""

    @property
    def sites(self) -> Any:
        """Every site name a capture of it accepts (an LM's residual and MLP hook names; a pipeline's blocks and
        text streams)."""

    def capture(self, sites, **options):
        """A context manager recording ``sites`` in this context's forward passes (`interp.hooks.capture`)."""

    def intervene(self, edits, **options):
        """A context manager applying ``edits`` in this context's forward passes (`interp.hooks.intervene`)."""

    def describe(self) -> dict:
        """What it offers hooks, as JSON data."""


class Sessions(NamedTuple):
    """What `interp.hooks` registers for a kind: ``capture(model, sites, **options)``, ``intervene(model, edits,
    **options)`` and ``sites(model)`` (the names a capture accepts, where the site table decides them)."""

    capture: Callable
    intervene: Callable
    sites: Callable | None = None


_SESSIONS: dict[str, Sessions] = {}


def register_sessions(kind: str, capture: Callable, intervene: Callable, sites: Callable | None = None) -> None:
    """`interp.hooks` registers a kind's sessions (`Sessions`), which a `LoadedModel`'s methods run."""
    if kind not in KINDS:
        raise ValueError(f"a model's kind is one of {', '.join(KINDS)}, not {kind!r}")
    _SESSIONS[kind] = Sessions(capture, intervene, sites)


def sessions(kind: str) -> Sessions:
    """A kind's sessions, as `interp.hooks` registered them (imported by name when nothing has yet: the one arrow
    from the models up to the hooks, late-bound so that no import circle forms)."""
    if kind not in _SESSIONS:
        importlib.import_module("interp.hooks")  # registers both kinds' sessions on import
    return _SESSIONS[kind]


class Hookable:
    """The protocol's capture and intervention for a loaded model type with a ``kind``: the hooks' sessions."""

    def capture(self, sites, **options):
        return sessions(self.kind).capture(self, sites, **options)

    def intervene(self, edits, **options):
        return sessions(self.kind).intervene(self, edits, **options)


def lm_form(model) -> str | None:
    """How a loaded language model comes (the one place of the bare models' duck typing; `interp.models.protocol.
    kind_of` and `interp.hooks.lm.language_model` ask it): ``"loaded"`` (a `LanguageModel`), ``"transformer_lens"`` (a
    bare ``HookedTransformer``), ``"hf"`` (a bare Hugging Face model with a ``num_hidden_layers`` config, peft-wrapped
    too), or None (not a language model)."""
    if isinstance(model, Hookable) and model.kind == LM:  # a loaded model says its kind
        return "loaded"
    if hasattr(model, "hook_dict") and hasattr(model, "cfg"):
        return "transformer_lens"
    if getattr(getattr(model, "config", None), "num_hidden_layers", None) is not None:
        return "hf"
    return None


def kind_of(model) -> str:
    """``"lm"`` or ``"t2i"`` of anything a hook takes: a `LoadedModel` (a `LanguageModel`, a `T2IModel`) says its
    kind; a bare language model (a Hugging Face causal LM, peft-wrapped too, or a TransformerLens
    ``HookedTransformer``: `interp.models.language_model.lm_form`) is ``"lm"``; a diffusers pipeline or U-Net is
    ``"t2i"``; a ValueError naming the type for anything else."""
    if isinstance(model, Hookable):  # the protocol's implementations (a class check: no property is run)
        return model.kind
    if hasattr(model, "unet") or (hasattr(model, "down_blocks") and hasattr(model, "up_blocks")):
        return T2I
    if lm_form(model) is not None:
        return LM
    raise ValueError(f"cannot tell what {type(model).__name__} is: expected a T2IModel, a diffusers pipeline or "
                     f"denoiser, or a language model (interp.models.lm.LanguageModel)")


__all__ = ["Hookable", "LoadedModel", "Sessions", "kind_of", "lm_form", "register_sessions", "sessions"]

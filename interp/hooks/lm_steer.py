"""Steering a language model by SAE features while it generates, scoped to the calling context: the edits
(`interp.hooks.lm_edits.LMEdit`, data with their checks and arithmetic) applied at the residual hooks.

Positions: ``"prompt"`` (the prompt's tokens), ``"generated"`` (the tokens the model has
generated, as they are fed back in) or ``"all"``. With a KV cache (`interp.models.generation.
greedy_generate`, ``model.generate``) the prompt is the first forward pass of a generation (the
cache is empty) and every later pass holds the new token(s) of one step: absolute position
``cache length + column`` is generated when it lies at or past the prompt's end. The first
generated token is predicted from the prompt alone, so a ``"generated"`` edit changes the
completion from its second token on. A forward pass without a cache is all prompt, unless the
session was given ``prompt_length`` (columns at or past it are generated: a full forward pass over
prompt + completion then matches what cached generation computed).

    with apply_lm_edits(lm, [LMEdit("blocks.2.hook_resid_post", "add", feature=7, strength=8.0)],
                        saes={"blocks.2.hook_resid_post": sae}):
        greedy_generate(lm.model, lm.tokenizer, texts)

A session's hooks act only in the context (thread, asyncio task) that entered it (a `ScopedHooks`
of `interp.hooks.scoped`: the set of active sessions is a `ContextVar`), so two threads generating on one
shared model, each inside its own ``with``, never see each other's edits. Nothing stays registered
once the ``with`` ends. On a TransformerLens model (``backend="transformer_lens"``) the edits act at its own
hook points, and `generate` decodes without a KV cache (a full pass per new token, told where the prompt ends).

The readout feature cards use (`readout`, `logit_effects`) is `interp.hooks.lm_readout`'s.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..edits import EditError
from .lm import LMHookError, check_hooks, format_prompts, language_model, parse_hook_name, tl_stream_shape
# The edits and the readout had their home here: their names are still importable from this module.
from .lm_edits import (LM_EDIT_MODES, MAX_LM_STRENGTH, POSITIONS, RESIDUAL_HOOK, LMEdit, check_sae_fits,  # noqa: F401
                       edit_residual, is_residual_hook, lm_edits_from_json, sae_hook, validate_lm_edits)
from .lm_readout import _table_model, logit_effects, readout  # noqa: F401
from .lm_sites import lm_sites, register_stream_hooks
from .scoped import ScopedHooks


# ----------------------------------------------------------------------------- sessions

def _first(value):
    return value[0] if isinstance(value, (tuple, list)) else value


def _replace_first(value, tensor):
    if isinstance(value, tuple):
        return (tensor,) + tuple(value[1:])
    if isinstance(value, list):
        return [tensor] + list(value[1:])
    return tensor


def _cache_of(args, kwargs):
    for key in ("cache", "past_key_values"):
        if kwargs.get(key) is not None:
            return kwargs[key]
    if len(args) > 1 and hasattr(args[1], "get_seq_length"):
        return args[1]
    return None


def _cached_length(cache) -> int:
    if cache is None:
        return 0
    if hasattr(cache, "get_seq_length"):
        return int(cache.get_seq_length())
    try:  # legacy tuple of (key, value) per layer: (batch, heads, positions, d_head)
        return int(cache[0][0].shape[-2])
    except (TypeError, IndexError, AttributeError):
        return 0


class LMSteerSession(ScopedHooks):
    """Forward hooks on a Hugging Face LM that edit residuals, active only in the context that entered it
    (`ScopedHooks`, shared with the U-Net sessions). Use through `apply_lm_edits`."""

    def __init__(self, lm, edits: Sequence[LMEdit | dict], saes: dict | None = None,
                 prompt_length: int | None = None):
        lm = language_model(lm)
        edits = [e if isinstance(e, LMEdit) else LMEdit.from_dict(e) for e in edits]
        if not edits:
            raise EditError("no edit given")
        saes = dict(saes or {})
        validate_lm_edits(lm, edits, saes)
        try:
            check_hooks(lm, [edit.hook for edit in edits])  # a site the model lacks, or one not checked at load
        except LMHookError as error:
            raise EditError(str(error)) from None
        if prompt_length is not None and (isinstance(prompt_length, bool) or prompt_length < 0):
            raise EditError(f"prompt_length must be a non-negative number of positions, not {prompt_length!r}")
        self.lm = lm
        self.edits = edits
        self.saes = saes
        self.prompt_length = prompt_length
        self.by_hook: dict[str, list[LMEdit]] = {}
        for edit in edits:
            self.by_hook.setdefault(edit.hook, []).append(edit)
        self.calls = 0               # forward passes of the model seen in the owning context
        self._cached = 0             # positions in the cache before the current pass
        self._prompt_end: int | None = None  # absolute position where the prompt of this generation ends
        self._handles: list = []

    # Hooks are registered with kwargs, but torch adds a hook to the module before marking it as taking kwargs:
    # another thread's forward on the shared model can call it in between without them. That call is never
    # this session's (it is active only in its own context), so the hooks accept both forms and return at once.
    def _on_model_call(self, module, args, kwargs=None):
        if not self._active():
            return None
        kwargs = kwargs or {}
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        width = int(ids.shape[1]) if ids is not None and ids.dim() > 1 else 0
        self._cached = _cached_length(_cache_of(args, kwargs))
        if self._cached == 0:
            self._prompt_end = self.prompt_length if self.prompt_length is not None else width
        elif self._prompt_end is None:  # a cache filled outside the session: all of it was the prompt
            self._prompt_end = self._cached
        self.calls += 1
        return None

    def _columns(self, positions: str, width: int) -> slice | None:
        """The columns of the current pass that an edit on `positions` touches (None: none)."""
        if positions == "all":
            return slice(0, width)
        end = self._prompt_end if self._prompt_end is not None else self._cached + width
        boundary = min(max(end - self._cached, 0), width)  # columns before it are prompt
        columns = slice(0, boundary) if positions == "prompt" else slice(boundary, width)
        return columns if columns.stop > columns.start else None

    def edit_stream(self, hook: str, hidden: torch.Tensor) -> torch.Tensor:
        """The edited residual (batch, positions, d_model); the same tensor when no edit acts in this pass."""
        result = hidden
        for edit in self.by_hook.get(hook, ()):
            columns = self._columns(edit.positions, hidden.shape[1])
            if columns is None:
                continue
            if result is hidden:
                result = hidden.clone()  # the input may be kept elsewhere (a capture's detached view)
            part = result[:, columns]
            b, t, d = part.shape
            result[:, columns] = edit_residual(part.reshape(b * t, d), edit, self.saes.get(hook)).reshape(b, t, d)
        return result

    def _register(self) -> None:
        model = self.lm.model
        self._handles.append(model.register_forward_pre_hook(self._on_model_call, with_kwargs=True))
        # a TransformerBridge of a family the site table has runs the Hugging Face modules: edited through the table;
        # a HookedTransformer, or a bridge of a family the table lacks, at its own (checked) hook points
        wrapped = _table_model(model) if self.lm.backend == "transformer_lens" else model
        if wrapped is None:
            shape = tl_stream_shape(self, model, {parse_hook_name(h, self.lm.n_layers)[0] for h in self.by_hook})
            for hook in self.by_hook:
                point = model.hook_dict.get(hook)
                if point is None:
                    raise EditError(f"{hook} is not a hook point of this TransformerLens model")

                def on_point(module, args, output, hook=hook):
                    if not self._active():
                        return None
                    stream = shape.unflatten(output)
                    edited = self.edit_stream(hook, stream)
                    return None if edited is stream else edited.reshape(output.shape)

                self._handles.append(point.register_forward_hook(on_point))
            return
        sites = lm_sites(wrapped)
        for hook in self.by_hook:
            layer, kind = parse_hook_name(hook, self.lm.n_layers)

            def on_stream(hidden, hook=hook):
                return self.edit_stream(hook, hidden)

            register_stream_hooks(self, sites, layer, kind, on_stream, writes=True)


def apply_lm_edits(lm, edits: Sequence[LMEdit | dict], saes: dict | None = None,
                   prompt_length: int | None = None) -> LMSteerSession:
    """Context manager applying `LMEdit`s (or their dicts) to every forward pass of ``lm`` run in this
    context while it is active. ``saes``: hook name -> SAE (encode (N, d) -> (N, F), W_dec (F, d)), for
    feature edits. ``prompt_length``: for forward passes without a KV cache, where the prompt ends."""
    return LMSteerSession(lm, edits, saes=saes, prompt_length=prompt_length)


def prompt_texts(lm, prompts: Sequence[str], chat_template: bool | None = None) -> tuple[list[str], bool]:
    """(the texts to generate from, whether the tokenizer should add its special tokens): the prompts in
    the tokenizer's chat template when it has one (``chat_template=None``) or when asked."""
    from ..models.language_model import use_chat_template

    texts = format_prompts(lm.tokenizer, prompts, chat_template)
    return texts, not use_chat_template(lm.tokenizer, chat_template)


def generate(lm, prompts: str | Sequence[str], edits: Sequence[LMEdit | dict] = (), saes: dict | None = None,
             max_new_tokens: int = 32, chat_template: bool | None = None, batch_size: int = 16,
             cancel=None) -> list[str]:
    """Greedy completions of ``prompts`` with the edits applied (none: the plain model), via
    `interp.models.generation.greedy_generate` (KV cache). Safe to call from several threads on one model."""
    from ..models.generation import greedy_generate

    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    empty = [i for i, p in enumerate(prompts) if not isinstance(p, str) or not p.strip()]
    if not prompts or empty:
        raise EditError("the prompt is empty: give some text to continue" if len(prompts) <= 1 else
                        f"prompt {empty[0] if empty else 0} is empty")
    texts, add_special = prompt_texts(lm, prompts, chat_template)
    if language_model(lm).backend == "transformer_lens":
        return [_greedy_transformer_lens(lm, text, add_special, edits, saes, max_new_tokens, cancel) for text in texts]
    if not edits:
        return greedy_generate(lm.model, lm.tokenizer, texts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                               add_special_tokens=add_special, cancel=cancel)
    with apply_lm_edits(lm, edits, saes):
        return greedy_generate(lm.model, lm.tokenizer, texts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                               add_special_tokens=add_special, cancel=cancel)


def _greedy_transformer_lens(lm, text: str, add_special: bool, edits, saes, max_new_tokens: int, cancel) -> str:
    """One greedy completion on a TransformerLens model: a full forward pass over prompt + completion per new
    token (no KV cache), the edits told where the prompt ends so that ``positions`` means what it does with a
    cache. Stops at an EOS id as `interp.models.generation.greedy_generate` does."""
    import contextlib

    from ..models.generation import _cancel_check, context_length, eos_ids

    model, tokenizer = lm.model, lm.tokenizer
    ids = tokenizer(text, add_special_tokens=add_special)["input_ids"]
    if not ids:
        raise EditError("the prompt has no tokens: there is nothing to continue")
    limit = lm.n_ctx or context_length(getattr(model, "cfg", None))
    if limit is not None and len(ids) + max_new_tokens > limit:
        raise EditError(f"the prompt has {len(ids)} tokens; with max_new_tokens={max_new_tokens} it exceeds the "
                        f"model's context of {limit} tokens")
    stop = eos_ids(getattr(model, "original_model", model), tokenizer)
    check_cancel = _cancel_check(cancel)
    device = next(model.parameters()).device
    session = apply_lm_edits(lm, edits, saes, prompt_length=len(ids)) if edits else contextlib.nullcontext()
    new: list[int] = []
    with torch.inference_mode(), session:
        for _ in range(max_new_tokens):
            check_cancel()
            logits = model(torch.tensor([ids + new], device=device))
            token = int(logits[0, -1].argmax())
            new.append(token)
            if token in stop:
                break
    return tokenizer.decode(new, skip_special_tokens=True).strip()


__all__ = ["LMEdit", "LMSteerSession", "LM_EDIT_MODES", "MAX_LM_STRENGTH", "POSITIONS", "RESIDUAL_HOOK", "apply_lm_edits",
           "check_sae_fits", "edit_residual", "generate", "is_residual_hook", "lm_edits_from_json", "logit_effects",
           "prompt_texts", "readout", "sae_hook", "validate_lm_edits"]

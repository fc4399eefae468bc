"""Steering a language model by SAE features while it generates, scoped to the calling context.

An `LMEdit` is data, like the diffusion side's `interp.edits.Edit`: which residual hook
(``blocks.{l}.hook_resid_post``, also ``resid_pre`` / ``resid_mid``, TransformerLens' names as in
`interp.hooks.lm`), which mode, which SAE feature (or a raw direction), how strong, and at which
positions. The arithmetic is `interp.edits.edit_update`'s, on each position's residual vector x
(a_f: feature f's activation at x, d_f: the SAE's decoder row ``W_dec[f]``, s: strength):

- add:    x + s * d_f                 (or x + s * direction)
- scale:  x + (s - 1) * a_f * d_f     (the feature's own contribution times s)
- set:    x + (s - a_f) * d_f         (the feature's activation becomes s)
- ablate: x - a_f * d_f               (the feature's contribution removed: scale with s = 0)
          or, with a raw direction u, x - (x . u) u / |u|^2 (u's component projected out: the directional
          ablation of Arditi et al. 2024)

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

`logit_effects` gives what a direction written into the residual stream does to the next-token
logits through the model's own final norm and output head (linearised), for feature cards' promoted
and suppressed tokens.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, fields
from typing import Sequence

import numpy as np
import torch

from ..edits import Edit, EditError, edit_update
from .lm import LMHookError, check_hooks, format_prompts, language_model, parse_hook_name, tl_stream_shape
from .lm_sites import find_family, linear_logit_effects, lm_sites, register_stream_hooks
from .scoped import ScopedHooks

LM_EDIT_MODES = ("add", "scale", "set", "ablate")
POSITIONS = ("prompt", "generated", "all")
RESIDUAL_HOOK = re.compile(r"^blocks\.\d+\.hook_resid_(pre|mid|post)$")  # any model's; parse_hook_name checks one's


# |strength| of an LM edit: far above any residual norm, far below float32's overflow in a norm layer (at 1e20 the
# squares overflow and a completion came back empty; -1e39 as a "set" overflowed float32 itself)
MAX_LM_STRENGTH = 1e4


@dataclass
class LMEdit:
    """One feature edit at one residual hook of a language model, as JSON data."""

    hook: str                            # blocks.{l}.hook_resid_post (or resid_pre, resid_mid)
    mode: str                            # add | scale | set | ablate
    feature: int | None = None           # SAE feature index
    strength: float = 1.0
    direction: list[float] | None = None  # (d_model,) for add or ablate, instead of a feature
    positions: str = "all"               # prompt | generated | all

    def __post_init__(self):
        if self.mode not in LM_EDIT_MODES:
            raise EditError(f"unknown edit mode {self.mode!r}; use one of {', '.join(LM_EDIT_MODES)}")
        if self.positions not in POSITIONS:
            raise EditError(f"positions must be one of {', '.join(POSITIONS)}, not {self.positions!r}")
        if not isinstance(self.hook, str) or not self.hook:
            raise EditError(f"hook must be a hook name such as blocks.2.hook_resid_post, not {self.hook!r}")
        if isinstance(self.strength, bool) or not isinstance(self.strength, (int, float, np.floating, np.integer)) \
                or not math.isfinite(float(self.strength)):
            raise EditError(f"strength must be a finite number, not {self.strength!r}")
        self.strength = float(self.strength)
        if abs(self.strength) > MAX_LM_STRENGTH:
            raise EditError(f"strength {self.strength:g} is out of range: use -{MAX_LM_STRENGTH:g} to "
                            f"{MAX_LM_STRENGTH:g} (a residual stream's norm is far smaller; beyond that the model "
                            f"overflows and writes nothing)")
        if self.feature is not None:
            if isinstance(self.feature, bool) or not isinstance(self.feature, (int, np.integer)) or self.feature < 0:
                raise EditError(f"feature must be a non-negative index, not {self.feature!r}")
            self.feature = int(self.feature)
        if self.direction is not None:
            self.direction = [float(v) for v in np.asarray(self.direction, dtype=np.float64).reshape(-1)]
            if not all(math.isfinite(v) for v in self.direction):
                raise EditError("direction must hold finite numbers")
        if self.mode in ("add", "ablate") and (self.direction is None) == (self.feature is None):
            raise EditError(f"an {self.mode} edit needs exactly one of `direction` or `feature`")
        if self.mode not in ("add", "ablate") and self.feature is None:
            raise EditError(f"a {self.mode} edit needs `feature` (an SAE feature index)")
        if self.mode not in ("add", "ablate") and self.direction is not None:
            raise EditError(f"a {self.mode} edit takes no `direction`")
        if self.mode == "ablate" and self.direction is not None and not any(self.direction):
            raise EditError("an ablate edit's direction must not be all zeros")

    @property
    def needs_sae(self) -> bool:
        return self.feature is not None

    def as_edit(self) -> Edit:
        """The diffusion-side `Edit` with the same arithmetic (ablate is scale with strength 0)."""
        if self.mode == "ablate":
            return Edit(self.hook, "scale", feature=self.feature, strength=0.0)
        return Edit(self.hook, self.mode, feature=self.feature, strength=self.strength, direction=self.direction)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "LMEdit":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise EditError(f"unknown edit field(s) {', '.join(unknown)}; an LM edit has: {', '.join(sorted(known))}")
        missing = sorted({"hook", "mode"} - set(d))
        if missing:
            raise EditError(f"an LM edit needs {', '.join(missing)}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "LMEdit":
        return cls.from_dict(json.loads(text))


def lm_edits_from_json(text: str) -> list[LMEdit]:
    data = json.loads(text)
    return [LMEdit.from_dict(d) for d in ([data] if isinstance(data, dict) else data)]


# ----------------------------------------------------------------------------- validation

def _sae_shape(sae) -> tuple[int, int]:
    w_dec = getattr(sae, "W_dec", None)
    if w_dec is None or not hasattr(sae, "encode"):
        raise EditError(f"{type(sae).__name__} is not an SAE: it needs encode and W_dec (features, d_model)")
    return int(w_dec.shape[0]), int(w_dec.shape[1])


def is_residual_hook(name) -> bool:
    """Whether a hook name is a language model's residual hook (blocks.{l}.hook_resid_pre|mid|post)."""
    return isinstance(name, str) and RESIDUAL_HOOK.match(name) is not None


def sae_hook(sae) -> str | None:
    """The hook an SAE says it was trained on (its cfg metadata's hook_name), if it says."""
    metadata = getattr(getattr(sae, "cfg", None), "metadata", None) or {}
    return metadata.get("hook_name")


def check_sae_fits(lm, sae, hook: str | None = None, where: str = "the SAE") -> str:
    """The hook the SAE is for, checked against the model: a known residual hook and d_in = d_model.
    ``hook``: the hook it is to be used at (default: the one its metadata names)."""
    recorded = sae_hook(sae)
    hook = hook or recorded
    if hook is None:
        raise EditError(f"{where} does not say which hook it reads (no metadata.hook_name in its cfg.json); "
                        f"name the hook, e.g. blocks.2.hook_resid_post")
    if recorded is not None and recorded != hook:
        raise EditError(f"{where} was trained on {recorded}, not {hook}")
    metadata = getattr(getattr(sae, "cfg", None), "metadata", None) or {}
    trained_for = f"; it was trained on {metadata['model_name']}" if metadata.get("model_name") else \
        " (an SAE of another model?)"
    try:
        parse_hook_name(hook, lm.n_layers)
    except LMHookError as err:
        raise EditError(f"{where} reads {hook}, which {lm.name} does not have{trained_for} ({err})") from None
    _, d_in = _sae_shape(sae)
    if d_in != lm.d_model:
        raise EditError(f"{where} reads {d_in} dimensions but {lm.name}'s residual stream has {lm.d_model}"
                        f"{trained_for}")
    return hook


def validate_lm_edits(lm, edits: Sequence[LMEdit], saes: dict | None = None) -> None:
    """Check edits against a model (hook names, d_model) and their SAEs; EditError / LMHookError if not."""
    saes = saes or {}
    for i, edit in enumerate(edits):
        where = f"edit {i} ({edit.mode} at {edit.hook})"
        try:
            parse_hook_name(edit.hook, lm.n_layers)
        except LMHookError as err:
            raise EditError(f"{where}: {err}") from None
        if edit.direction is not None and len(edit.direction) != lm.d_model:
            raise EditError(f"{where}: direction has {len(edit.direction)} values but the model's residual stream "
                            f"has {lm.d_model}")
        if edit.needs_sae:
            if edit.hook not in saes:
                raise EditError(f"{where}: needs an SAE for {edit.hook}; SAEs given for: {', '.join(saes) or 'none'}")
            sae = saes[edit.hook]
            check_sae_fits(lm, sae, edit.hook, where=f"{where}: the SAE")
            n_features, _ = _sae_shape(sae)
            if not edit.feature < n_features:
                raise EditError(f"{where}: feature {edit.feature} is out of range: the SAE has {n_features} "
                                f"features, 0 to {n_features - 1}")


# ----------------------------------------------------------------------------- the arithmetic

def edit_residual(vectors: torch.Tensor, edit: LMEdit, sae=None) -> torch.Tensor:
    """Apply one edit to residual vectors (N, d_model); a new tensor, typed and placed like the input.

    The arithmetic is `interp.edits.edit_update`'s: the vectors go through it as N positions of one
    channel column each."""
    n, d = vectors.shape
    if edit.mode == "ablate" and edit.direction is not None:  # project the direction out
        unit = torch.tensor(edit.direction, dtype=torch.float64)
        unit = (unit / unit.norm()).to(device=vectors.device, dtype=torch.float32)
        x = vectors.float()
        return (x - (x @ unit)[:, None] * unit[None, :]).to(vectors.dtype)
    edited = edit_update(vectors.reshape(n, d, 1, 1), edit.as_edit(), sae)
    return edited.reshape(n, d).to(device=vectors.device, dtype=vectors.dtype)


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


def _table_model(model):
    """The Hugging Face model a TransformerBridge wraps when the site table has its family (None otherwise, and
    for a HookedTransformer)."""
    wrapped = getattr(model, "original_model", None)
    if isinstance(wrapped, torch.nn.Module) and hasattr(wrapped, "config") and \
            find_family(wrapped.config, type(wrapped).__name__) is not None:
        return wrapped
    return None


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


# ----------------------------------------------------------------------------- the unembedding

def readout(lm):
    """x (n, d_model), the stream leaving the last block -> the logits the model computes from it, through the
    model's own final-norm module and output head (`interp.hooks.lm_sites`; a TransformerLens model: its
    ``ln_final`` and ``unembed``, or for a TransformerBridge the wrapped Hugging Face model's)."""
    lm = language_model(lm)
    model = lm.model
    if lm.backend == "transformer_lens":
        wrapped = _table_model(model)
        if wrapped is not None:
            return lm_sites(wrapped).readout()
        checked = model.__dict__.get("_interp_readout")  # set by interp.models.lm.verify_transformer_lens
        if checked is not None and checked is not True:
            raise LMHookError(checked)
        norm, unembed = getattr(model, "ln_final", None), model.unembed

        def read(x: torch.Tensor) -> torch.Tensor:
            x = x[:, None, :]
            if isinstance(norm, torch.nn.Module):
                x = norm(x)
            return unembed(x)[:, 0, :]

        return read
    if model.get_output_embeddings() is None:
        raise LMHookError(f"{type(model).__name__} has no output embedding: no unembedding to read features through")
    return lm_sites(model).readout()


@torch.no_grad()
def logit_effects(lm, directions: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    """(F, vocab): the change in next-token logits per unit of each direction (F, d_model) added to the
    stream leaving the last block, linearised through the model's own final norm and output head (with
    Gemma's ``1 + weight`` gains, LayerNorm's centring, OPT's ``project_out`` and Granite's logit scaling,
    whatever the module does) at a point where the norm divides by 1 and has no component along the
    direction: for a LayerNorm that is W_U (gain * centred direction), the usual folded-norm logit weights.
    Gemma 2/3's final soft-cap ``c * tanh(logits / c)`` is part of the readout, so the effect is linearised
    through it at that point. A TransformerLens model of a family the site table lacks reads out through its own
    ``ln_final`` and ``unembed``, which `interp.models.lm.load_lm` checked against the model's logits."""
    lm = language_model(lm)
    read = readout(lm)
    parameter = next(lm.model.parameters())
    directions = directions.detach()
    d_model = lm.d_model
    if directions.dim() != 2 or directions.shape[1] != d_model:
        raise LMHookError(f"directions must be (n, {d_model}), got {tuple(directions.shape)}")
    directions = directions.to(device=parameter.device, dtype=parameter.dtype)
    return linear_logit_effects(read, directions, batch_size=batch_size)


__all__ = ["LMEdit", "LMSteerSession", "LM_EDIT_MODES", "MAX_LM_STRENGTH", "POSITIONS", "RESIDUAL_HOOK", "apply_lm_edits",
           "check_sae_fits", "edit_residual", "generate", "is_residual_hook", "lm_edits_from_json", "logit_effects", "prompt_texts",
           "readout", "sae_hook", "validate_lm_edits"]

"""The local replacement model's forward pass: attention patterns and norm scales frozen, MLPs replaced.

An attribution graph (circuit-tracer; Ameisen et al. 2025, "Circuit tracing") needs a model that is linear in
the residual stream between the nodes it draws. This session turns a Hugging Face causal LM's forward pass into
that model without changing any value the pass computes:

- every attention pattern is a constant: queries and keys reach the model's own attention function detached
  (a wrapper registered in transformers' attention interface), so a gradient flows through the values only;
- every norm's scale is a constant: each LayerNorm / RMSNorm module's output is recomputed with its
  denominator detached (the same value, checked against the module's own output: a norm the check refuses is
  one clear error, never a silently wrong graph);
- each MLP's output is handed, with the MLP's input, to ``replace(layer, mlp_input, mlp_output)``, whose
  return value the layer adds to the stream instead (a transcoder's features and an error term that together
  give back the same value, so the replacement model's logits are the model's own);
- the token embeddings (the input embedding module's output) are a leaf of the autograd graph.

The session records, for the caller's backward passes: ``embeddings`` (batch, positions, d_model), each
layer's ``mlp_inputs`` and the ``final`` stream after the final norm (the unembedding's input). Like every
hook of `interp.hooks` it is a `ScopedHooks`: it acts only in the context that entered it.
"""

from __future__ import annotations

import sys
from contextvars import ContextVar
from typing import Callable

import torch

from .lm import language_model
from .lm_sites import LMHookError, lm_sites
from .scoped import ScopedHooks

FROZEN_ATTENTION = "interp_frozen"
_FREEZING: ContextVar[bool] = ContextVar("interp_frozen_attention", default=False)
_ORIGINAL = "_interp_attention_before_freezing"


def _frozen_attention(module, query, key, value, *args, **kwargs):
    """The model's own attention function, with queries and keys detached in a freezing context."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    original = module.config.__dict__.get(_ORIGINAL, "sdpa")
    if original in (None, "eager") or original not in ALL_ATTENTION_FUNCTIONS:
        function = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if function is None:
            raise LMHookError(f"{type(module).__name__} has no eager attention function to freeze")
    else:
        function = ALL_ATTENTION_FUNCTIONS[original]
    if _FREEZING.get():
        query, key = query.detach(), key.detach()
        counter = module.config.__dict__.get("_interp_attention_calls")
        if counter is not None:
            counter.append(1)
    return function(module, query, key, value, *args, **kwargs)


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(FROZEN_ATTENTION, _frozen_attention)


def _is_norm(module: torch.nn.Module) -> bool:
    name = type(module).__name__
    return isinstance(module, torch.nn.LayerNorm) or name.endswith("RMSNorm") or name.endswith("LayerNorm")


def frozen_norm(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The norm's output ``y`` for input ``x``, recomputed with its scale detached (value equal to ``y``;
    derivative: the frozen-scale linear map). An LMHookError when no known form reproduces ``y``."""
    eps = getattr(module, "eps", None)
    eps = getattr(module, "variance_epsilon", 1e-6) if eps is None else eps
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    xf = x.float()
    candidates = []  # each form computed only when the ones before it failed
    if isinstance(module, torch.nn.LayerNorm) or type(module).__name__.endswith("LayerNorm"):
        def layer_norm():
            centred = xf - xf.mean(-1, keepdim=True)
            base = centred * torch.rsqrt(centred.detach().pow(2).mean(-1, keepdim=True) + eps)
            out = base if weight is None else base * weight
            return out if bias is None else out + bias
        candidates.append(layer_norm)

    def rms_base():
        return xf * torch.rsqrt(xf.detach().pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:  # llama-like, gemma-like
        candidates += [lambda: rms_base().to(x.dtype) * weight, lambda: rms_base() * (1.0 + weight.float())]
    else:
        candidates.append(rms_base)
    scale = 1.0 + float(y.detach().abs().max())
    for make in candidates:
        candidate = make()
        if candidate.shape == y.shape and float((candidate.detach() - y.detach()).abs().max()) <= 1e-4 * scale:
            return candidate.to(y.dtype)
    raise LMHookError(f"cannot freeze {type(module).__name__}: its output is not a LayerNorm or RMSNorm of its "
                      "input, so its scale cannot be held constant (attribution graphs need every norm frozen)")


class ReplacementPass(ScopedHooks):
    """One session of the local replacement model (see the module's docstring). ``replace(layer, x, y)`` gets
    the MLP's input ``x`` (in the autograd graph) and its output ``y`` and returns the output to use;
    ``layers``: the layers it replaces (all by default). ``same_rows``: every row of the batch is the same
    sequence (an attribution graph's batched backward passes), so the real MLP runs on the first row only and
    ``y`` is that row repeated, detached (the replacement's output must not depend on the MLP's own graph)."""

    def __init__(self, lm, replace: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
                 layers=None, same_rows: bool = False, freeze_attention: bool = True, freeze_norms: bool = True):
        self.lm = lm = language_model(lm)
        if lm.backend != "hf":
            raise LMHookError("attribution graphs run on the Hugging Face backend (load the model with backend 'hf')")
        self.sites = lm_sites(lm.model)
        self.replace = replace
        self.layer_list = list(range(lm.n_layers)) if layers is None else list(layers)
        self.same_rows = same_rows
        # both True for a graph; either False: that part's derivative is the model's own (to measure what freezing
        # it changes; a graph is only exact with both frozen)
        self.freeze_attention, self.freeze_norms = freeze_attention, freeze_norms
        self.embeddings: torch.Tensor | None = None
        self.mlp_inputs: dict[int, torch.Tensor] = {}
        self.final: torch.Tensor | None = None
        self.attention_calls: list = []
        self._handles: list = []
        self._config_state = None

    def _register(self) -> None:
        model = self.sites.model
        final_norm, _ = self.sites.readout_modules()
        if final_norm is None:
            raise LMHookError(f"{type(model).__name__} has no final norm the site table knows")
        mlps = {layer: self.sites.mlp_module(layer) for layer in self.layer_list}
        for module in model.modules():
            if _is_norm(module):
                def on_norm(mod, args, output, is_final=module is final_norm):
                    if not self._active():
                        return None
                    if not self.freeze_norms:
                        if is_final:
                            self.final = output
                        return None
                    frozen = frozen_norm(mod, args[0], output)
                    if is_final:
                        self.final = frozen
                    return frozen

                self._handles.append(module.register_forward_hook(on_norm))

        def on_embedding(module, args, output):
            if not self._active():
                return None
            self.embeddings = output.detach().requires_grad_(True)
            return self.embeddings

        self._handles.append(model.get_input_embeddings().register_forward_hook(on_embedding))
        for layer, mlp in mlps.items():
            if self.same_rows:
                def first_row(module, args, kwargs, layer=layer):
                    if not self._active():
                        return None
                    x = args[0] if args else kwargs["hidden_states"]
                    self.mlp_inputs[layer] = x
                    if args:
                        return (x[:1],) + tuple(args[1:]), kwargs
                    return args, {**kwargs, "hidden_states": x[:1]}

                self._handles.append(mlp.register_forward_pre_hook(first_row, with_kwargs=True))

            def on_mlp(module, args, kwargs, output, layer=layer):
                if not self._active():
                    return None
                if self.same_rows:
                    x = self.mlp_inputs[layer]
                else:
                    x = args[0] if args else kwargs["hidden_states"]
                    self.mlp_inputs[layer] = x
                y = output[0] if isinstance(output, tuple) else output
                if self.same_rows:  # the real MLP ran on the first row only: every row is the same input
                    y = y.detach().expand(x.shape[0], *y.shape[1:])
                new = self.replace(layer, x, y)
                return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new

            self._handles.append(mlp.register_forward_hook(on_mlp, with_kwargs=True))
        if not self.freeze_attention:
            return
        _register_attention()
        config = model.config
        self._config_state = (config._attn_implementation, config.__dict__.get(_ORIGINAL))
        config.__dict__[_ORIGINAL] = config._attn_implementation
        config.__dict__["_interp_attention_calls"] = self.attention_calls
        config._attn_implementation = FROZEN_ATTENTION

    def __enter__(self):
        super().__enter__()
        self._freezing = _FREEZING.set(True)
        return self

    def __exit__(self, *exc):
        try:
            _FREEZING.reset(self._freezing)
            if self._config_state is not None:
                config = self.sites.model.config
                config._attn_implementation = self._config_state[0]
                config.__dict__.pop("_interp_attention_calls", None)
                if self._config_state[1] is None:
                    config.__dict__.pop(_ORIGINAL, None)
                else:
                    config.__dict__[_ORIGINAL] = self._config_state[1]
        finally:
            super().__exit__(*exc)
        return False

    def check_frozen(self, n_passes: int = 1) -> None:
        """Refuse a model whose attention did not go through the frozen attention function (it does not use
        transformers' attention interface): its patterns would not be constant."""
        expected = n_passes * self.lm.n_layers
        if len(self.attention_calls) < expected:
            raise LMHookError(f"{type(self.sites.model).__name__}'s attention does not use transformers' attention "
                              f"interface ({len(self.attention_calls)} of {expected} calls came through it): its "
                              "patterns cannot be frozen for an attribution graph")


class MLPOutputEdit(ScopedHooks):
    """Each MLP of ``edits`` ({layer: f(mlp_input, mlp_output) -> new output}) has its output replaced by what
    its function returns, in this context's forward passes only; nothing is frozen (the real model runs)."""

    def __init__(self, lm, edits: dict[int, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]):
        self.lm = lm = language_model(lm)
        if lm.backend != "hf":
            raise LMHookError("MLP edits run on the Hugging Face backend (load the model with backend 'hf')")
        self.sites = lm_sites(lm.model)
        self.edits = dict(edits)
        self._handles: list = []

    def _register(self) -> None:
        for layer, edit in self.edits.items():
            def on_mlp(module, args, kwargs, output, edit=edit):
                if not self._active():
                    return None
                x = args[0] if args else kwargs["hidden_states"]
                y = output[0] if isinstance(output, tuple) else output
                new = edit(x, y)
                return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new

            self._handles.append(self.sites.mlp_module(layer).register_forward_hook(on_mlp, with_kwargs=True))


def replacement_pass(lm, replace, layers=None, same_rows: bool = False) -> ReplacementPass:
    """Context manager of the local replacement model's forward passes (see `ReplacementPass`)."""
    return ReplacementPass(lm, replace, layers, same_rows)


__all__ = ["FROZEN_ATTENTION", "MLPOutputEdit", "ReplacementPass", "frozen_norm", "replacement_pass"]

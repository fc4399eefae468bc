"""The nnsight backend: a Hugging Face causal LM whose residual sites are read and written through nnsight.

``load_lm(name, backend="nnsight")`` loads the model as the Hugging Face backend does (the same site table, the
same verified families) and wraps it in nnsight's ``LanguageModel``. Every session of `interp.hooks` then works
unchanged (capture, splice, steering, feature cards, collection, evaluation): where the Hugging Face backend
registers a torch hook at a site (`interp.hooks.lm_sites.register_stream_hooks`), this backend records the same
site function in the model's `NNsightState`, and every forward pass the workbench runs (`call_model`: padded
passes, greedy decoding steps, evaluation logits) runs inside ``wrapper.trace(...)``, where each active site
function is applied to nnsight's proxies of that module's input or output, in the order the model reaches them.
The names are the workbench's (``blocks.{l}.hook_resid_pre|mid|post``); what they mean per family is the site
table's, so the numbers equal the Hugging Face backend's (`tests/test_lm_nnsight.py`).

A forward pass that does not go through `call_model` while a site function is active on the model (a code path
this backend does not route) is refused, not run without the edit: the state's guard raises `NNsightRouteError`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch

from .lm_sites import STREAM_REGISTRARS, LMHookError, LMSites

_SITE_ORDER = {"resid_pre": 0, "resid_mid": 1, "resid_post": 2}


class NNsightRouteError(LMHookError):
    """A forward pass of an nnsight-backed model that bypassed nnsight while a site function was active."""


@dataclass
class _Entry:
    session: object
    sites: LMSites
    layer: int
    kind: str
    on_stream: Callable[[torch.Tensor], torch.Tensor | None]
    writes: bool

    def remove(self) -> None:
        state = _STATES.get(self.sites.model)
        if state is not None and self in state.entries:
            state.entries.remove(self)


@dataclass
class NNsightState:
    """The nnsight wrapper of one Hugging Face model and the site functions registered on it."""

    wrapper: object
    entries: list = field(default_factory=list)
    tracing: int = 0              # passes running through call_model now
    guard: object = None


_STATES: "weakref.WeakKeyDictionary[torch.nn.Module, NNsightState]" = weakref.WeakKeyDictionary()


def wrap(hf_model, tokenizer) -> object:
    """nnsight's ``LanguageModel`` around a loaded Hugging Face causal LM; marks the model as nnsight-backed."""
    try:
        # nnsight adds a `save` method to `object` itself when imported; beartype (which transformer-lens and
        # sae-bench use) reads `object.__dict__` when it is first imported and fails on that method, so it is
        # imported first, while `object` is still plain
        import beartype  # noqa: F401
        import nnsight
    except ImportError as error:  # pragma: no cover - nnsight is in requirements.txt
        raise LMHookError(f"the nnsight backend needs the nnsight package ({error}); pip install nnsight") from None
    import warnings

    with warnings.catch_warnings():  # nnsight 0.8 names TransformersModel its successor; LanguageModel still works
        warnings.simplefilter("ignore")
        wrapper = nnsight.LanguageModel(hf_model, tokenizer=tokenizer)
    state = NNsightState(wrapper)

    def refuse_untraced(module, args, kwargs=None):
        if any(e.session._active() for e in state.entries) and not state.tracing:
            raise NNsightRouteError("this forward pass of an nnsight-backed model does not run through nnsight "
                                    "(interp.hooks.lm_nnsight.call_model) while a site is hooked; use --backend hf")
        return None

    state.guard = hf_model.register_forward_pre_hook(refuse_untraced, with_kwargs=True)
    _STATES[hf_model] = state
    return wrapper


def state_of(model) -> NNsightState | None:
    """The nnsight state of a Hugging Face model (peft-wrapped too), or None for a model nnsight does not back."""
    from .lm_sites import hf_base_model

    if not isinstance(model, torch.nn.Module):
        return None
    state = _STATES.get(model)
    if state is None:
        try:
            state = _STATES.get(hf_base_model(model))
        except Exception:  # noqa: BLE001 - not a causal LM the site table reads: not nnsight-backed
            return None
    return state


def register(session, sites: LMSites, layer: int, kind: str, on_stream, writes: bool) -> bool:
    """Record a site function of ``session`` on an nnsight-backed model (the `register_stream_hooks` of this
    backend); False when the model is not nnsight-backed (the caller registers torch hooks)."""
    state = _STATES.get(sites.model)
    if state is None:
        return False
    entry = _Entry(session, sites, layer, kind, on_stream, writes)
    state.entries.append(entry)
    session._handles.append(entry)
    return True


def _envoy(wrapper, root: torch.nn.Module, module: torch.nn.Module):
    """nnsight's envoy of ``module`` (a submodule of ``root``), found by its path in the model."""
    path = next(name for name, m in root.named_modules() if m is module)
    envoy = wrapper
    for part in path.split("."):
        envoy = envoy[int(part)] if part.isdigit() else getattr(envoy, part)
    return envoy


def _first(value):
    return value[0] if isinstance(value, tuple) else value


def _with_first(value, first):
    return (first,) + tuple(value[1:]) if isinstance(value, tuple) else first


def _stream_input(envoy):
    """The hidden states a decoder layer (or the MLP side's first module) receives: its first positional argument,
    or the ``hidden_states`` keyword."""
    args, kwargs = envoy.inputs
    return args[0] if args else kwargs["hidden_states"]


def _set_stream_input(envoy, value) -> None:
    args, kwargs = envoy.inputs
    if args:
        envoy.inputs = ((value,) + tuple(args[1:]), kwargs)
    else:
        envoy.inputs = (args, {**kwargs, "hidden_states": value})


def call_model(model, **kwargs):
    """``model(**kwargs)`` for any Hugging Face causal LM; for an nnsight-backed one, the pass runs inside nnsight's
    trace with the active site functions applied (see the module's docstring) and returns the model's output."""
    state = state_of(model)
    if state is None:
        return model(**kwargs)
    active = sorted((e for e in state.entries if e.session._active()),   # decided here: the trace body runs in
                    key=lambda e: (e.layer, _SITE_ORDER[e.kind]))      # nnsight's own thread, outside this context
    root = active[0].sites.model if active else None
    state.tracing += 1
    try:
        with state.wrapper.trace(**kwargs):
            pending_delta: dict[int, torch.Tensor] = {}
            shapes: dict[int, torch.Size] = {}   # (batch, positions, d) of a layer whose MLP side sees it flattened
            for entry in active:
                for layer in sorted(d for d in pending_delta if d < entry.layer):  # a mid write of an earlier
                    _settle_mid(state, root, entry.sites, layer, pending_delta)     # layer, at that layer's output
                block = _envoy(state.wrapper, root, entry.sites.layers[entry.layer])
                if entry.kind in ("resid_pre", "resid_mid") and entry.sites.family.flat_mid:
                    shapes.setdefault(entry.layer, _stream_input(block).shape)
                if entry.kind == "resid_pre":
                    x = _stream_input(block)
                    y = entry.on_stream(x)
                    if entry.writes and y is not None and y is not x:
                        _set_stream_input(block, y)
                elif entry.kind == "resid_mid":
                    _apply_mid(state, root, entry, pending_delta, shapes.get(entry.layer))
                else:
                    _settle_mid(state, root, entry.sites, entry.layer, pending_delta)
                    x = _first(block.output)
                    y = entry.on_stream(x)
                    if entry.writes and y is not None and y is not x:
                        block.output = _with_first(block.output, y)
            for layer in sorted(pending_delta):
                _settle_mid(state, root, active[0].sites, layer, pending_delta)
            output = state.wrapper.output.save()
    finally:
        state.tracing -= 1
    return output


def _apply_mid(state, root, entry, pending_delta, shape) -> None:
    """resid_mid: the input of the MLP side's first module; a write replaces it there and adds the change to the
    stream where the MLP branch joins it (the block's output, or the family's mid_add module), as the Hugging Face
    backend's hooks do."""
    sites = entry.sites
    mid = _envoy(state.wrapper, root, sites.mid_module(entry.layer))
    flat = _stream_input(mid)
    x = flat.view(shape) if shape is not None else flat   # OPT's MLP side sees (batch * positions, d)
    y = entry.on_stream(x)
    if entry.writes and y is not None and y is not x:
        _set_stream_input(mid, y.reshape(flat.shape))
        pending_delta[entry.layer] = pending_delta.get(entry.layer, 0) + (y - x)
        add = sites.mid_add_module(entry.layer)
        if add is not None:
            add_envoy = _envoy(state.wrapper, root, add)
            delta = pending_delta.pop(entry.layer)
            _set_stream_input(add_envoy, _stream_input(add_envoy) + delta.reshape(_stream_input(add_envoy).shape))


def _settle_mid(state, root, sites, layer, pending_delta) -> None:
    """Add a resid_mid write's change to the block's output (families without a mid_add module)."""
    if layer not in pending_delta:
        return
    delta = pending_delta.pop(layer)
    block = _envoy(state.wrapper, root, sites.layers[layer])
    out = _first(block.output)
    block.output = _with_first(block.output, out + delta.reshape(out.shape))


STREAM_REGISTRARS.append(register)

__all__ = ["NNsightRouteError", "NNsightState", "call_model", "register", "state_of", "wrap"]

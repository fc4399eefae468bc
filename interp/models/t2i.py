"""Loading text-to-image pipelines by one code path: the embedded toy model, SDXL Turbo, SDXL base, or any local
directory saved with `save_pretrained`, from the model's spec (`interp.models.spec.model_spec`: the one resolution
of a name). The registry of known models is `interp.models.t2i_registry`, the loaded type `interp.models.t2i_model`,
the generation runtime `interp.models.t2i_generation`; their names are re-exported here for older callers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .denoisers import DenoiserFamily, UnsupportedPipeline, denoiser_of, family_of, family_of_index
from .t2i_generation import (  # noqa: F401 - re-exported
    TIMESTEP_OPTIONS, Cancelled, GenerationCall, current_generation_call, do_cfg, generate, on_each_step,
    one_step_clean_sample, pipeline_default, private_pipeline, report_last_step, run_pipeline, seeded_steps)
from .t2i_model import (  # noqa: F401 - re-exported
    MAX_SEED, MAX_SIDE, MAX_STEPS, BlockInfo, T2IModel, TextStreamInfo, block_info, default_latent_side,
    text_stream_info)
from .spec import ModelSpec, model_spec, register_loader
from ..names import T2I
from .t2i_registry import (  # noqa: F401 - re-exported
    KNOWN_MODELS, RECIPE_FILE, SDXL_BLOCKS, TOY_BLOCKS, KnownModel, ModelError, default_blocks, known_model,
    recipe_made, registry_entry)

def resolve(name_or_path: "str | ModelSpec") -> tuple[str, KnownModel | None]:
    """(what ``from_pretrained`` reads, the registry entry): the model's spec's (`ModelSpec.locate` and
    ``.entry``: the one resolution; a name that cannot say is read as a text-to-image model)."""
    spec = model_spec(name_or_path, kind=T2I)
    return spec.locate(T2I)[0], spec.entry


def check_device(device: str) -> None:
    """A ModelError unless a model can be placed on `device` on this machine (cpu, cuda, cuda:N, mps)."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ModelError(f"unknown device {device!r}: use cpu, cuda or cuda:N") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ModelError(f"device {device!r} is not available: {why}; use --device cpu")
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise ModelError(f"device {device!r} is not available: this machine has {count} CUDA device(s), "
                             f"cuda:0 to cuda:{count - 1}")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ModelError(f"device {device!r} is not available: no Apple GPU (MPS) here; use --device cpu")


def _saved_family(source: str) -> DenoiserFamily:
    """The family a saved pipeline's model_index.json names, refused in one line before anything loads."""
    index_file = Path(source) / "model_index.json"
    try:
        model_index = json.loads(index_file.read_text())
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot read {index_file}: {err}") from None
    try:
        return family_of_index(model_index)
    except UnsupportedPipeline as err:
        raise ModelError(str(err)) from None


def load_t2i(name_or_path: "str | ModelSpec" = "toy", device: str | None = None, dtype: torch.dtype | None = None,
             allow_download: bool | None = None) -> T2IModel:
    """Load a pipeline from its spec (`interp.models.spec.model_spec`), or by what one is made of: a name ("toy",
    "sdxl-turbo", "sdxl-base"), hub id or directory, as the class its model_index.json names
    (`DiffusionPipeline`): SD 1.x / 2.x / SDXL U-Nets, SD3, FLUX, PixArt, Sana. The steps, guidance, analysed
    blocks and world are the spec's registry entry's (an unknown model: its pipeline class's own defaults).

    Real models come from the local Hugging Face cache or the hub (only when
    `allow_download`, default: when HF_HUB_OFFLINE is not set); a missing or corrupt
    model raises ModelError saying what is missing and how to get it, a pipeline of
    an unsupported family one naming its class and the supported families.
    """
    from diffusers import DiffusionPipeline

    spec = model_spec(name_or_path, kind=T2I)
    name_or_path = spec.name
    source, known = spec.locate(T2I)[0], spec.entry
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device)
    dtype = dtype or (torch.float16 if device == "cuda" else torch.float32)
    local = os.path.isdir(source)
    if allow_download is None:
        allow_download = os.environ.get("HF_HUB_OFFLINE", "0") in ("0", "", "false")
    if local and not (Path(source) / "model_index.json").exists():
        raise ModelError(f"{source} has no model_index.json: it is not a pipeline saved with save_pretrained"
                         + (" (the embedded weights are missing: reinstall the repository or run "
                            "`python -m zoo train t2i`)" if known and known.embedded else ""))
    if local:
        _saved_family(source)
    try:
        pipe = DiffusionPipeline.from_pretrained(source, dtype=dtype, local_files_only=local or not allow_download)
    except Exception as err:  # noqa: BLE001 - any failure to load becomes one clear message
        how = ("download it once with `huggingface-cli download " + source + "` (about 7 GB) or pass a local "
               "directory" if not local else "check that the directory holds a complete pipeline")
        raise ModelError(f"cannot load {name_or_path!r} from {source}: {str(err).splitlines()[0]}; {how}") from None
    pipe.to(device)
    vocabulary = None
    vocab_file = Path(source) / "tokenizer" / "vocabulary.json" if local else None
    if vocab_file is not None and vocab_file.exists():
        vocabulary = frozenset(json.loads(vocab_file.read_text()))
    if known:
        steps, guidance = known.default_steps, known.default_guidance
    else:  # the pipeline class's own defaults (diffusers': SDXL 50 steps at guidance 5, PixArt 20 at 4.5, ...)
        steps = pipeline_default(pipe, "num_inference_steps", int) or 30
        guidance = pipeline_default(pipe, "guidance_scale", float)
        guidance = 5.0 if guidance is None else guidance
    return t2i_model(pipe, name_or_path, default_steps=steps, default_guidance=guidance, vocabulary=vocabulary,
                     blocks=spec.default_blocks or SDXL_BLOCKS, world=spec.world)


def t2i_model(pipe, name: str, default_steps: int = 30, default_guidance: float = 5.0,
              vocabulary: frozenset[str] | None = None, blocks: tuple[str, ...] = SDXL_BLOCKS,
              world: str | None = None) -> T2IModel:
    """A loaded pipeline (any supported family, e.g. one built in memory) as a T2IModel: its family resolved
    once, its blocks at the default size, its analysed blocks (`blocks` that it has; none of them: the middle
    block of each of a DiT's block lists)."""
    try:
        family = family_of(pipe)
    except UnsupportedPipeline as err:
        raise ModelError(str(err)) from None
    pipe.set_progress_bar_config(disable=True)
    infos = block_info(denoiser_of(pipe), latent_side=default_latent_side(pipe))
    analysed = tuple(b for b in blocks if b in infos) or family.default_blocks(infos)
    return T2IModel(name=name, pipe=pipe, default_steps=default_steps, default_guidance=default_guidance,
                    vocabulary=vocabulary, blocks=infos, default_blocks=analysed, world=world, family=family,
                    text_sites=text_stream_info(denoiser_of(pipe), pipe))


register_loader(T2I, load_t2i)

"""Loading text-to-image pipelines by one code path: the embedded toy model, SDXL Turbo,
SDXL base, or any local directory saved with `save_pretrained`."""

from __future__ import annotations

import copy
import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..zoo import WEIGHTS_DIR
from .generation import Cancelled  # noqa: F401 - one exception for every stopped generation, image or text

SDXL_BLOCKS = ("down_blocks.2.attentions.1", "mid_block.attentions.0",
               "up_blocks.0.attentions.0", "up_blocks.0.attentions.1")
# The embedded models lay out their scene in SDXL's four blocks but v1 draws an object's shape and colour one
# level up, at 16 x 16 (the linear probes and ablations: saes/pretrained/toy/REPORT.md, README): their SAEs and
# edits cover both sets.
TOY_BLOCKS = SDXL_BLOCKS + ("up_blocks.1.attentions.1", "up_blocks.1.attentions.2")


@dataclass(frozen=True)
class KnownModel:
    source: str  # a hub repository id or a path inside the repo
    default_steps: int
    default_guidance: float
    embedded: bool = False
    blocks: tuple[str, ...] = SDXL_BLOCKS  # analysed by default: SAEs trained, edits applied, features shown
    world: str | None = None  # the world whose ground truth it was made in (`interp.ground_truth.WORLDS`)


KNOWN_MODELS = {
    "toy": KnownModel(str(WEIGHTS_DIR / "t2i"), 1, 0.0, embedded=True, blocks=TOY_BLOCKS, world="shapes"),
    # v2 (issue 22): SDXL's proportions, most transformer layers at 8 x 8 (`--config sdxl-proportions`)
    "toy-v2": KnownModel(str(WEIGHTS_DIR / "t2i-v2"), 1, 0.0, embedded=True, blocks=TOY_BLOCKS, world="shapes"),
    # v3 (issue 22): v2 with transformer blocks only at 8 x 8 (`--config sdxl-blocks-only`), so SDXL's four
    "toy-v3": KnownModel(str(WEIGHTS_DIR / "t2i-v3"), 1, 0.0, embedded=True, blocks=SDXL_BLOCKS, world="shapes"),
    # v4 (issue 22): v3 trained with the pooled prompt embedding zero (`--zero-pooled-text`), so the prompt reaches
    # the UNet only through the 8 x 8 cross-attentions
    "toy-v4": KnownModel(str(WEIGHTS_DIR / "t2i-v4"), 1, 0.0, embedded=True, blocks=SDXL_BLOCKS, world="shapes"),
    "sdxl-turbo": KnownModel("stabilityai/sdxl-turbo", 1, 0.0),
    "sdxl-base": KnownModel("stabilityai/stable-diffusion-xl-base-1.0", 30, 5.0),
}

MAX_STEPS = 1000
MAX_SEED = 2**64 - 1  # torch generators take 64-bit seeds
RECIPE_FILE = "recipe.json"  # written by `python -m interp.zoo train t2i` next to the pipeline it saves


def _recipe_made(path: str) -> KnownModel | None:
    """A pipeline directory saved by the toy's recipe (a retrained or variant toy) is used as the toy is: one step,
    no guidance, the toy's analysed blocks. Without this it would fall back to 30 steps with guidance."""
    if os.path.isdir(path) and (Path(path) / RECIPE_FILE).exists():
        toy = KNOWN_MODELS["toy"]
        return KnownModel(path, toy.default_steps, toy.default_guidance, blocks=toy.blocks, world=toy.world)
    return None


def known_model(name_or_path: str) -> KnownModel | None:
    """What is known of a model by its name, or of a pipeline directory the toy's recipe saved; None otherwise."""
    return KNOWN_MODELS.get(name_or_path) or _recipe_made(name_or_path)


def default_blocks(name_or_path: str) -> tuple[str, ...]:
    """The blocks a model is analysed at by default (SDXL's four for any model not known by name)."""
    known = known_model(name_or_path)
    return known.blocks if known else SDXL_BLOCKS
MAX_SIDE = 2048


class ModelError(ValueError):
    """A model that cannot be loaded or a request it cannot serve, with what to do about it."""


@dataclass(frozen=True)
class BlockInfo:
    name: str       # module path inside the UNet, e.g. "down_blocks.2.attentions.1"
    channels: int
    height: int     # positions at the model's default resolution
    width: int


@dataclass
class T2IModel:
    """A loaded pipeline and what a user needs to know to hook and edit it."""

    name: str
    pipe: object  # diffusers StableDiffusionXLPipeline
    default_steps: int
    default_guidance: float
    vocabulary: frozenset[str] | None = None  # words the model knows; None: any text
    blocks: dict[str, BlockInfo] = field(default_factory=dict)
    default_blocks: tuple[str, ...] = SDXL_BLOCKS  # see `default_blocks()`; filtered to the UNet's blocks
    world: str | None = None  # the world it was made in (`interp.ground_truth.ground_truth_for`); None: real

    @property
    def unet(self):
        return self.pipe.unet

    @property
    def default_size(self) -> int:
        return self.pipe.unet.config.sample_size * self.pipe.vae_scale_factor

    def describe(self) -> dict:
        return {"name": self.name, "default_steps": self.default_steps, "default_guidance": self.default_guidance,
                "default_size": self.default_size, "default_blocks": list(self.default_blocks),
                "blocks": {k: asdict(v) for k, v in self.blocks.items()}}

    def check_prompt(self, prompt: str) -> str:
        """The prompt, stripped, or a ModelError saying why it cannot be generated."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ModelError("the prompt is empty; describe the image to generate")
        prompt = prompt.strip()
        if self.vocabulary is not None:
            # its tokenizer splits ASCII words: an emoji or a word in another script would be dropped unread
            unreadable = sorted({c for c in prompt if not c.isascii()})
            if unreadable:
                shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in unreadable[:8])
                raise ModelError(f"{self.name} cannot read the character(s) {shown}: it reads English words of its "
                                 f"vocabulary only; it knows: {', '.join(sorted(self.vocabulary))}")
            words = {w for w in _words(prompt)}
            unknown = sorted(words - self.vocabulary)
            if unknown:
                raise ModelError(f"{self.name} does not know the word(s) {', '.join(map(repr, unknown))}; "
                                 f"it knows: {', '.join(sorted(self.vocabulary))}")
        for tokenizer in {id(t): t for t in (self.pipe.tokenizer, self.pipe.tokenizer_2) if t is not None}.values():
            n = len(tokenizer(prompt, truncation=False)["input_ids"])
            if n > tokenizer.model_max_length:
                raise ModelError(f"the prompt is {n} tokens long; {self.name} reads at most "
                                 f"{tokenizer.model_max_length} (shorten it)")
        return prompt

    def check_request(self, steps: int, height: int | None = None, width: int | None = None,
                      guidance: float | None = None, seeds=()) -> None:
        """A ModelError saying what is wrong with a generation request, if anything is.

        Guidance is diffusers' guidance scale: above 1 it runs classifier-free guidance, from 0 to 1 it
        does not (SDXL Turbo's 0); a negative or non-finite scale means nothing."""
        if not isinstance(steps, (int, np.integer)) or not 1 <= steps <= MAX_STEPS:
            raise ModelError(f"steps must be an integer from 1 to {MAX_STEPS}, not {steps!r}")
        if guidance is not None and not (isinstance(guidance, (int, float, np.number)) and np.isfinite(guidance)
                                         and guidance >= 0):
            raise ModelError(f"guidance must be a finite number of at least 0 (above 1: classifier-free guidance; "
                             f"0 to 1: none), not {guidance!r}")
        for seed in seeds:
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
                raise ModelError(f"a seed must be an integer from 0 to {MAX_SEED} (2**64 - 1), not {seed!r}")
        multiple = self.pipe.vae_scale_factor * 4  # three UNet levels: latent sides divisible by 4
        for side_name, side in (("height", height), ("width", width)):
            if side is None:
                continue
            if not isinstance(side, (int, np.integer)) or not multiple <= side <= MAX_SIDE or side % multiple:
                raise ModelError(f"{side_name} must be a multiple of {multiple} from {multiple} to {MAX_SIDE}, "
                                 f"not {side!r}")

    def generate(self, prompt: str | list[str], steps: int | None = None, seed: int | list[int] = 0,
                 guidance: float | None = None, height: int | None = None, width: int | None = None,
                 output_type: str = "pil") -> list:
        """PIL images, one per prompt; the same seed gives the same image. Safe to call from
        several threads at once (see `generate`)."""
        return generate(self, prompt, steps=steps, seed=seed, guidance=guidance, height=height, width=width,
                        output_type=output_type)

    def initial_latents(self, generators: list, height: int | None = None, width: int | None = None) -> torch.Tensor:
        """Starting noise (batch, channels, h, w) drawn on the CPU, so a seed gives the same image on any device."""
        h = (height or self.default_size) // self.pipe.vae_scale_factor
        w = (width or self.default_size) // self.pipe.vae_scale_factor
        c = self.pipe.unet.config.in_channels
        # Unit noise: diffusers' prepare_latents scales given latents by init_noise_sigma itself.
        return torch.stack([torch.randn((c, h, w), generator=g) for g in generators]).to(self.pipe.unet.dtype)


# ----------------------------------------------------------------------------- generation
#
# The pipeline object is not safe to call from two threads at once (it keeps the scheduler's
# step state and the guidance scale on itself, and its tokenizers keep padding settings between
# calls); `run_pipeline` calls it through a private shallow copy with its own scheduler and a lock
# around prompt encoding, and `generate` is `T2IModel.generate` built on it. Hooks
# (`interp.hooks.diffusion`) read the call in progress through `current_generation_call`.

@dataclass(frozen=True)
class GenerationCall:
    """What a pipeline call tells the hooks that run inside it (set by `run_pipeline`)."""

    cfg: bool  # the U-Net batch is [uncond, cond]


# The pipeline call in progress in the current context (None outside `run_pipeline`).
_GENERATION_CALL: ContextVar[GenerationCall | None] = ContextVar("interp_generation_call", default=None)
# Called as fn(done_steps, total_steps) before the first and after every denoising step of each pipeline call
# made in the current context; it may raise `Cancelled` to stop the generation there.
_STEP_CALLBACK: ContextVar[Callable[[int, int], None] | None] = ContextVar("interp_step_callback", default=None)


def current_generation_call() -> GenerationCall | None:
    """The pipeline call in progress in this context (None outside `run_pipeline`): what hooks need to know."""
    return _GENERATION_CALL.get()


@contextmanager
def on_each_step(callback: Callable[[int, int], None]) -> Iterator[None]:
    """Report progress and allow cancellation of every generation run inside the `with`, in this context
    only (so a UI can stop one user's generation, however deep in the library it was started)."""
    token = _STEP_CALLBACK.set(callback)
    try:
        yield
    finally:
        _STEP_CALLBACK.reset(token)


def do_cfg(pipe, guidance_scale: float) -> bool:
    """Whether an SDXL pipeline call with this guidance batches [uncond, cond] (diffusers' rule)."""
    return guidance_scale > 1.0 and getattr(pipe.unet.config, "time_cond_proj_dim", None) is None


# Tokenizers keep padding/truncation settings on themselves between calls (the Rust
# backend is set up per call), so two threads tokenizing at once get each other's lengths.
# Text encoding is a small part of a generation: it is serialised, denoising is not.
_TEXT_LOCK = threading.RLock()


def private_pipeline(pipe):
    """A shallow copy of the pipeline that shares every model but owns its scheduler and call state.

    diffusers pipelines keep per-call state on themselves (`_guidance_scale`, the
    scheduler's timesteps and step index); two threads calling one pipeline overwrite it.
    Its prompt encoding holds a process-wide lock (shared tokenizers are not thread-safe).
    """
    private = copy.copy(pipe)
    # Bypass DiffusionPipeline.__setattr__, which would rewrite the shared config.
    private.__dict__["scheduler"] = copy.deepcopy(pipe.scheduler)
    if hasattr(private, "encode_prompt"):
        encode_prompt = private.encode_prompt

        def locked_encode_prompt(*args, **kwargs):
            with _TEXT_LOCK:
                return encode_prompt(*args, **kwargs)

        private.__dict__["encode_prompt"] = locked_encode_prompt
    return private


def run_pipeline(pipe, **call_kwargs):
    """Call the pipeline through a private copy (thread-safe) and tell active hooks about the call."""
    guidance = float(call_kwargs.get("guidance_scale", 5.0))
    callback = _STEP_CALLBACK.get()
    if callback is not None and "callback_on_step_end" not in call_kwargs:
        total = int(call_kwargs.get("num_inference_steps") or 1)
        callback(0, total)

        def step_end(_pipe, step, _timestep, _tensors):
            callback(step + 1, total)
            return {}

        call_kwargs["callback_on_step_end"] = step_end
    token = _GENERATION_CALL.set(GenerationCall(cfg=do_cfg(pipe, guidance)))
    try:
        return private_pipeline(pipe)(**call_kwargs)
    finally:
        _GENERATION_CALL.reset(token)


def generate(model, prompt: str | list[str], steps: int | None = None, seed: int | list[int] = 0,
             guidance: float | None = None, height: int | None = None, width: int | None = None,
             output_type: str = "pil", allow_empty_prompt: bool = False):
    """`T2IModel.generate`, safe to run from several threads on one model at once.

    Returns PIL images (or, with output_type="np", a float array (batch, height, width, 3) in [0, 1]).
    ``allow_empty_prompt``: an empty prompt generates the unconditional image instead of being an error.
    """
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    with _TEXT_LOCK:  # check_prompt tokenizes with the shared tokenizers
        prompts = ["" if allow_empty_prompt and isinstance(p, str) and not p.strip() else model.check_prompt(p)
                   for p in prompts]
    steps = model.default_steps if steps is None else steps
    guidance = model.default_guidance if guidance is None else guidance
    seeds = [seed] * len(prompts) if isinstance(seed, (int, np.integer)) else list(seed)
    if len(seeds) != len(prompts):
        raise ModelError(f"{len(prompts)} prompts but {len(seeds)} seeds")
    model.check_request(steps, height, width, guidance=guidance, seeds=seeds)
    guidance = float(guidance)
    generators = [torch.Generator(device="cpu").manual_seed(int(s)) for s in seeds]
    latents = model.initial_latents(generators, height, width)
    with torch.inference_mode():
        out = run_pipeline(model.pipe, prompt=prompts, num_inference_steps=steps, guidance_scale=guidance,
                           latents=latents.to(model.unet.device), height=height, width=width,
                           output_type=output_type)
    return out.images


def _words(prompt: str) -> list[str]:
    import re
    return re.findall(r"[a-z]+", prompt.lower())


def block_info(unet, names=None) -> dict[str, BlockInfo]:
    """Channels and spatial size, at the default resolution, of the UNet's transformer blocks."""
    cfg = unet.config
    n_levels = len(cfg.block_out_channels)
    side = cfg.sample_size
    infos = {}
    for name, module in unet.named_modules():
        if type(module).__name__ != "Transformer2DModel":
            continue
        parts = name.split(".")
        if parts[0] == "down_blocks":
            level = int(parts[1])
        elif parts[0] == "mid_block":
            level = n_levels - 1
        elif parts[0] == "up_blocks":
            level = n_levels - 1 - int(parts[1])
        else:
            continue
        s = side // 2 ** level
        infos[name] = BlockInfo(name, module.config.in_channels, s, s)
    if names is not None:
        infos = {n: infos[n] for n in names if n in infos}
    return infos


def resolve(name_or_path: str) -> tuple[str, KnownModel | None]:
    if name_or_path in KNOWN_MODELS:
        return KNOWN_MODELS[name_or_path].source, KNOWN_MODELS[name_or_path]
    if os.path.isdir(name_or_path):
        return name_or_path, _recipe_made(name_or_path)
    if "/" in name_or_path and not name_or_path.startswith((".", "/")):
        return name_or_path, None  # a hub repository id
    raise ModelError(f"unknown model {name_or_path!r}: use one of {', '.join(KNOWN_MODELS)}, "
                     f"a hub repository id (owner/name) or a directory saved with save_pretrained")


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


def load_t2i(name_or_path: str = "toy", device: str | None = None, dtype: torch.dtype | None = None,
             allow_download: bool | None = None) -> T2IModel:
    """Load a pipeline by name ("toy", "sdxl-turbo", "sdxl-base"), hub id or directory.

    Real models come from the local Hugging Face cache or the hub (only when
    `allow_download`, default: when HF_HUB_OFFLINE is not set); a missing or corrupt
    model raises ModelError saying what is missing and how to get it.
    """
    from diffusers import StableDiffusionXLPipeline

    source, known = resolve(name_or_path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device)
    dtype = dtype or (torch.float16 if device == "cuda" else torch.float32)
    local = os.path.isdir(source)
    if allow_download is None:
        allow_download = os.environ.get("HF_HUB_OFFLINE", "0") in ("0", "", "false")
    if local and not (Path(source) / "model_index.json").exists():
        raise ModelError(f"{source} has no model_index.json: it is not a pipeline saved with save_pretrained"
                         + (" (the embedded weights are missing: reinstall the repository or run "
                            "`python -m interp.zoo train t2i`)" if known and known.embedded else ""))
    try:
        pipe = StableDiffusionXLPipeline.from_pretrained(source, dtype=dtype,
                                                         local_files_only=local or not allow_download)
    except Exception as err:  # noqa: BLE001 - any failure to load becomes one clear message
        how = ("download it once with `huggingface-cli download " + source + "` (about 7 GB) or pass a local "
               "directory" if not local else "check that the directory holds a complete pipeline")
        raise ModelError(f"cannot load {name_or_path!r} from {source}: {str(err).splitlines()[0]}; {how}") from None
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    vocabulary = None
    vocab_file = Path(source) / "tokenizer" / "vocabulary.json" if local else None
    if vocab_file is not None and vocab_file.exists():
        vocabulary = frozenset(json.loads(vocab_file.read_text()))
    steps = known.default_steps if known else (1 if "turbo" in source.lower() else 30)
    guidance = known.default_guidance if known else (0.0 if steps == 1 else 5.0)
    blocks = block_info(pipe.unet)
    return T2IModel(name=name_or_path, pipe=pipe, default_steps=steps, default_guidance=guidance,
                    vocabulary=vocabulary, blocks=blocks,
                    default_blocks=tuple(b for b in default_blocks(name_or_path) if b in blocks),
                    world=known.world if known else None)

"""Loading text-to-image pipelines by one code path: the embedded toy model, SDXL Turbo,
SDXL base, or any local directory saved with `save_pretrained`."""

from __future__ import annotations

import copy
import inspect
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

from ..embedded import weights_dir
from .denoisers import UNET, DenoiserFamily, UnsupportedPipeline, denoiser_of, family_of, family_of_index, \
    family_of_module, step_of_calls
from .generation import Cancelled  # noqa: F401 - one exception for every stopped generation, image or text

SDXL_BLOCKS = ("down_blocks.2.attentions.1", "mid_block.attentions.0",
               "up_blocks.0.attentions.0", "up_blocks.0.attentions.1")
# The embedded models lay out their scene in SDXL's four blocks but v1 draws an object's shape and colour one
# level up, at 16 x 16 (the linear probes and ablations: saes/pretrained/toy/REPORT.md, README): their SAEs and
# edits cover both sets.
TOY_BLOCKS = SDXL_BLOCKS + ("up_blocks.1.attentions.1", "up_blocks.1.attentions.2")


@dataclass(frozen=True)
class KnownModel:
    location: str  # a hub repository id or a directory; embedded: a folder of the registered weights directory
    default_steps: int
    default_guidance: float
    embedded: bool = False
    blocks: tuple[str, ...] = SDXL_BLOCKS  # analysed by default: SAEs trained, edits applied, features shown
    world: str | None = None  # the world whose ground truth it was made in (`interp.ground_truth.WORLDS`)

    @property
    def source(self) -> str:
        """What loads it: the hub id or directory; an embedded model's folder in the weights directory `zoo`
        registers (`interp.embedded.weights_dir`: one line when nothing registered it)."""
        return str(weights_dir() / self.location) if self.embedded else self.location


KNOWN_MODELS = {
    "toy": KnownModel("t2i", 1, 0.0, embedded=True, blocks=TOY_BLOCKS, world="shapes"),
    # v2 (issue 22): SDXL's proportions, most transformer layers at 8 x 8 (`--config sdxl-proportions`)
    "toy-v2": KnownModel("t2i-v2", 1, 0.0, embedded=True, blocks=TOY_BLOCKS, world="shapes"),
    # v3 (issue 22): v2 with transformer blocks only at 8 x 8 (`--config sdxl-blocks-only`), so SDXL's four
    "toy-v3": KnownModel("t2i-v3", 1, 0.0, embedded=True, blocks=SDXL_BLOCKS, world="shapes"),
    # v4 (issue 22): v3 trained with the pooled prompt embedding zero (`--zero-pooled-text`), so the prompt reaches
    # the UNet only through the 8 x 8 cross-attentions
    "toy-v4": KnownModel("t2i-v4", 1, 0.0, embedded=True, blocks=SDXL_BLOCKS, world="shapes"),
    # toy-base (issue 33): v1's sizes trained as SDXL base is (`--objective v_prediction`, prompt dropout), sampled in
    # 30 steps with guidance 5; the toy's VAE, so the two share one latent space (docs/experiments/step-transfer.md)
    "toy-base": KnownModel("t2i-base", 30, 5.0, embedded=True, blocks=TOY_BLOCKS, world="shapes"),
    # toy-turbo (issue 33): the one-step model trained from toy-base's weights (`--init-from`), as SDXL Turbo was
    # distilled from SDXL base: the pair shares a lineage, as the toy and toy-base do not
    "toy-turbo": KnownModel("t2i-turbo", 1, 0.0, embedded=True, blocks=TOY_BLOCKS, world="shapes"),
    "sdxl-turbo": KnownModel("stabilityai/sdxl-turbo", 1, 0.0),
    "sdxl-base": KnownModel("stabilityai/stable-diffusion-xl-base-1.0", 30, 5.0),
}

MAX_STEPS = 1000
MAX_SEED = 2**64 - 1  # torch generators take 64-bit seeds
RECIPE_FILE = "recipe.json"  # written by `python -m zoo train t2i` next to the pipeline it saves


def _recipe_made(path: str) -> KnownModel | None:
    """A pipeline directory saved by the toy's recipe (a retrained, variant or base toy): the toy's analysed blocks
    and world, and the steps and guidance its recipe.json says it samples with (a `toy-base` trained with
    --objective v_prediction: 30 steps with guidance; a recipe.json without them: the toy's one step, no guidance)."""
    if os.path.isdir(path) and (Path(path) / RECIPE_FILE).exists():
        toy = KNOWN_MODELS["toy"]
        try:
            recipe = json.loads((Path(path) / RECIPE_FILE).read_text())
        except (OSError, ValueError):
            recipe = {}
        config = recipe.get("config", recipe) if isinstance(recipe, dict) else {}
        steps = config.get("sampling_steps", toy.default_steps) if isinstance(config, dict) else toy.default_steps
        guidance = config.get("guidance", toy.default_guidance) if isinstance(config, dict) else toy.default_guidance
        return KnownModel(path, int(steps), float(guidance), blocks=toy.blocks, world=toy.world)
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
    name: str       # module path inside the denoiser, e.g. "down_blocks.2.attentions.1", "transformer_blocks.3"
    channels: int
    height: int     # positions at the model's default resolution
    width: int

    stream = "image"

    @property
    def shape(self) -> tuple[int, ...]:
        """One image's update at one step: (channels, height, width)."""
        return self.channels, self.height, self.width


@dataclass(frozen=True)
class TextStreamInfo:
    """The text stream of a joint (MMDiT) block, the site `<block>:text`: a token sequence, no spatial grid."""

    name: str            # "transformer_blocks.3:text"
    block: str           # the block whose tuple output carries it: "transformer_blocks.3"
    channels: int
    tokens: int | None   # text tokens at the pipeline's defaults (None: a bare denoiser, no pipeline to ask)

    stream = "text"

    @property
    def shape(self) -> tuple[int, ...]:
        """One image's update at one step: (channels, tokens)."""
        if self.tokens is None:
            raise ValueError(f"the length of {self.name} is unknown without the pipeline (its tokenizers)")
        return self.channels, self.tokens


@dataclass
class T2IModel:
    """A loaded pipeline and what a user needs to know to hook and edit it."""

    name: str
    pipe: object  # a diffusers text-to-image pipeline whose denoiser has a family (`interp.models.denoisers`)
    default_steps: int
    default_guidance: float
    vocabulary: frozenset[str] | None = None  # words the model knows; None: any text
    blocks: dict[str, BlockInfo] = field(default_factory=dict)
    default_blocks: tuple[str, ...] = SDXL_BLOCKS  # see `default_blocks()`; filtered to the UNet's blocks
    world: str | None = None  # the world it was made in (`interp.ground_truth.ground_truth_for`); None: real
    family: DenoiserFamily = UNET  # how its denoiser is hooked (`interp.models.denoisers`)
    text_sites: dict[str, TextStreamInfo] = field(default_factory=dict)  # joint blocks' `<block>:text` streams

    @property
    def sites(self) -> dict:
        """Everything a capture and the store can record: the blocks (image stream) and the text streams."""
        return {**self.blocks, **self.text_sites}

    @property
    def denoiser(self):
        """The U-Net or the DiT transformer."""
        return denoiser_of(self.pipe)

    @property
    def unet(self):
        """The denoiser (a U-Net or a DiT transformer), under the name older callers use."""
        return self.denoiser

    @property
    def default_size(self) -> int:
        return default_latent_side(self.pipe) * self.pipe.vae_scale_factor

    def describe(self) -> dict:
        return {"name": self.name, "family": self.family.name, "pipeline": type(self.pipe).__name__,
                "default_steps": self.default_steps, "default_guidance": self.default_guidance,
                "default_size": self.default_size, "default_blocks": list(self.default_blocks),
                "blocks": {k: asdict(v) for k, v in self.blocks.items()},
                "text_sites": {k: asdict(v) for k, v in self.text_sites.items()}}

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
        # Each of the family's tokenizers reads the prompt; one that would cut it short is an error, not a
        # silent truncation (the limit is the pipeline's max_sequence_length where it has one: the family's
        # figure, or the pipeline call's own default where that is lower, as PixArt-alpha's 120 of PixArt's 300).
        sequence_limit = pipeline_default(self.pipe, "max_sequence_length")
        for attribute, limit in self.family.tokenizers:
            tokenizer = getattr(self.pipe, attribute, None)
            if tokenizer is None:
                continue
            if limit is not None and sequence_limit is not None:
                limit = min(limit, sequence_limit)
            limit = min(limit or tokenizer.model_max_length, tokenizer.model_max_length)
            n = len(tokenizer(prompt, truncation=False)["input_ids"])
            if n > limit:
                raise ModelError(f"the prompt is {n} tokens long; {self.name} reads at most {limit} (shorten it)")
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
        multiple = self.family.size_multiple(self.denoiser, self.pipe.vae_scale_factor)
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
        """Starting noise (batch, channels, h, w) drawn on the CPU, so a seed gives the same image on any device;
        packed as the pipeline takes it for FLUX (batch, h * w / 4, channels * 4)."""
        h = (height or self.default_size) // self.pipe.vae_scale_factor
        w = (width or self.default_size) // self.pipe.vae_scale_factor
        c = self.family.latent_channels(self.denoiser)
        # Unit noise: diffusers' prepare_latents scales given latents by init_noise_sigma itself.
        latents = torch.stack([torch.randn((c, h, w), generator=g) for g in generators]).to(self.denoiser.dtype)
        if self.family.packing > 1:
            latents = self.pipe._pack_latents(latents, len(generators), c, h, w)
        return latents


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

    cfg: bool  # the denoiser batch is [uncond, cond]
    steps: int | None = None  # scheduler steps asked for
    scheduler: object = None  # the call's own scheduler (its timesteps are set before the first denoiser call)
    calls_known: bool = True  # False: the call's options change which timesteps run (denoising_end, ...)
    progress: Callable[[int, int], None] | None = None  # the `on_each_step` callback this call reports to

    def step_of_call(self, call: int) -> int:
        """The scheduler step that denoiser call `call` (0, 1, ... within this generation) belongs to."""
        if self.scheduler is None or self.steps is None:
            return call
        timesteps = getattr(self.scheduler, "timesteps", None)
        n_calls = len(timesteps) if timesteps is not None else self.steps
        steps = step_of_calls(max(n_calls, call + 1), self.steps, int(getattr(self.scheduler, "order", 1) or 1))
        return steps[call]

    def last_call(self) -> int | None:
        """The index of the generation's final denoiser call, from its scheduler's own count (one call per entry
        of its timesteps: Heun's 4 steps are 7 calls, the last step's one), once the pipeline has set them; None
        where that cannot be known: outside `run_pipeline`, before the timesteps are set, a scheduler that starts
        part-way (img2img's begin index), options that cut the timesteps short, or a count that does not end on
        the last step asked for."""
        if not self.calls_known or self.scheduler is None or self.steps is None:
            return None
        timesteps = getattr(self.scheduler, "timesteps", None)
        if timesteps is None or getattr(self.scheduler, "begin_index", None) not in (None, 0):
            return None
        n_calls = len(timesteps)
        order = int(getattr(self.scheduler, "order", 1) or 1)
        if n_calls < self.steps or step_of_calls(n_calls, self.steps, order)[-1] != self.steps - 1:
            return None
        return n_calls - 1


# Pipeline-call options that choose or cut the timesteps a generation runs: with any of them, which denoiser call is
# the last is not the scheduler's count (`GenerationCall.last_call`).
TIMESTEP_OPTIONS = ("denoising_start", "denoising_end", "strength", "timesteps", "sigmas", "image")

# The pipeline call in progress in the current context (None outside `run_pipeline`).
_GENERATION_CALL: ContextVar[GenerationCall | None] = ContextVar("interp_generation_call", default=None)
# Called as fn(done_steps, total_steps) before the first and after every denoising step of each pipeline call
# made in the current context; it may raise `Cancelled` to stop the generation there.
_STEP_CALLBACK: ContextVar[Callable[[int, int], None] | None] = ContextVar("interp_step_callback", default=None)


def current_generation_call() -> GenerationCall | None:
    """The pipeline call in progress in this context (None outside `run_pipeline`): what hooks need to know."""
    return _GENERATION_CALL.get()


def report_last_step(call: GenerationCall) -> None:
    """Tell this context's progress callback (`on_each_step`) that the call's last step is done: a generation
    ended early at its final denoiser call (`interp.hooks.truncate`) never reaches the step's end."""
    if call.progress is not None and call.steps is not None:
        call.progress(call.steps, call.steps)


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
    """Whether a pipeline call with this guidance batches [uncond, cond] (diffusers' rule for its family)."""
    return family_of(pipe).guidance_rows(guidance_scale, denoiser_of(pipe))


# Tokenizers keep padding/truncation settings on themselves between calls (the Rust
# backend is set up per call), so two threads tokenizing at once get each other's lengths.
# Text encoding is a small part of a generation: it is serialised, denoising is not.
_TEXT_LOCK = threading.RLock()


def private_pipeline(pipe, generator=None):
    """A shallow copy of the pipeline that shares every model but owns its scheduler and call state.

    diffusers pipelines keep per-call state on themselves (`_guidance_scale`, the
    scheduler's timesteps and step index); two threads calling one pipeline overwrite it.
    Its prompt encoding holds a process-wide lock (shared tokenizers are not thread-safe).
    ``generator`` (a torch.Generator or one per image): the noise every scheduler step draws (`seeded_steps`).
    """
    private = copy.copy(pipe)
    # Bypass DiffusionPipeline.__setattr__, which would rewrite the shared config.
    private.__dict__["scheduler"] = copy.deepcopy(pipe.scheduler)
    if generator is not None:
        seeded_steps(private.scheduler, generator)
    if hasattr(private, "encode_prompt"):
        encode_prompt = private.encode_prompt

        def locked_encode_prompt(*args, **kwargs):
            with _TEXT_LOCK:
                return encode_prompt(*args, **kwargs)

        private.__dict__["encode_prompt"] = locked_encode_prompt
    return private


def seeded_steps(scheduler, generator) -> None:
    """Make a (private) scheduler draw its step noise from `generator` whenever its pipeline passes none.

    Stochastic schedulers (Euler-ancestral, DPM++ SDE, LCM, DDPM, DDIM with eta > 0, FlowMatch with stochastic
    sampling) add fresh noise at each step through their `step(..., generator=)`. SD 1.x / SDXL / PixArt / Sana
    pass the pipeline's generator on, SD3 and FLUX pass none: without this their noise comes from torch's global
    generator, and the same seed gives another image each run."""
    step = scheduler.step
    try:
        takes_generator = "generator" in inspect.signature(step).parameters
    except (TypeError, ValueError):
        takes_generator = False
    if not takes_generator:
        return

    def step_with_generator(*args, **kwargs):
        if kwargs.get("generator") is None:
            kwargs["generator"] = generator
        return step(*args, **kwargs)

    scheduler.__dict__["step"] = step_with_generator


def one_step_clean_sample(scheduler) -> None:
    """PixArtAlphaPipeline at one step reads the scheduler step's second output, its predicted clean sample (made for
    PixArt-alpha's one-step DMD model), which DPM-Solver++ (its default scheduler) does not return: diffusers raises
    an IndexError. A scheduler that steps to sigma 0 at its last step (DPM-Solver++'s `final_sigmas_type="zero"`)
    returns that clean sample as its next sample, bit for bit: it is given as the second output; any other is
    refused in one line."""
    step = scheduler.step

    def step_with_clean_sample(*args, return_dict: bool = True, **kwargs):
        out = step(*args, return_dict=True, **kwargs)
        if return_dict:
            return out
        clean = getattr(out, "pred_original_sample", None)
        if clean is None:
            sigmas = getattr(scheduler, "sigmas", None)
            if sigmas is None or float(sigmas[-1]) != 0.0:
                raise ModelError(f"PixArtAlphaPipeline at 1 step needs the predicted clean sample, which "
                                 f"{type(scheduler).__name__} does not give here; use 2 or more steps, or a scheduler "
                                 f"that gives it (DDPM, DDIM, Euler, LCM)")
            clean = out.prev_sample
        return out.prev_sample, clean

    scheduler.__dict__["step"] = step_with_clean_sample


def pipeline_default(pipe, option: str, kind: type = int):
    """The default of a pipeline call's numeric option (`max_sequence_length`: PixArt-alpha reads 120 prompt
    tokens, PixArt-Sigma 300; `num_inference_steps`, `guidance_scale`), or None where it has none."""
    try:
        parameter = inspect.signature(type(pipe).__call__).parameters.get(option)
    except (TypeError, ValueError):
        return None
    default = getattr(parameter, "default", None)
    if isinstance(default, bool) or not isinstance(default, (int, float)) or (kind is int and default != int(default)):
        return None
    return kind(default)


def run_pipeline(pipe, **call_kwargs):
    """Call the pipeline through a private copy (thread-safe) and tell active hooks about the call.

    Steps are scheduler steps: a multi-call scheduler (Heun, DPM-2: two denoiser calls a step; PNDM's warm-up)
    reports progress, and the hooks count, per step, not per denoiser call. A ``generator`` in the call also seeds
    the noise of every scheduler step (`seeded_steps`), including where the pipeline does not pass it on."""
    family = family_of(pipe)
    call_kwargs = {**family.call_options, **call_kwargs}
    guidance = float(call_kwargs.get("guidance_scale", 5.0))
    total = int(call_kwargs.get("num_inference_steps") or 1)
    private = private_pipeline(pipe, call_kwargs.get("generator"))
    if total == 1 and any(c.__name__ == "PixArtAlphaPipeline" for c in type(pipe).__mro__):
        one_step_clean_sample(private.scheduler)
    callback = _STEP_CALLBACK.get()
    reports = callback is not None and "callback_on_step_end" not in call_kwargs
    call = GenerationCall(cfg=do_cfg(pipe, guidance), steps=total, scheduler=private.scheduler,
                          calls_known=not any(call_kwargs.get(k) is not None for k in TIMESTEP_OPTIONS),
                          progress=callback if reports else None)
    if reports:
        callback(0, total)

        def step_end(_pipe, index, _timestep, _tensors):
            n_calls = len(_pipe.scheduler.timesteps)
            steps = step_of_calls(n_calls, total, int(getattr(_pipe.scheduler, "order", 1) or 1))
            if index + 1 >= n_calls or steps[index + 1] != steps[index]:  # this call ends a step
                callback(steps[index] + 1, total)
            return {}

        call_kwargs["callback_on_step_end"] = step_end
    token = _GENERATION_CALL.set(call)
    try:
        return private(**call_kwargs)
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
    # Pipelines that would bin or default the size themselves (PixArt, Sana) get the size the latents have.
    height, width = height or model.default_size, width or model.default_size
    with torch.inference_mode():
        # The generators drew the starting noise; the same generators (one per image, so an image's noise does not
        # depend on the batch it is in) draw every later noise a stochastic scheduler adds.
        out = run_pipeline(model.pipe, prompt=prompts, num_inference_steps=steps, guidance_scale=guidance,
                           latents=latents.to(model.denoiser.device), height=height, width=width,
                           output_type=output_type, generator=generators)
    return out.images


def _words(prompt: str) -> list[str]:
    import re
    return re.findall(r"[a-z]+", prompt.lower())


def default_latent_side(pipe) -> int:
    """The latent side of the pipeline's default image (FLUX's pipeline sets it; the others' denoiser config)."""
    side = getattr(pipe, "default_sample_size", None) or getattr(denoiser_of(pipe).config, "sample_size", None)
    return int(side or 128)


def block_info(denoiser, names=None, latent_side: int | None = None) -> dict[str, BlockInfo]:
    """Channels and grid size of the denoiser's blocks (a U-Net's transformers, a DiT's blocks) at a latent of
    `latent_side` pixels (default: the denoiser's sample_size; FLUX's, which has none: 128)."""
    family = family_of_module(denoiser)
    side = latent_side or int(getattr(denoiser.config, "sample_size", None) or 128)
    infos = {name: BlockInfo(name, *shape) for name, shape in family.blocks(denoiser, side).items()}
    if names is not None:
        infos = {n: infos[n] for n in names if n in infos}
    return infos


def text_stream_info(denoiser, pipe=None) -> dict[str, TextStreamInfo]:
    """`<block>:text` -> its channels and length (at the pipeline's defaults) for each joint block that writes a
    text stream (SD3, FLUX); {} for a family without one."""
    from ..names import text_site

    family = family_of_module(denoiser)
    channels = family.channels(denoiser) if family.tokens else 0
    tokens = family.text_tokens(pipe)
    return {text_site(b): TextStreamInfo(text_site(b), b, channels, tokens) for b in family.text_blocks(denoiser)}


def registry_entry(source: str) -> KnownModel | None:
    """The KNOWN_MODELS entry of a hub repository id given as such (`stabilityai/sdxl-turbo`), or of a Hugging Face
    cache snapshot of it (`.../models--stabilityai--sdxl-turbo/snapshots/<commit>`: the cache's own layout)."""
    repo = source
    parts = Path(source).parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        repo = parts[-3][len("models--"):].replace("--", "/")
    return next((m for m in KNOWN_MODELS.values() if not m.embedded and m.source == repo), None)


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


def load_t2i(name_or_path: str = "toy", device: str | None = None, dtype: torch.dtype | None = None,
             allow_download: bool | None = None) -> T2IModel:
    """Load a pipeline by name ("toy", "sdxl-turbo", "sdxl-base"), hub id or directory, as the class its
    model_index.json names (`DiffusionPipeline`): SD 1.x / 2.x / SDXL U-Nets, SD3, FLUX, PixArt, Sana.

    Real models come from the local Hugging Face cache or the hub (only when
    `allow_download`, default: when HF_HUB_OFFLINE is not set); a missing or corrupt
    model raises ModelError saying what is missing and how to get it, a pipeline of
    an unsupported family one naming its class and the supported families.
    """
    from diffusers import DiffusionPipeline

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
    known = known or registry_entry(source)
    if known:
        steps, guidance = known.default_steps, known.default_guidance
    else:  # the pipeline class's own defaults (diffusers': SDXL 50 steps at guidance 5, PixArt 20 at 4.5, ...)
        steps = pipeline_default(pipe, "num_inference_steps", int) or 30
        guidance = pipeline_default(pipe, "guidance_scale", float)
        guidance = 5.0 if guidance is None else guidance
    return t2i_model(pipe, name_or_path, default_steps=steps, default_guidance=guidance, vocabulary=vocabulary,
                     blocks=default_blocks(name_or_path), world=known.world if known else None)


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

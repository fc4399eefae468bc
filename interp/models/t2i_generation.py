"""Running a text-to-image pipeline: thread-safe calls through a private copy (`run_pipeline`), seeded step noise,
progress and cancellation per scheduler step (`on_each_step`), and `generate` (what `T2IModel.generate` runs).

The pipeline object is not safe to call from two threads at once (it keeps the scheduler's step state and the
guidance scale on itself, and its tokenizers keep padding settings between calls); `run_pipeline` calls it through a
private shallow copy with its own scheduler and a lock around prompt encoding, and `generate` is `T2IModel.generate`
built on it. Hooks (`interp.hooks.diffusion`) read the call in progress through `current_generation_call`.
"""

from __future__ import annotations

import copy
import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import torch

from .denoisers import denoiser_of, family_of, step_of_calls
from .generation import Cancelled  # noqa: F401 - one exception for every stopped generation, image or text
from .t2i_registry import ModelError

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



__all__ = ["Cancelled", "GenerationCall", "TIMESTEP_OPTIONS", "current_generation_call", "do_cfg", "generate",
           "on_each_step", "one_step_clean_sample", "pipeline_default", "private_pipeline", "report_last_step",
           "run_pipeline", "seeded_steps"]

"""Capture and intervention on the transformer blocks of a diffusers U-Net.

A block's *update* is what it writes into the residual stream of the U-Net:
`output - input` of a `Transformer2DModel`, shape (batch, channels, height, width).

Both capture (`capture_updates`) and intervention (`apply_edits`) are context managers.
They register forward hooks when the `with` block starts and remove them when it ends,
also when it raises. A hook acts only for the context (thread, asyncio task) that
entered the `with`: the set of active sessions is a `ContextVar`, so two generations
running at the same time in two threads on the same pipeline, each inside its own
`with`, never see each other's captures or edits.

Steps are counted per generation by the session that owns them: one U-Net call is one
denoising step. Under classifier-free guidance, diffusers' SDXL pipelines run the
unconditional and conditional batches as one batch `[uncond, cond]`; records keep the
two halves apart.

The pipeline object itself is not safe to call from two threads at once (it keeps the
scheduler's step state and the guidance scale on itself, and its tokenizers keep
padding settings between calls); `run_pipeline` calls it through a private shallow copy
with its own scheduler and a lock around prompt encoding, and `generate` is a
thread-safe counterpart of `T2IModel.generate` built on it.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import torch

from ..edits import Edit, EditError, PreparedEdits, prepare_edits, validate_edits
from ..models.t2i import SDXL_BLOCKS, BlockInfo, block_info

HALVES = ("cond", "uncond", "all")


class HookError(ValueError):
    """A hook request that cannot be served (unknown block, missing half), with the valid choices."""


class Cancelled(Exception):
    """A generation stopped by its caller (see `on_each_step`) between two denoising steps."""


@dataclass(frozen=True)
class GenerationCall:
    """What a pipeline call tells the hooks that run inside it (set by `run_pipeline`)."""

    cfg: bool  # the U-Net batch is [uncond, cond]


# Sessions active in the current context; a hook acts only if its session is in here.
_ACTIVE_SESSIONS: ContextVar[tuple] = ContextVar("interp_diffusion_sessions", default=())
# The pipeline call in progress in the current context (None outside `run_pipeline`).
_GENERATION_CALL: ContextVar[GenerationCall | None] = ContextVar("interp_generation_call", default=None)
# Called as fn(done_steps, total_steps) before the first and after every denoising step of each pipeline call
# made in the current context; it may raise `Cancelled` to stop the generation there.
_STEP_CALLBACK: ContextVar[Callable[[int, int], None] | None] = ContextVar("interp_step_callback", default=None)


@contextmanager
def on_each_step(callback: Callable[[int, int], None]) -> Iterator[None]:
    """Report progress and allow cancellation of every generation run inside the `with`, in this context
    only (so a UI can stop one user's generation, however deep in the library it was started)."""
    token = _STEP_CALLBACK.set(callback)
    try:
        yield
    finally:
        _STEP_CALLBACK.reset(token)


# ----------------------------------------------------------------------------- blocks

def unet_of(model_or_unet):
    """The U-Net of a T2IModel, a diffusers pipeline, or the U-Net itself."""
    if hasattr(model_or_unet, "unet"):
        return model_or_unet.unet
    if isinstance(model_or_unet, torch.nn.Module):
        return model_or_unet
    raise HookError(f"expected a T2IModel, a diffusers pipeline or a UNet, not {type(model_or_unet).__name__}")


def hookable_blocks(model_or_unet) -> dict[str, BlockInfo]:
    """Every transformer block of the U-Net (name -> channels, height, width at the default size)."""
    return block_info(unet_of(model_or_unet))


def block_name(name: str) -> str:
    """`unet.mid_block.attentions.0` and `mid_block.attentions.0` name the same block."""
    return name[len("unet."):] if name.startswith("unet.") else name


def resolve_blocks(unet, names) -> dict[str, torch.nn.Module]:
    """Block name -> module; an unknown name raises HookError listing the valid ones."""
    if isinstance(names, str):
        names = [names]
    valid = hookable_blocks(unet)
    modules = dict(unet.named_modules())
    resolved = {}
    for name in names:
        key = block_name(name)
        if key not in valid:
            raise HookError(f"unknown block {name!r}; the U-Net's transformer blocks are: {', '.join(valid)}")
        resolved[key] = modules[key]
    if not resolved:
        raise HookError(f"no block given; choose from: {', '.join(valid)}")
    return resolved


# ----------------------------------------------------------------------------- pipeline calls

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
             output_type: str = "pil"):
    """`T2IModel.generate`, safe to run from several threads on one model at once.

    Returns PIL images (or, with output_type="np", a float array (batch, height, width, 3) in [0, 1]).
    """
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    with _TEXT_LOCK:  # check_prompt tokenizes with the shared tokenizers
        prompts = [model.check_prompt(p) for p in prompts]
    steps = model.default_steps if steps is None else steps
    guidance = model.default_guidance if guidance is None else guidance
    seeds = [seed] * len(prompts) if isinstance(seed, (int, np.integer)) else list(seed)
    if len(seeds) != len(prompts):
        raise HookError(f"{len(prompts)} prompts but {len(seeds)} seeds")
    model.check_request(steps, height, width, guidance=guidance, seeds=seeds)
    guidance = float(guidance)
    generators = [torch.Generator(device="cpu").manual_seed(int(s)) for s in seeds]
    latents = model.initial_latents(generators, height, width)
    with torch.inference_mode():
        out = run_pipeline(model.pipe, prompt=prompts, num_inference_steps=steps, guidance_scale=guidance,
                           latents=latents.to(model.unet.device), height=height, width=width,
                           output_type=output_type)
    return out.images


# ----------------------------------------------------------------------------- sessions

def _first_tensor(output):
    """The hidden states of a block's output: a tensor, a tuple (return_dict=False) or an output object."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, tuple):
        return output[0]
    return output.sample


def _replace_first(output, hidden: torch.Tensor):
    if isinstance(output, torch.Tensor):
        return hidden
    if isinstance(output, tuple):
        return (hidden,) + tuple(output[1:])
    output.sample = hidden
    return output


def _looks_like_cfg(sample: torch.Tensor, encoder_hidden_states) -> bool:
    """Outside `run_pipeline`: a batch [x, x] with different text conditioning is a CFG batch."""
    b = sample.shape[0]
    if b % 2 or encoder_hidden_states is None:
        return False
    half = b // 2
    return bool(torch.equal(sample[:half], sample[half:])) and not torch.equal(
        encoder_hidden_states[:half], encoder_hidden_states[half:])


@dataclass
class StepState:
    """Where the owning session is in the current generation (one session, one context)."""

    generation: int = -1  # generations seen by this session
    step: int = -1        # denoising step inside the current generation (one U-Net call each)
    cfg: bool = False
    last_timestep: float | None = None
    last_call: GenerationCall | None = None

    def advance(self, sample: torch.Tensor, timestep, encoder_hidden_states) -> None:
        call = _GENERATION_CALL.get()
        t = float(timestep.flatten()[0]) if isinstance(timestep, torch.Tensor) else float(timestep)
        if call is not None:
            new_generation = call is not self.last_call
            self.cfg = call.cfg
        else:
            # Schedulers used with SDXL walk timesteps strictly downwards within one call.
            new_generation = self.last_timestep is None or t >= self.last_timestep
            self.cfg = _looks_like_cfg(sample, encoder_hidden_states)
        self.last_call, self.last_timestep = call, t
        if new_generation:
            self.generation += 1
            self.step = 0
        else:
            self.step += 1


class UNetSession:
    """Hooks on a U-Net's blocks that act only in the context that entered the session."""

    def __init__(self, model_or_unet, blocks):
        self.unet = unet_of(model_or_unet)
        self.modules = resolve_blocks(self.unet, blocks)
        self.blocks = list(self.modules)
        self.state = StepState()
        self._handles: list = []
        self._token = None

    def _active(self) -> bool:
        return self in _ACTIVE_SESSIONS.get()

    # Hooks are registered with kwargs, but torch adds a hook to the module before marking it as taking kwargs:
    # another thread's forward on the shared UNet can call it in between without them. That call is never this
    # session's (it is active only in its own context), so the hooks accept both forms and return at once.
    def _on_unet_call(self, module, args, kwargs=None):
        if not self._active():
            return None
        sample = args[0] if args else kwargs["sample"]
        timestep = args[1] if len(args) > 1 else kwargs["timestep"]
        encoder = args[2] if len(args) > 2 else kwargs.get("encoder_hidden_states")
        self.state.advance(sample, timestep, encoder)
        return None

    def _make_block_hook(self, name: str):
        def hook(module, args, *kwargs_and_output):
            if not self._active():
                return None
            kwargs, output = kwargs_and_output if len(kwargs_and_output) == 2 else ({}, kwargs_and_output[0])
            block_input = args[0] if args else kwargs["hidden_states"]
            return self.on_block(name, block_input, output)
        return hook

    def on_block(self, name: str, block_input: torch.Tensor, output):
        """Called with the block's input and output in the owning context; may return a new output."""
        raise NotImplementedError

    def __enter__(self):
        try:
            self._handles.append(self.unet.register_forward_pre_hook(self._on_unet_call, with_kwargs=True))
            for name, module in self.modules.items():
                self._handles.append(module.register_forward_hook(self._make_block_hook(name), with_kwargs=True))
        except BaseException:
            self._remove()
            raise
        self._token = _ACTIVE_SESSIONS.set(_ACTIVE_SESSIONS.get() + (self,))
        return self

    def _remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __exit__(self, *exc):
        try:
            if self._token is not None:
                _ACTIVE_SESSIONS.reset(self._token)
                self._token = None
        finally:
            self._remove()
        return False


def _halves(tensor: torch.Tensor, cfg: bool, half: str) -> torch.Tensor:
    if half == "all":
        return tensor
    if not cfg:
        if half == "uncond":
            raise HookError("this generation ran without classifier-free guidance: it has no unconditional half")
        return tensor
    n = tensor.shape[0] // 2
    return tensor[n:] if half == "cond" else tensor[:n]


@dataclass
class StepRecord:
    """One block at one denoising step; tensors are the whole U-Net batch ([uncond, cond] under CFG)."""

    generation: int
    step: int
    cfg: bool
    update: torch.Tensor                 # (batch, channels, height, width)
    output: torch.Tensor | None = None   # (batch, channels, height, width) when keep_output


class BlockCapture(UNetSession):
    """Records the update (and optionally the output) of each block at each step.

    Use through `capture_updates`. Read with `updates(block)`: (steps, batch, C, H, W);
    the raw records are in `records[block]` (a list of StepRecord).
    """

    def __init__(self, model_or_unet, blocks=SDXL_BLOCKS, keep_output: bool = False,
                 device: str | torch.device | None = None, dtype: torch.dtype | None = None):
        super().__init__(model_or_unet, blocks)
        self.keep_output = keep_output
        self.device = device
        self.dtype = dtype
        self.records = {name: [] for name in self.blocks}

    def _keep(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        if self.device is not None or self.dtype is not None:
            tensor = tensor.to(device=self.device or tensor.device, dtype=self.dtype or tensor.dtype)
        return tensor

    def on_block(self, name, block_input, output):
        hidden = _first_tensor(output)
        update = self._keep(hidden - block_input)
        # The output tensor flows on through the U-Net; keep a copy of our own.
        kept_output = self._keep(hidden).clone() if self.keep_output else None
        self.records[name].append(StepRecord(self.state.generation, self.state.step, self.state.cfg,
                                             update, kept_output))
        return None

    @property
    def n_generations(self) -> int:
        return self.state.generation + 1

    def _select(self, block: str, generation: int) -> list[StepRecord]:
        key = block_name(block)
        if key not in self.records:
            raise HookError(f"block {block!r} was not captured; captured: {', '.join(self.records)}")
        if self.n_generations == 0:
            raise HookError("nothing was captured: no generation ran inside the `with` block")
        index = generation if generation >= 0 else self.n_generations + generation
        if not 0 <= index < self.n_generations:
            raise HookError(f"generation {generation} out of range: {self.n_generations} captured")
        return [r for r in self.records[key] if r.generation == index]

    def updates(self, block: str, half: str = "cond", generation: int = -1) -> torch.Tensor:
        """(steps, batch, channels, height, width): the block's update at each step of one generation.

        half: "cond" (the conditional half; the whole batch without CFG), "uncond", or "all".
        """
        if half not in HALVES:
            raise HookError(f"half must be one of {', '.join(HALVES)}, not {half!r}")
        return torch.stack([_halves(r.update, r.cfg, half) for r in self._select(block, generation)])

    def outputs(self, block: str, half: str = "cond", generation: int = -1) -> torch.Tensor:
        """(steps, batch, channels, height, width): the block's output (needs keep_output=True)."""
        if not self.keep_output:
            raise HookError("outputs were not kept: use capture_updates(..., keep_output=True)")
        if half not in HALVES:
            raise HookError(f"half must be one of {', '.join(HALVES)}, not {half!r}")
        return torch.stack([_halves(r.output, r.cfg, half) for r in self._select(block, generation)])

    def clear(self) -> None:
        for records in self.records.values():
            records.clear()


def capture_updates(model_or_unet, blocks=SDXL_BLOCKS, keep_output: bool = False,
                    device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> BlockCapture:
    """Context manager recording each block's update (output - input) at each denoising step.

        with capture_updates(model, ["mid_block.attentions.0"]) as cap:
            generate(model, "a red circle")
        cap.updates("mid_block.attentions.0")   # (steps, batch, C, H, W)

    device/dtype: where to keep the records (e.g. "cpu", torch.float16); default: as computed.
    """
    return BlockCapture(model_or_unet, blocks, keep_output=keep_output, device=device, dtype=dtype)


# ----------------------------------------------------------------------------- intervention

class EditSession(UNetSession):
    """Applies edits to block updates: output = input + edited(update). Use through `apply_edits`."""

    def __init__(self, model_or_unet, edits: list[Edit], saes: dict | None = None, n_steps: int | None = None):
        unet = unet_of(model_or_unet)
        edits = [e if isinstance(e, Edit) else Edit.from_dict(e) for e in edits]
        saes = {block_name(k): v for k, v in (saes or {}).items()}
        validate_edits(edits, hookable_blocks(unet), saes=saes, n_steps=n_steps)
        if not edits:
            raise EditError("no edit given")
        super().__init__(unet, sorted({block_name(e.block) for e in edits}))
        self.prepared: PreparedEdits = prepare_edits(edits, saes)

    def on_block(self, name, block_input, output):
        hidden = _first_tensor(output)
        update = hidden - block_input
        edited = self.prepared.apply(name, update, step=self.state.step, cfg=self.state.cfg)
        if edited is update:
            return None  # no edit at this step: leave the block's output untouched
        return _replace_first(output, block_input + edited)


def apply_edits(model_or_unet, edits, saes: dict | None = None, n_steps: int | None = None) -> EditSession:
    """Context manager applying edits (Edit objects or their dicts) while it is active.

    saes: block name -> SAE (any object with encode (N, C) -> (N, F), decode (N, F) -> (N, C)
    and W_dec (F, C)), needed by feature edits and splices. n_steps, when given, checks
    that every edit's steps exist.
    """
    return EditSession(model_or_unet, edits, saes=saes, n_steps=n_steps)

"""Capture and intervention on the blocks of a diffusers denoiser: a U-Net's transformer blocks or a DiT's blocks.

A block's *update* is what it writes into the residual stream of the denoiser: `output - input` of a U-Net's
`Transformer2DModel`, or of a DiT block's image stream (SD3/FLUX joint blocks: the image stream; the token sequence
laid back on its grid), shape (batch, channels, height, width) for every family (`interp.models.denoisers`).
The text stream of a joint block (SD3, FLUX) is a site of its own, `<block>:text`: output minus input of its text
tokens, shape (batch, channels, tokens), a sequence with no grid (a mask cannot apply to it).

Both capture (`capture_updates`) and intervention (`apply_edits`) are context managers.
They register forward hooks when the `with` block starts and remove them when it ends,
also when it raises. A hook acts only for the context (thread, asyncio task) that
entered the `with` (a `ScopedHooks` of `interp.hooks.scoped`: the set of active
sessions is a `ContextVar`), so two generations running at the same time in two threads
on the same pipeline, each inside its own `with`, never see each other's captures or edits.

Steps are counted per generation by the session that owns them, as scheduler steps: inside `run_pipeline`,
a scheduler that calls the denoiser several times a step (Heun, DPM-2: twice; PNDM's warm-up) has each call
recorded as a sub-call of its step, and `updates()` averages a step's calls (`calls=True` keeps them apart).
Outside `run_pipeline` the scheduler is unknown and each denoiser call counts as a step. Under classifier-free
guidance, the pipelines run the unconditional and conditional batches as one batch `[uncond, cond]`; records keep
the two halves apart (FLUX's distilled guidance has no unconditional half).

Generation itself (the thread-safe `run_pipeline`, `generate`, `on_each_step`) belongs to
`interp.models.t2i`; hooks learn from it whether the call in progress runs classifier-free
guidance (`current_generation_call`). Those names are re-exported here for existing callers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..edits import Edit, EditError, PreparedEdits, prepare_edits, validate_edits
from ..models.denoisers import UnsupportedPipeline, denoiser_of, family_of_module
from ..models.t2i import (SDXL_BLOCKS, BlockInfo, Cancelled, GenerationCall, block_info, current_generation_call,
                          default_latent_side, generate, on_each_step, private_pipeline, run_pipeline,
                          text_stream_info)
from ..names import block_name, split_site
from .scoped import ScopedHooks

HALVES = ("cond", "uncond", "all")
__all__ = ["BlockCapture", "Cancelled", "EditSession", "GenerationCall", "HookError", "NeuronCapture", "ScopedHooks",
           "StepRecord", "apply_edits", "block_name", "capture_denoiser_outputs", "capture_neurons", "capture_updates",
           "generate",
           "hookable_blocks", "hookable_sites", "mlp_neuron_modules", "neuron_directions", "on_each_step", "private_pipeline",
           "resolve_blocks", "run_pipeline", "unet_of"]


class HookError(ValueError):
    """A hook request that cannot be served (unknown block, missing half), with the valid choices."""


# ----------------------------------------------------------------------------- blocks

def unet_of(model_or_unet):
    """The denoiser (U-Net or DiT transformer) of a T2IModel, a diffusers pipeline, or the denoiser itself."""
    if isinstance(model_or_unet, torch.nn.Module):
        return model_or_unet
    if hasattr(model_or_unet, "denoiser"):
        return model_or_unet.denoiser
    denoiser = denoiser_of(model_or_unet)
    if denoiser is not None:
        return denoiser
    raise HookError(f"expected a T2IModel, a diffusers pipeline or a denoiser, not {type(model_or_unet).__name__}")


def _family(denoiser):
    try:
        return family_of_module(denoiser)
    except UnsupportedPipeline as err:
        raise HookError(str(err)) from None


def hookable_blocks(model_or_unet) -> dict[str, BlockInfo]:
    """Every block of the denoiser (name -> channels, height, width at the default size)."""
    if hasattr(model_or_unet, "blocks") and hasattr(model_or_unet, "family"):  # a T2IModel: its default size
        return dict(model_or_unet.blocks)
    denoiser = unet_of(model_or_unet)
    _family(denoiser)
    pipe_side = None if isinstance(model_or_unet, torch.nn.Module) else default_latent_side(model_or_unet)
    return block_info(denoiser, latent_side=pipe_side)


def hookable_sites(model_or_unet) -> dict:
    """`hookable_blocks` and the text streams of joint blocks (`<block>:text` -> TextStreamInfo; SD3, FLUX)."""
    if hasattr(model_or_unet, "sites") and hasattr(model_or_unet, "family"):  # a T2IModel
        return dict(model_or_unet.sites)
    denoiser = unet_of(model_or_unet)
    pipe = None if isinstance(model_or_unet, torch.nn.Module) else model_or_unet
    return {**hookable_blocks(model_or_unet), **text_stream_info(denoiser, pipe)}


def resolve_blocks(unet, names) -> dict[str, torch.nn.Module]:
    """Site name (a block, or a joint block's `<block>:text`) -> the block's module; an unknown name raises
    HookError listing the valid ones, a text stream the family's blocks do not write one saying why."""
    if isinstance(names, str):
        names = [names]
    valid = hookable_sites(unet)
    modules = dict(unet_of(unet).named_modules())
    resolved = {}
    for name in names:
        key = block_name(name)
        block, stream = split_site(key)
        if key not in valid:
            if stream == "text" and block in valid:
                raise HookError(_family(unet_of(unet)).no_text_stream(block))
            raise HookError(f"unknown block {name!r}; the denoiser's blocks are: {', '.join(valid)}")
        resolved[key] = modules[block]
    if not resolved:
        raise HookError(f"no block given; choose from: {', '.join(valid)}")
    return resolved


# ----------------------------------------------------------------------------- sessions

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
    step: int = -1        # scheduler step inside the current generation
    call: int = -1        # denoiser call inside the current generation
    sub_call: int = 0     # denoiser call inside the current step (Heun's second call: 1)
    cfg: bool = False
    grid: tuple[int, int] | None = None  # a DiT call's block grid (height, width); None for a U-Net
    last_timestep: float | None = None
    last_call: GenerationCall | None = None
    repeated: bool = False  # outside `run_pipeline`: the last call repeated its predecessor's timestep

    def advance(self, sample: torch.Tensor, timestep, encoder_hidden_states) -> None:
        call = current_generation_call()
        t = float(timestep.flatten()[0]) if isinstance(timestep, torch.Tensor) else float(timestep)
        if call is not None:
            new_generation = call is not self.last_call
            self.cfg = call.cfg
        else:
            # Schedulers walk timesteps downwards within one call. Heun and DPM-2 repeat each but the first once
            # (t0, t1, t1, t2, t2, ...); a timestep equal to the last is a new generation unless it is such a
            # repeat (so one-step generations, 999 each, stay apart).
            repeat = (self.last_timestep is not None and t == self.last_timestep and self.call > 0
                      and not self.repeated)
            new_generation = self.last_timestep is None or t > self.last_timestep or (
                t == self.last_timestep and not repeat)
            self.repeated = repeat
            self.cfg = _looks_like_cfg(sample, encoder_hidden_states)
        self.last_call, self.last_timestep = call, t
        self.call = 0 if new_generation else self.call + 1
        if new_generation:
            self.generation += 1
        step = call.step_of_call(self.call) if call is not None else self.call
        self.sub_call = 0 if new_generation or step != self.step else self.sub_call + 1
        self.step = step


class UNetSession(ScopedHooks):
    """Hooks on a denoiser's blocks (U-Net or DiT) that act only in the context that entered the session."""

    def __init__(self, model_or_unet, blocks):
        self.unet = unet_of(model_or_unet)
        self.family = _family(self.unet)
        self.modules = resolve_blocks(model_or_unet, blocks)
        self.blocks = list(self.modules)
        self.state = StepState()
        self._handles: list = []

    # Hooks are registered with kwargs, but torch adds a hook to the module before marking it as taking kwargs:
    # another thread's forward on the shared UNet can call it in between without them. That call is never this
    # session's (it is active only in its own context), so the hooks accept both forms and return at once.
    def _on_unet_call(self, module, args, kwargs=None):
        if not self._active():
            return None
        arguments = self.family.call_arguments(module, args, kwargs or {})
        sample = arguments.get("sample", arguments.get("hidden_states"))
        self.state.advance(sample, arguments["timestep"], arguments.get("encoder_hidden_states"))
        self.state.grid = self.family.token_grid(module, arguments)
        return None

    def _make_block_hook(self, name: str):
        if split_site(name)[1] == "text":
            return self._make_text_hook(name)

        def hook(module, args, *kwargs_and_output):
            if not self._active():
                return None
            kwargs, output = kwargs_and_output if len(kwargs_and_output) == 2 else ({}, kwargs_and_output[0])
            grid = self.state.grid
            block_input = self.family.to_grid(self.family.block_input(args, kwargs), grid)
            hidden = self.family.to_grid(self.family.block_output(output), grid)
            replaced = self.on_block(name, block_input, hidden)
            if replaced is None:
                return None
            return self.family.replace_output(output, self.family.from_grid(replaced, grid))
        return hook

    def _make_text_hook(self, name: str):
        """A joint block's text stream: (batch, tokens, C) in the block, (batch, C, tokens) to `on_block`."""
        def hook(module, args, *kwargs_and_output):
            if not self._active():
                return None
            kwargs, output = kwargs_and_output if len(kwargs_and_output) == 2 else ({}, kwargs_and_output[0])
            block_input = self.family.text_input(args, kwargs).transpose(1, 2)
            hidden = self.family.text_output(output).transpose(1, 2)
            replaced = self.on_block(name, block_input, hidden)
            if replaced is None:
                return None
            return self.family.replace_text_output(output, replaced.transpose(1, 2))
        return hook

    def on_block(self, name: str, block_input: torch.Tensor, output: torch.Tensor) -> torch.Tensor | None:
        """Called in the owning context with the site's input and output: a block's image streams, (batch, C, H, W)
        for every family, or a joint block's text streams (`<block>:text`), (batch, C, tokens); may return a new
        output of the same shape."""
        raise NotImplementedError

    def _register(self) -> None:
        self._handles.append(self.unet.register_forward_pre_hook(self._on_unet_call, with_kwargs=True))
        for name, module in self.modules.items():
            self._handles.append(module.register_forward_hook(self._make_block_hook(name), with_kwargs=True))


# ----------------------------------------------------------------------------- MLP neurons

def mlp_neuron_modules(model_or_unet, block: str) -> list[str]:
    """Module paths of the MLP input projections (``ff.net.0``: the neurons) of a block's transformer layers,
    in layer order: the U-Net's neuron sites."""
    unet = unet_of(model_or_unet)
    family = _family(unet)
    if family.tokens:
        raise HookError(f"MLP neuron sites are a U-Net's (the layers of its transformer blocks); {family.name} "
                        f"blocks have none here: edit their updates or SAE features instead")
    key = block_name(block)
    names = [n for n, _ in unet.named_modules() if n.startswith(key + ".transformer_blocks.") and n.endswith(".ff.net.0")]
    if not names:
        raise HookError(f"block {block} has no ff.net.0 (MLP) module")
    return sorted(names, key=lambda n: int(n.split(".transformer_blocks.")[1].split(".")[0]))


def neuron_directions(model_or_unet, block: str) -> torch.Tensor:
    """(layers, neurons, channels): what one unit of each neuron writes into the block update.

    ff.net.2 maps the neurons to the layer's hidden state and proj_out maps that to the
    update; both linear, so the write direction is proj_out.weight @ ff.net.2.weight[:, n].
    Exact for the last layer; for earlier ones it ignores what later layers do with it.
    """
    unet = unet_of(model_or_unet)
    modules = dict(unet.named_modules())
    proj_out = modules[block_name(block) + ".proj_out"].weight.detach().float()
    proj_out = proj_out.reshape(proj_out.shape[0], -1)  # a 1x1 convolution or a linear layer
    rows = []
    for name in mlp_neuron_modules(unet, block):
        ff2 = modules[name[: -len("0")] + "2"].weight.detach().float()  # (inner, neurons)
        rows.append((proj_out @ ff2).T)
    return torch.stack(rows)


class NeuronCapture(ScopedHooks):
    """The neuron activations (outputs of every ``ff.net.0``) of blocks, per U-Net call, in the owning context
    only: ``records[block]`` is a list over calls of a list over layers of (batch, tokens, neurons), float32 CPU;
    ``steps[block]`` the scheduler step of each call (Heun's two calls a step share one)."""

    def __init__(self, model_or_unet, blocks):
        self.unet = unet_of(model_or_unet)
        self.family = _family(self.unet)
        self.sites = {key: mlp_neuron_modules(self.unet, key) for key in resolve_blocks(self.unet, blocks)}
        self.records: dict[str, list[list[torch.Tensor]]] = {block: [] for block in self.sites}
        self.steps: dict[str, list[int]] = {block: [] for block in self.sites}
        self.state = StepState()
        self._handles: list = []

    def _on_unet_call(self, module, args, kwargs=None):
        if not self._active():
            return None
        arguments = self.family.call_arguments(module, args, kwargs or {})
        self.state.advance(arguments["sample"], arguments["timestep"], arguments.get("encoder_hidden_states"))
        return None

    def per_step(self, block: str) -> list[list[torch.Tensor]]:
        """``records[block]`` with the calls of each scheduler step averaged: a list over steps of a list over
        layers of (batch, tokens, neurons)."""
        grouped: dict[int, list[list[torch.Tensor]]] = {}
        for step, call in zip(self.steps[block], self.records[block]):
            grouped.setdefault(step, []).append(call)
        return [[torch.stack(layer).mean(0) for layer in zip(*calls)] if len(calls) > 1 else calls[0]
                for _, calls in sorted(grouped.items())]

    def _make_hook(self, block: str, layer: int):
        def hook(module, args, output):
            if not self._active():
                return None
            if layer == 0:
                self.records[block].append([])
                self.steps[block].append(self.state.step)
            self.records[block][-1].append(output.detach().float().cpu())
            return None
        return hook

    def _register(self) -> None:
        self._handles.append(self.unet.register_forward_pre_hook(self._on_unet_call, with_kwargs=True))
        modules = dict(self.unet.named_modules())
        for block, names in self.sites.items():
            for layer, name in enumerate(names):
                self._handles.append(modules[name].register_forward_hook(self._make_hook(block, layer)))


def capture_neurons(model_or_unet, blocks) -> NeuronCapture:
    """Context manager recording the MLP neurons of blocks at every U-Net call made in this context:

        with capture_neurons(model, ["up_blocks.0.attentions.1"]) as neurons:
            generate(model, "a red circle")
        neurons.records["up_blocks.0.attentions.1"]   # per call, per layer: (batch, tokens, neurons)
    """
    return NeuronCapture(model_or_unet, blocks)


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
    """One block at one denoiser call; tensors are the whole denoiser batch ([uncond, cond] under CFG)."""

    generation: int
    step: int                            # the scheduler step the call belongs to
    cfg: bool
    update: torch.Tensor                 # (batch, channels, height, width)
    output: torch.Tensor | None = None   # (batch, channels, height, width) when keep_output
    call: int = 0                        # denoiser call within the generation
    sub_call: int = 0                    # denoiser call within the step (0 unless the scheduler calls it twice)


class BlockCapture(UNetSession):
    """Records the update (and optionally the output) of each block at each step.

    Use through `capture_updates`. Read with `updates(block)`: (steps, batch, C, H, W), or (steps, batch, C, tokens)
    for a text stream `<block>:text`;
    the raw records are in `records[block]` (a list of StepRecord).
    """

    def __init__(self, model_or_unet, blocks=SDXL_BLOCKS, keep_output: bool = False,
                 device: str | torch.device | None = None, dtype: torch.dtype | None = None,
                 stop_after_last: bool = False):
        super().__init__(model_or_unet, blocks)
        self.keep_output = keep_output
        self.device = device
        self.dtype = dtype
        self.records = {name: [] for name in self.blocks}
        self.stop = None
        if stop_after_last:
            self.stop = stop_after_blocks(model_or_unet, self.blocks)

    def __enter__(self):
        super().__enter__()
        if self.stop is not None:
            try:
                self.stop.__enter__()  # after this session's hooks: they record the last block before it ends the call
            except BaseException:
                super().__exit__(None, None, None)
                raise
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            swallowed = self.stop is not None and self.stop.__exit__(exc_type, exc, tb)
        finally:
            super().__exit__(exc_type, exc, tb)
        return bool(swallowed)

    def _keep(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        if self.device is not None or self.dtype is not None:
            tensor = tensor.to(device=self.device or tensor.device, dtype=self.dtype or tensor.dtype)
        return tensor

    def on_block(self, name, block_input, output):
        update = self._keep(output - block_input)
        # The output tensor flows on through the denoiser; keep a copy of our own.
        kept_output = self._keep(output).clone() if self.keep_output else None
        self.records[name].append(StepRecord(self.state.generation, self.state.step, self.state.cfg,
                                             update, kept_output, self.state.call, self.state.sub_call))
        return None

    @property
    def n_generations(self) -> int:
        return self.state.generation + 1

    def _select(self, block: str, generation: int) -> list[StepRecord]:
        key = block_name(block)
        if key not in self.records:
            raise HookError(f"site {block!r} was not captured; captured: {', '.join(self.records)}")
        if self.n_generations == 0:
            raise HookError("nothing was captured: no generation ran inside the `with` block")
        index = generation if generation >= 0 else self.n_generations + generation
        if not 0 <= index < self.n_generations:
            raise HookError(f"generation {generation} out of range: {self.n_generations} captured")
        return [r for r in self.records[key] if r.generation == index]

    def calls_per_step(self, block: str, generation: int = -1) -> list[int]:
        """How many denoiser calls each scheduler step of one generation made (Heun, 4 steps: [2, 2, 2, 1])."""
        counts: dict[int, int] = {}
        for record in self._select(block, generation):
            counts[record.step] = counts.get(record.step, 0) + 1
        return [counts[step] for step in sorted(counts)]

    def _per_step(self, block: str, half: str, generation: int, calls: bool, value) -> torch.Tensor:
        if half not in HALVES:
            raise HookError(f"half must be one of {', '.join(HALVES)}, not {half!r}")
        records = self._select(block, generation)
        if calls:
            return torch.stack([_halves(value(r), r.cfg, half) for r in records])
        by_step: dict[int, list[torch.Tensor]] = {}
        for r in records:
            by_step.setdefault(r.step, []).append(_halves(value(r), r.cfg, half))
        return torch.stack([group[0] if len(group) == 1 else torch.stack(group).mean(0)
                            for _, group in sorted(by_step.items())])

    def updates(self, block: str, half: str = "cond", generation: int = -1, calls: bool = False) -> torch.Tensor:
        """(steps, batch, channels, height, width): the block's update at each scheduler step of one generation;
        (steps, batch, channels, tokens) for a joint block's text stream (`<block>:text`);
        a step of several denoiser calls (Heun, DPM-2, PNDM's warm-up) gives the mean of their updates.
        ``calls=True``: (calls, batch, C, H, W), every denoiser call apart (`records[block][i].step` says whose).

        half: "cond" (the conditional half; the whole batch without CFG), "uncond", or "all".
        """
        return self._per_step(block, half, generation, calls, lambda r: r.update)

    def outputs(self, block: str, half: str = "cond", generation: int = -1, calls: bool = False) -> torch.Tensor:
        """(steps, batch, channels, height, width): the block's output (needs keep_output=True), per step as
        `updates`."""
        if not self.keep_output:
            raise HookError("outputs were not kept: use capture_updates(..., keep_output=True)")
        return self._per_step(block, half, generation, calls, lambda r: r.output)

    def clear(self) -> None:
        for records in self.records.values():
            records.clear()


def capture_updates(model_or_unet, blocks=SDXL_BLOCKS, keep_output: bool = False,
                    device: str | torch.device | None = None, dtype: torch.dtype | None = None,
                    stop_after_last: bool = False) -> BlockCapture:
    """Context manager recording each block's update (output - input) at each denoising step.

        with capture_updates(model, ["mid_block.attentions.0"]) as cap:
            generate(model, "a red circle")
        cap.updates("mid_block.attentions.0")   # (steps, batch, C, H, W)

    blocks may name the text stream of a joint block (SD3, FLUX): `transformer_blocks.0:text`, recorded as
    (steps, batch, C, tokens).

    device/dtype: where to keep the records (e.g. "cpu", torch.float16); default: as computed.

    stop_after_last: for a caller that throws the image away. Each generation's final denoiser call ends after the
    last of these blocks it runs, and nothing after it (the rest of the denoiser, the last scheduler step, the VAE)
    runs; the pipeline call returns nothing, and the records are bit for bit those of a whole generation
    (`interp.hooks.truncate`). Where the last call cannot be known it runs whole.
    """
    return BlockCapture(model_or_unet, blocks, keep_output=keep_output, device=device, dtype=dtype,
                        stop_after_last=stop_after_last)


class DenoiserOutputs(ScopedHooks):
    """Records what the denoiser returns at each of its calls (the noise, velocity or sample prediction the
    scheduler steps with), the whole batch ([uncond, cond] under CFG) as computed, a copy on the CPU in float32.
    Use through `capture_denoiser_outputs`; read `outputs` (one tensor per call, in call order)."""

    def __init__(self, model_or_unet):
        self.unet = unet_of(model_or_unet)
        self.outputs: list[torch.Tensor] = []
        self._handles: list = []

    def _hook(self, module, args, output):
        if not self._active():
            return None
        sample = output[0] if isinstance(output, tuple) else getattr(output, "sample", output)
        self.outputs.append(sample.detach().float().cpu().clone())
        return None

    def _register(self) -> None:
        self._handles.append(self.unet.register_forward_hook(self._hook))


def capture_denoiser_outputs(model_or_unet) -> DenoiserOutputs:
    """Context manager recording the denoiser's output at every call of the generations run inside it:

        with capture_denoiser_outputs(model) as out:
            generate(model, "a red circle")
        out.outputs          # [(batch, C, H, W)] per denoiser call ((batch, tokens, C) for a packed DiT)

    It sees the output after every block edit of an `apply_edits` session entered with it, so a splice's effect on
    what the denoiser predicts is `outputs` with the splice against without (`saes.bench.image`)."""
    return DenoiserOutputs(model_or_unet)


# ----------------------------------------------------------------------------- intervention

class EditSession(UNetSession):
    """Applies edits to block updates: output = input + edited(update). Use through `apply_edits`."""

    def __init__(self, model_or_unet, edits: list[Edit], saes: dict | None = None, n_steps: int | None = None):
        edits = [e if isinstance(e, Edit) else Edit.from_dict(e) for e in edits]
        saes = {block_name(k): v for k, v in (saes or {}).items()}
        text = [e.block for e in edits if split_site(e.block)[1] == "text"]
        if text:  # a text stream the family's blocks do not write: say why before "unknown block"
            resolve_blocks(model_or_unet, text)
        validate_edits(edits, hookable_sites(model_or_unet), saes=saes, n_steps=n_steps)
        if not edits:
            raise EditError("no edit given")
        super().__init__(model_or_unet, sorted({block_name(e.block) for e in edits}))
        self.prepared: PreparedEdits = prepare_edits(edits, saes)

    def on_block(self, name, block_input, output):
        update = output - block_input
        text = update.ndim == 3  # a text stream (batch, C, tokens): edited as a 1 x tokens row (no mask reaches it)
        shaped = update.unsqueeze(2) if text else update
        edited = self.prepared.apply(name, shaped, step=self.state.step, cfg=self.state.cfg)
        if edited is shaped:
            return None  # no edit at this step: leave the block's output untouched
        return block_input + (edited.squeeze(2) if text else edited)


def apply_edits(model_or_unet, edits, saes: dict | None = None, n_steps: int | None = None) -> EditSession:
    """Context manager applying edits (Edit objects or their dicts) while it is active.

    saes: block name -> SAE (any object with encode (N, C) -> (N, F), decode (N, F) -> (N, C)
    and W_dec (F, C)), needed by feature edits and splices. n_steps, when given, checks
    that every edit's steps exist.
    """
    return EditSession(model_or_unet, edits, saes=saes, n_steps=n_steps)


# ----------------------------------------------------------------------------- truncation: a generation's final call
# (`interp.hooks.truncate`'s docstring tells the story: a capture whose caller throws the image away ends early)

def last_needed_block(model_or_unet, sites: Sequence[str]) -> str:
    """The block, of those the ``sites`` (blocks, or joint blocks' `<block>:text`) name, that a denoiser call runs
    last."""
    denoiser = unet_of(model_or_unet)
    blocks = {split_site(site)[0] for site in resolve_blocks(model_or_unet, list(sites))}
    order = family_of_module(denoiser).execution_order(denoiser)
    return max(blocks, key=order.index)


def _reads_after(session, denoiser, position: int, order: list[str]) -> bool:
    """Whether another active session may need the denoiser past block ``order[position]`` (True when unsure)."""
    if isinstance(session, StopAfterBlocks):
        return session.unet is denoiser and order.index(session.block) > position
    if isinstance(session, EditSession):
        return False  # it changes outputs this generation throws away; what it edits earlier runs
    if isinstance(session, (UNetSession, NeuronCapture)):
        if session.unet is not denoiser:
            return False
        blocks = session.sites if isinstance(session, NeuronCapture) else session.modules
        return any(order.index(split_site(site)[0]) > position for site in blocks)
    if getattr(session, "lm", None) is not None:
        return False  # a language model's session
    unet = getattr(session, "unet", None)
    return unet is None or unet is denoiser  # hooks of its own on this denoiser, or unknown: it may read on


class _StopGeneration(Exception):
    """Raised by a `StopAfterBlocks` hook; never leaves that session's ``with`` block."""

    def __init__(self, session):
        super().__init__()
        self.session = session


class StopAfterBlocks(ScopedHooks):
    """Ends each generation run in this context at its final denoiser call, once ``block`` has run
    (`stop_after_blocks`). ``stopped``: how many generations it ended early."""

    def __init__(self, model_or_unet, block: str):
        self.unet = unet_of(model_or_unet)
        self.block = block_name(block)
        self.module = resolve_blocks(model_or_unet, [self.block])[self.block]
        self.order = family_of_module(self.unet).execution_order(self.unet)
        self.position = self.order.index(self.block)
        self.stopped = 0
        self._generation = None  # the GenerationCall of the generation in progress
        self._call = -1          # its denoiser call in progress
        self._final = False      # that call is the generation's last: stop it after the block
        self._handles: list = []

    def _on_denoiser_call(self, module, args, kwargs=None):
        from .scoped import _ACTIVE_SESSIONS

        if not self._active():
            return None
        call = current_generation_call()
        if call is None:  # outside `run_pipeline`: the scheduler, and so the last call, is unknown
            self._final = False
            return None
        self._call = 0 if call is not self._generation else self._call + 1
        self._generation = call
        last = call.last_call()
        self._final = (last is not None and self._call == last and not any(
            _reads_after(s, self.unet, self.position, self.order) for s in _ACTIVE_SESSIONS.get() if s is not self))
        return None

    def _on_block(self, module, args, output):
        if not self._active() or not self._final:
            return None
        self._final = False
        self.stopped += 1
        from ..models.t2i import report_last_step

        report_last_step(self._generation)
        raise _StopGeneration(self)

    def _register(self) -> None:
        self._handles.append(self.unet.register_forward_pre_hook(self._on_denoiser_call, with_kwargs=True))
        self._handles.append(self.module.register_forward_hook(self._on_block))

    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        return isinstance(exc, _StopGeneration) and exc.session is self


def stop_after_blocks(model_or_unet, sites: Sequence[str]) -> StopAfterBlocks:
    """A `StopAfterBlocks` at the block of ``sites`` a denoiser call runs last (`interp.hooks.truncate`). Enter it
    after the capture it serves, so that the capture's hook on that block records first:

        with capture_updates(model, sites) as cap, stop_after_blocks(model, sites):
            generate(model, prompts, output_type="latent")
    """
    return StopAfterBlocks(model_or_unet, last_needed_block(model_or_unet, sites))

"""Edit methods: each turns a task (and the two generations it starts from) into edits.

Every method starts from the same two generations, made with the task's seed: the
original prompt and the edited prompt, with the block updates (and, for the neuron
baseline, the MLP neurons) captured at every step (`prepare_task`). A method returns
`interp.edits.Edit`s that are applied at every step while the *original* prompt is
generated again; the prompt swap returns no edit and the edited prompt instead.

Registered methods (add one with `@register_method("name")`):

- `sae` — SAE feature transport. Block updates inside the masks are encoded by each
  block's SAE; feature f of block b is scored by its normalised mean activation in the
  edited pass (target region) minus the original pass (source region); the top k_trans
  features, chosen jointly across the blocks, are added (their edited-pass activations
  times their decoder rows, inside the target region, keeping the spatial layout) and the
  bottom k_trans are subtracted (their original-pass activations, inside the source
  region), all times the multiplier m. `variant="static"` transports these stored
  amounts; `variant="adaptive"` re-encodes the update being generated at every step and
  moves each selected feature towards its target level: added features to
  (1 - m) a_now + m a_edited, subtracted features to (1 - m) a_now.
- `activation-diff` — no SAE: the spatial field (edited-pass update inside the target
  region minus original-pass update inside the source region) of each block, added as
  its best rank-k_trans approximation (k_trans spatial maps times channel directions).
- `neurons` — MLP neurons (`ff.net.0` of the blocks' transformer layers) selected by the
  same score, transported along the direction each neuron writes into the block update.
- `prompt-swap` — the reference: generate the edited prompt itself.

Scores are normalised so that blocks compare: activation times the norm of the unit's
write direction, divided by the block's mean update norm (over both passes).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from interp.edits import Edit, downsample_mask
from interp.hooks import capture_updates, generate
from interp.hooks.diffusion import capture_neurons, neuron_directions
from interp.names import block_name
from interp.models.t2i import SDXL_BLOCKS

from .tasks import Task, TaskError

VARIANTS = ("static", "adaptive")  # every variant of any method (the UI's choice)


def short_block_name(block: str) -> str:
    """down_blocks.2.attentions.1 -> down2.1, mid_block.attentions.0 -> mid, up_blocks.1.attentions.2 -> up1.2."""
    parts = block.split(".")
    if parts[0] == "mid_block" and parts[-1] == "0":
        return "mid"
    if len(parts) == 4 and parts[0] in ("down_blocks", "up_blocks") and parts[2] == "attentions":
        return f"{parts[0].removesuffix('_blocks')}{parts[1]}.{parts[3]}"
    return block


class MethodError(ValueError):
    """A method configuration that cannot run (unknown method, k_trans too large, missing SAE)."""


# The multipliers a configuration may have: 0 moves nothing, 1 the measured amounts; beyond 10 times them an edit
# only saturates the image (the sweep's grid is 0.5 to 2), and 1e30 overflows the update to infinities.
MULTIPLIER_RANGE = (0.0, 10.0)


@dataclass
class MethodConfig:
    """What edits a task: the method's registered name and its knobs (serialises to JSON)."""

    method: str = "sae"
    k_trans: int = 5
    multiplier: float = 1.0
    blocks: list[str] = field(default_factory=lambda: list(SDXL_BLOCKS))
    variant: str = "static"          # sae: static | adaptive
    mask_threshold: float = 1e-6     # a block position is in a region when this share of its pixels is

    def __post_init__(self):
        if self.method not in METHODS:
            raise MethodError(f"unknown method {self.method!r}; the registered methods are: {', '.join(METHODS)}")
        if isinstance(self.k_trans, bool) or not isinstance(self.k_trans, (int, np.integer)) or self.k_trans < 1:
            raise MethodError(f"k_trans must be a positive integer, not {self.k_trans!r}")
        self.k_trans = int(self.k_trans)
        m = float(self.multiplier)
        if not np.isfinite(m) or not MULTIPLIER_RANGE[0] <= m <= MULTIPLIER_RANGE[1]:
            raise MethodError(f"the multiplier m must be from {MULTIPLIER_RANGE[0]:g} to {MULTIPLIER_RANGE[1]:g}, not "
                              f"{self.multiplier!r} (m scales the moved amounts: 0 moves nothing, 1 what was measured)")
        self.multiplier = m
        if isinstance(self.blocks, str):
            self.blocks = [self.blocks]
        self.blocks = [block_name(b) for b in self.blocks]
        if not self.blocks:
            raise MethodError("no block given")
        variants = METHODS[self.method].variants
        if self.variant not in variants:
            raise MethodError(f"{self.method} has the variant(s) {', '.join(variants)}, not {self.variant!r}")

    @classmethod
    def named(cls, name: str, **knobs) -> "MethodConfig":
        """The configuration of a method by its CLI name (``sae``, ``sae-adaptive``: see ``method_names``)."""
        method, variant = parse_method_name(name)
        return cls(method, variant=variant, **knobs)

    @property
    def method_name(self) -> str:
        """The method with its variant, as the CLI names it: ``sae``, ``sae-adaptive``, ``neurons``."""
        default = METHODS[self.method].variants[0]
        return self.method if self.variant == default else f"{self.method}-{self.variant}"

    @property
    def edits_blocks(self) -> bool:
        return METHODS[self.method].edits_blocks

    @property
    def block(self) -> str | None:
        """The one block this configuration edits, or None (several, or none)."""
        return self.blocks[0] if self.edits_blocks and len(self.blocks) == 1 else None

    @property
    def label(self) -> str:
        """A short name for tables and plots: method, variant, blocks (unless SDXL's four): one block by
        its name, several by short names (`sae@down2.1+mid+up0.0+up0.1+up1.1+up1.2`)."""
        name = self.method_name
        if not self.edits_blocks:
            return name
        if len(self.blocks) == 1:
            name += "@" + self.blocks[0]
        elif sorted(self.blocks) != sorted(SDXL_BLOCKS):
            name += "@" + "+".join(short_block_name(b) for b in self.blocks)
        return name

    def key(self) -> str:
        """A file-safe identity of the configuration (its results directory)."""
        if not self.edits_blocks:
            return self.method_name
        key = f"{self.label.replace('@', '__').replace('+', '_')}__k{self.k_trans}__m{self.multiplier:g}"
        if len(key) > 160:  # many blocks: keep the name within file-system limits (255 bytes), still unique
            import hashlib

            digest = hashlib.sha1(key.encode()).hexdigest()[:12]
            key = f"{key[:120]}__{digest}"
        return key

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MethodConfig":
        return cls(**d)


METHODS: dict[str, type] = {}


def method_names(edits_blocks: bool | None = None) -> list[str]:
    """Every runnable method by name, variants as ``method-variant`` (the first variant is the plain name);
    ``edits_blocks`` True/False: only the methods that do/do not edit blocks."""
    return [name if i == 0 else f"{name}-{variant}" for name, cls in METHODS.items()
            if edits_blocks is None or cls.edits_blocks == edits_blocks for i, variant in enumerate(cls.variants)]


def parse_method_name(name: str) -> tuple[str, str]:
    """(method, variant) of a name from ``method_names``; a MethodError listing them otherwise."""
    if name in METHODS:
        return name, METHODS[name].variants[0]
    method, _, variant = name.rpartition("-")
    if method in METHODS and variant in METHODS[method].variants:
        return method, variant
    raise MethodError(f"unknown method {name!r}; the methods are: {', '.join(method_names())}")


def register_method(name: str):
    """Class decorator: make an edit method available by name (CLI, runner, sweep)."""
    def decorate(cls):
        cls.name = name
        METHODS[name] = cls
        return cls
    return decorate


# ----------------------------------------------------------------------------- the two generations

@dataclass
class TaskContext:
    """A task's two generations and its regions, shared by every method and configuration.

    updates_*: block -> (steps, channels, height, width), the conditional half.
    neurons_*: block -> (steps, layers, height, width, neurons) when captured.
    *_region: block -> (height, width) float, 1 inside the region at the block's resolution.
    """

    task: Task
    seed: int
    steps: int
    original_image: object
    edited_image: object
    updates_original: dict[str, torch.Tensor]
    updates_edited: dict[str, torch.Tensor]
    source_region: dict[str, np.ndarray]
    target_region: dict[str, np.ndarray]
    neurons_original: dict[str, torch.Tensor] | None = None
    neurons_edited: dict[str, torch.Tensor] | None = None
    notes: list[str] = field(default_factory=list)


def block_region(mask: np.ndarray, info, threshold: float) -> np.ndarray:
    return np.asarray(downsample_mask(mask, info, threshold=threshold), np.float32)


def prepare_task(model, task: Task, blocks: list[str], seed: int | None = None, steps: int | None = None,
                 neurons: bool = False, mask_threshold: float = 1e-6) -> TaskContext:
    """Generate the original and edited prompts with the same seed, capturing the blocks."""
    unknown = [b for b in blocks if b not in model.blocks]
    if unknown:
        raise MethodError(f"unknown block(s) {', '.join(unknown)}; the model's blocks are: {', '.join(model.blocks)}")
    seed = task.seed if seed is None else seed
    steps = model.default_steps if steps is None else steps
    images, updates, neuron_records = [], [], []
    for prompt in (task.original, task.edited):
        neuron_ctx = capture_neurons(model, blocks) if neurons else contextlib.nullcontext(None)
        with capture_updates(model, blocks, device="cpu", dtype=torch.float32) as cap, neuron_ctx as recorded:
            images.append(generate(model, prompt, steps=steps, seed=seed)[0])
        updates.append({b: cap.updates(b, half="cond")[:, -1] for b in blocks})
        if neurons:
            per_block = {}
            for b in blocks:
                info = model.blocks[b]
                # one record per scheduler step (its calls averaged); each layer (batch, tokens, neurons); keep
                # the cond row (last)
                calls = recorded.per_step(b)
                per_block[b] = torch.stack([torch.stack([layer[-1] for layer in call]) for call in calls]) \
                    .reshape(len(calls), -1, info.height, info.width, calls[0][0].shape[-1])
            neuron_records.append(per_block)
    size = np.asarray(images[0]).shape[:2]
    notes = []
    for which, value in (("source", task.source_mask), ("target", task.target_mask)):
        if isinstance(value, str) and (value == "#everything" or task.foreground_mask is None):
            notes.append(f"{which} region: whole image ({value})")
    source = task.region("source", size)
    target = task.region("target", size)
    return TaskContext(
        task=task, seed=seed, steps=steps, original_image=images[0], edited_image=images[1],
        updates_original=updates[0], updates_edited=updates[1],
        source_region={b: block_region(source, model.blocks[b], mask_threshold) for b in blocks},
        target_region={b: block_region(target, model.blocks[b], mask_threshold) for b in blocks},
        neurons_original=neuron_records[0] if neurons else None,
        neurons_edited=neuron_records[1] if neurons else None, notes=notes)


# ----------------------------------------------------------------------------- the plan of an edit

@dataclass
class EditPlan:
    """What a method decided for one task: the prompt to generate, the edits, and the units chosen.

    selected: one dict per chosen unit: block, unit (feature or neuron index), score, sign (+1 added,
    -1 subtracted).
    """

    prompt: str
    edits: list[Edit] = field(default_factory=list)
    saes: dict = field(default_factory=dict)
    selected: list[dict] = field(default_factory=list)


def weighted_mean(values: torch.Tensor, region: np.ndarray) -> torch.Tensor:
    """Mean over steps and region positions: values (steps, height, width, units) -> (units,)."""
    weights = torch.as_tensor(region, dtype=values.dtype)
    total = weights.sum() * values.shape[0]
    if total <= 0:
        return torch.zeros(values.shape[-1], dtype=values.dtype)
    return (values * weights[None, :, :, None]).sum(dim=(0, 1, 2)) / total


def block_scale(ctx: TaskContext, block: str) -> float:
    """Mean norm of the block's update over every position, step and both passes."""
    both = torch.cat([ctx.updates_original[block], ctx.updates_edited[block]])  # (2 steps, C, H, W)
    return float(both.norm(dim=1).mean()) or 1.0


def select_jointly(scores: dict[str, torch.Tensor], k: int) -> tuple[list[tuple[str, int, float]],
                                                                       list[tuple[str, int, float]]]:
    """The k highest positive and k lowest negative scores across all blocks: (block, unit, score)."""
    flat = [(b, i, float(s)) for b, v in scores.items() for i, s in enumerate(v.tolist())]
    if k > len(flat):
        raise MethodError(f"k_trans={k} is larger than the {len(flat)} units available in "
                          f"{', '.join(scores)}")
    ranked = sorted(flat, key=lambda t: t[2])
    top = [t for t in reversed(ranked[-k:]) if t[2] > 0]
    bottom = [t for t in ranked[:k] if t[2] < 0]
    return top, bottom


class Method:
    """Base class: `plan(ctx, config)` returns an EditPlan."""

    name = "method"
    needs_neurons = False
    needs_saes = False
    variants: tuple[str, ...] = ("static",)  # the first is the default; others are named "method-variant"
    edits_blocks = True                       # False: a reference that edits no block (its blocks are ignored)

    def __init__(self, model, saes: dict | None = None):
        self.model = model
        self.saes = saes or {}

    def check(self, config: MethodConfig) -> None:
        """Raise MethodError when the configuration cannot run with this model and these SAEs."""
        unknown = [b for b in config.blocks if b not in self.model.blocks]
        if unknown:
            raise MethodError(f"unknown block(s) {', '.join(unknown)}; the model's blocks are: "
                              f"{', '.join(self.model.blocks)}")

    def plan(self, ctx: TaskContext, config: MethodConfig) -> EditPlan:
        raise NotImplementedError


@register_method("prompt-swap")
class PromptSwap(Method):
    """The reference: the edited prompt, generated with the same seed."""

    edits_blocks = False

    def plan(self, ctx, config):
        return EditPlan(prompt=ctx.task.edited)


@register_method("sae")
class SAEFeatureTransport(Method):
    needs_saes = True
    variants = ("static", "adaptive")

    def check(self, config):
        super().check(config)
        missing = [b for b in config.blocks if b not in self.saes]
        if missing:
            raise MethodError(f"no SAE for block(s) {', '.join(missing)} (SAEs given for: "
                              f"{', '.join(self.saes) or 'none'}); pass --saes DIR with one SAE directory per block")
        total = sum(int(self.saes[b].W_dec.shape[0]) for b in config.blocks)
        if config.k_trans > total:
            raise MethodError(f"k_trans={config.k_trans} is larger than the {total} SAE features of "
                              f"{', '.join(config.blocks)}")

    def encode(self, block: str, updates: torch.Tensor) -> torch.Tensor:
        """(steps, C, H, W) -> (steps, H, W, features)."""
        sae = self.saes[block]
        with torch.no_grad():
            return sae.encode(updates.permute(0, 2, 3, 1).to(sae.W_dec.dtype)).float()

    def plan(self, ctx, config):
        self.check(config)
        codes_original, codes_edited, scores = {}, {}, {}
        for b in config.blocks:
            codes_original[b] = self.encode(b, ctx.updates_original[b])
            codes_edited[b] = self.encode(b, ctx.updates_edited[b])
            decoder_norm = self.saes[b].W_dec.detach().float().norm(dim=1)
            scale = decoder_norm / block_scale(ctx, b)
            scores[b] = (weighted_mean(codes_edited[b], ctx.target_region[b])
                         - weighted_mean(codes_original[b], ctx.source_region[b])) * scale
        top, bottom = select_jointly(scores, config.k_trans)
        m = config.multiplier
        edits: list[Edit] = []
        for b, f, _ in top:
            for s in range(codes_edited[b].shape[0]):
                amount = ctx.target_region[b] * codes_edited[b][s, :, :, f].numpy()
                if config.variant == "adaptive":  # remove m * a_now first: the feature moves to its target level
                    edits.append(Edit(block=b, mode="scale", feature=f, strength=1 - m, steps=[s],
                                      mask=ctx.target_region[b]))
                edits.append(Edit(block=b, mode="add", feature=f, strength=m, steps=[s], mask=amount))
        for b, f, _ in bottom:
            for s in range(codes_original[b].shape[0]):
                if config.variant == "adaptive":
                    edits.append(Edit(block=b, mode="scale", feature=f, strength=1 - m, steps=[s],
                                      mask=ctx.source_region[b]))
                else:
                    amount = ctx.source_region[b] * codes_original[b][s, :, :, f].numpy()
                    edits.append(Edit(block=b, mode="add", feature=f, strength=-m, steps=[s], mask=amount))
        selected = [{"block": b, "unit": f, "score": sc, "sign": 1} for b, f, sc in top] + \
                   [{"block": b, "unit": f, "score": sc, "sign": -1} for b, f, sc in bottom]
        return EditPlan(prompt=ctx.task.original, edits=edits,
                        saes={b: self.saes[b] for b in {e.block for e in edits}}, selected=selected)


@register_method("neurons")
class NeuronTransport(Method):
    """MLP neurons selected by the transport score and transported along their write directions."""

    needs_neurons = True

    def check(self, config):
        super().check(config)
        total = sum(neuron_directions(self.model.unet, b).shape[0] * neuron_directions(self.model.unet, b).shape[1]
                    for b in config.blocks)
        if config.k_trans > total:
            raise MethodError(f"k_trans={config.k_trans} is larger than the {total} MLP neurons of "
                              f"{', '.join(config.blocks)}")

    def plan(self, ctx, config):
        super().check(config)
        if ctx.neurons_original is None:
            raise MethodError("the task was prepared without neuron captures (prepare_task(..., neurons=True))")
        scores, directions = {}, {}
        for b in config.blocks:
            dirs = neuron_directions(self.model.unet, b)  # (layers, neurons, C)
            directions[b] = dirs.reshape(-1, dirs.shape[-1])
            # units are (layer, neuron) flattened; activations (steps, H, W, layers * neurons)
            a_o = ctx.neurons_original[b].permute(0, 2, 3, 1, 4).flatten(3)
            a_e = ctx.neurons_edited[b].permute(0, 2, 3, 1, 4).flatten(3)
            scores[b] = (weighted_mean(a_e, ctx.target_region[b]) - weighted_mean(a_o, ctx.source_region[b])) \
                * directions[b].norm(dim=1) / block_scale(ctx, b)
        top, bottom = select_jointly(scores, config.k_trans)
        m = config.multiplier
        edits = []
        for sign, chosen, acts, regions in ((1, top, ctx.neurons_edited, ctx.target_region),
                                            (-1, bottom, ctx.neurons_original, ctx.source_region)):
            for b, n, _ in chosen:
                flat = acts[b].permute(0, 2, 3, 1, 4).flatten(3)
                for s in range(flat.shape[0]):
                    edits.append(Edit(block=b, mode="add", direction=directions[b][n].tolist(), strength=sign * m,
                                      steps=[s], mask=regions[b] * flat[s, :, :, n].numpy()))
        selected = [{"block": b, "unit": n, "score": sc, "sign": 1} for b, n, sc in top] + \
                   [{"block": b, "unit": n, "score": sc, "sign": -1} for b, n, sc in bottom]
        return EditPlan(prompt=ctx.task.original, edits=edits, selected=selected)


@register_method("activation-diff")
class ActivationDifference(Method):
    """Steering with the raw update difference, no SAE: rank-k_trans approximation per block."""

    def check(self, config):
        super().check(config)
        limit = min(min(self.model.blocks[b].channels, self.model.blocks[b].height * self.model.blocks[b].width)
                    for b in config.blocks)
        if config.k_trans > limit:
            raise MethodError(f"k_trans={config.k_trans} is larger than the rank of a block's update field "
                              f"({limit} for {', '.join(config.blocks)})")

    def plan(self, ctx, config):
        self.check(config)
        edits, selected = [], []
        for b in config.blocks:
            target = torch.as_tensor(ctx.target_region[b])[None, None]
            source = torch.as_tensor(ctx.source_region[b])[None, None]
            field_ = ctx.updates_edited[b] * target - ctx.updates_original[b] * source  # (steps, C, H, W)
            steps, c, h, w = field_.shape
            for s in range(steps):
                matrix = field_[s].reshape(c, h * w).T  # (positions, channels)
                u, sv, vh = torch.linalg.svd(matrix, full_matrices=False)
                for i in range(config.k_trans):
                    if sv[i] <= 1e-8 * max(float(sv[0]), 1e-12):
                        break
                    edits.append(Edit(block=b, mode="add", direction=vh[i].tolist(), strength=config.multiplier,
                                      steps=[s], mask=(u[:, i] * sv[i]).reshape(h, w).tolist()))
                    if s == 0:
                        selected.append({"block": b, "unit": i, "score": float(sv[i]) / block_scale(ctx, b),
                                         "sign": 1})
        return EditPlan(prompt=ctx.task.original, edits=edits, selected=selected)


def make_method(name: str, model, saes: dict | None = None) -> Method:
    if name not in METHODS:
        raise MethodError(f"unknown method {name!r}; the registered methods are: {', '.join(METHODS)}")
    return METHODS[name](model, saes)


def run_plan(model, ctx: TaskContext, plan: EditPlan):
    """The edited image: the plan's prompt, same seed and steps, with its edits applied at every step."""
    from interp.hooks import apply_edits

    if plan.prompt == ctx.task.edited and not plan.edits:
        return ctx.edited_image  # the prompt swap: already generated
    if not plan.edits:
        return ctx.original_image  # nothing selected: the regeneration is the original
    with apply_edits(model, plan.edits, saes=plan.saes, n_steps=ctx.steps):
        return generate(model, plan.prompt, steps=ctx.steps, seed=ctx.seed)[0]


# ----------------------------------------------------------------------------- SAEs from disk

def load_saes(directory: str | Path, blocks: list[str]) -> dict:
    """Block -> SAE from `directory/<block>/` (sae-lens format: cfg.json + sae_weights.safetensors)."""
    from saes.sae import SAEFormatError, load_sae_set

    try:
        return load_sae_set(directory, blocks)
    except SAEFormatError as err:
        raise MethodError(str(err)) from None


__all__ = ["METHODS", "method_names", "parse_method_name", "MethodConfig", "MethodError", "EditPlan", "TaskContext", "TaskError", "load_saes",
           "make_method", "prepare_task", "register_method", "run_plan"]

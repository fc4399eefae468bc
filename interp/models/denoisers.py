"""One adapter per denoiser family: what the hooks, the store and the edits need to know of a diffusers
text-to-image pipeline, resolved once when it is loaded (`family_of`), so that no caller assumes SDXL.

A family is data (`DenoiserFamily`), registered by the class name of its denoiser, like sae-lens' architectures:

- its **blocks**: the U-Net's `Transformer2DModel`s (`down_blocks.2.attentions.1`, ...), or the items of a DiT's
  block lists (`transformer_blocks.3`, `single_transformer_blocks.0`);
- how a block's **update** is read: output minus input of the image stream, on a (channels, height, width) grid.
  U-Net blocks are already (batch, C, H, W). DiT blocks hold a token sequence (batch, tokens, C) laid out row by row
  on the latent grid divided by the patch size (FLUX packs 2 x 2 latent pixels into a token on top of that): it is
  mapped to (batch, C, H / p, W / p) and back, so masks, SAEs and the store see every family alike. Joint (MMDiT)
  blocks of SD3 and FLUX return `(text stream, image stream)`: a block's update is the image stream's;
- the **text stream** of those joint blocks, a site of its own named `<block>:text` (`interp.names.text_site`):
  output minus input of the text tokens (`encoder_hidden_states`), (batch, C, tokens), a sequence with no grid.
  Which blocks write one (SD3's last block reads the text stream but writes none) and how many tokens it holds
  at the pipeline's defaults (the padded sequences of `text_sequence`, concatenated);
- which batch rows are the **CFG halves**: `[uncond, cond]` when guidance > 1 (SD 1.x/2.x/SDXL, SD3, PixArt, Sana),
  none for FLUX (its guidance is an embedding distilled into the model);
- which **tokenizers** read the prompt and how many tokens each takes;
- the pipeline-call options the workbench's given latents need (PixArt and Sana would otherwise resize the request
  to an aspect-ratio bin the latents were not drawn for).

Add a family with `register_family(DenoiserFamily(...))`; a pipeline whose denoiser has no family is refused by
`family_of` with one line naming the pipeline class and the supported families.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

UNET_BLOCK_CLASS = "Transformer2DModel"  # a U-Net's hookable blocks: its spatial transformers


class UnsupportedPipeline(ValueError):
    """A pipeline whose denoiser has no adapter in `FAMILIES`."""


@dataclass(frozen=True)
class DenoiserFamily:
    name: str                          # short name: "unet", "sd3", "flux", "pixart", "sana"
    denoiser_class: str                # diffusers class of the denoiser, the registry key
    component: str                     # the pipeline attribute that holds it: "unet" or "transformer"
    models: str                        # what it covers, for messages and documentation
    block_lists: tuple[str, ...] = ()  # DiTs: ModuleList attributes whose items are blocks; () for a U-Net
    tokens: bool = False               # blocks read and write (batch, tokens, C) instead of (batch, C, H, W)
    image_stream: int | None = None    # a block returning a tuple: the index of the image stream in it
    text_stream: int | None = None     # joint blocks: the index of the text stream in the tuple; None: no text stream
    text_sequence: tuple[tuple[str, int | None], ...] = ()  # text stream = these padded sequences, concatenated:
    #                                    (pipeline tokenizer attribute, max_sequence_length; None: its model_max_length)
    packing: int = 1                   # latent pixels per token side on top of patch_size (FLUX: 2)
    cfg_batch: bool = True             # guidance > 1 batches [uncond, cond]; False: no unconditional half
    tokenizers: tuple[tuple[str, int | None], ...] = (("tokenizer", None),)  # (pipeline attribute, max tokens)
    call_options: dict = field(default_factory=dict)  # pipeline-call keywords every generation passes
    pipelines: tuple[str, ...] = ()    # the text-to-image pipeline classes of this denoiser that the workbench drives

    # ------------------------------------------------------------------ geometry

    def patch(self, denoiser) -> int:
        """Latent pixels per side of one block position (1 for a U-Net's first level)."""
        if not self.tokens:
            return 1
        return int(getattr(denoiser.config, "patch_size", 1) or 1) * self.packing

    def channels(self, denoiser) -> int:
        """The width of a DiT block's token vectors."""
        cfg = denoiser.config
        return int(cfg.num_attention_heads * cfg.attention_head_dim)

    def blocks(self, denoiser, latent_side: int) -> dict[str, tuple[int, int, int]]:
        """Block name -> (channels, height, width) at a square latent of `latent_side` (unpacked) pixels."""
        if not self.tokens:
            return _unet_blocks(denoiser, latent_side)
        side = latent_side // self.patch(denoiser)
        channels = self.channels(denoiser)
        return {f"{attribute}.{i}": (channels, side, side)
                for attribute in self.block_lists for i in range(len(getattr(denoiser, attribute, ()) or ()))}

    def execution_order(self, denoiser) -> list[str]:
        """The blocks in the order a denoiser call runs them: a U-Net's down blocks, its mid block, then its up
        blocks (its modules are registered down, up, mid, so module order is not it); a DiT's block lists in turn,
        each in index order (FLUX: the joint blocks, then the single ones)."""
        names = list(self.blocks(denoiser, 2 * self.patch(denoiser) if self.tokens else 8))
        if self.tokens:
            return names
        return sorted(names, key=_unet_position)

    def size_multiple(self, denoiser, vae_scale_factor: int) -> int:
        """Image sides must be multiples of this (the VAE, then the U-Net's levels or the patches)."""
        if not self.tokens:
            return vae_scale_factor * 2 ** (len(denoiser.config.block_out_channels) - 1)
        return vae_scale_factor * self.patch(denoiser)

    def latent_channels(self, denoiser) -> int:
        return int(denoiser.config.in_channels) // (self.packing ** 2)

    def default_blocks(self, blocks) -> tuple[str, ...]:
        """Analysed by default when a model names none: the middle block of each block list."""
        chosen = []
        for attribute in self.block_lists:
            names = [b for b in blocks if b.rsplit(".", 1)[0] == attribute]
            if names:
                chosen.append(names[len(names) // 2])
        return tuple(chosen)

    # ------------------------------------------------------------------ the denoiser call

    def call_arguments(self, denoiser, args, kwargs) -> dict:
        """The denoiser call's arguments by name (sample / hidden_states, timestep, encoder_hidden_states, ...)."""
        signature = _signature(type(denoiser))
        bound = signature.bind_partial(denoiser, *args, **kwargs).arguments
        return {k: v for k, v in bound.items() if k != "self"}

    def token_grid(self, denoiser, arguments: dict) -> tuple[int, int] | None:
        """(height, width) of the block grid in this call; None for a U-Net (its blocks are grids already)."""
        if not self.tokens:
            return None
        if self.packing > 1:  # packed latents (batch, tokens, C * p * p): the grid is in the image ids
            ids = arguments["img_ids"]
            ids = ids[0] if ids.ndim == 3 else ids
            return int(ids[:, 1].max()) + 1, int(ids[:, 2].max()) + 1
        sample = arguments["hidden_states"]
        p = self.patch(denoiser)
        return sample.shape[-2] // p, sample.shape[-1] // p

    def guidance_rows(self, guidance_scale: float, denoiser) -> bool:
        """Whether a generation with this guidance batches [uncond, cond] (diffusers' rule for the family)."""
        if not self.cfg_batch:
            return False
        return guidance_scale > 1.0 and getattr(denoiser.config, "time_cond_proj_dim", None) is None

    # ------------------------------------------------------------------ a block's image stream

    def block_input(self, args, kwargs) -> torch.Tensor:
        return args[0] if args else kwargs["hidden_states"]

    def block_output(self, output) -> torch.Tensor:
        """The image stream of a block's output: a tensor, a tuple or an output object."""
        if isinstance(output, torch.Tensor):
            return output
        if isinstance(output, tuple):
            return output[self.image_stream or 0]
        return output.sample

    def replace_output(self, output, hidden: torch.Tensor):
        if isinstance(output, torch.Tensor):
            return hidden
        if isinstance(output, tuple):
            index = self.image_stream or 0
            return output[:index] + (hidden,) + output[index + 1:]
        output.sample = hidden
        return output

    def to_grid(self, hidden: torch.Tensor, grid: tuple[int, int] | None) -> torch.Tensor:
        """(batch, C, H, W) of a block's image stream: tokens (batch, H * W, C) are laid out row by row."""
        if grid is None:
            return hidden
        b, n, c = hidden.shape
        h, w = grid
        if n != h * w:
            raise ValueError(f"a block holds {n} image tokens, not the {h} x {w} of the latent grid")
        return hidden.transpose(1, 2).reshape(b, c, h, w)

    def from_grid(self, grid_tensor: torch.Tensor, grid: tuple[int, int] | None) -> torch.Tensor:
        """The inverse of `to_grid`."""
        if grid is None:
            return grid_tensor
        b, c = grid_tensor.shape[:2]
        return grid_tensor.reshape(b, c, -1).transpose(1, 2)

    # ------------------------------------------------------------------ a joint block's text stream

    def text_blocks(self, denoiser) -> list[str]:
        """The blocks that write a text stream (`<block>:text` sites): every block of a joint family but those that
        only read it (SD3's last block, `context_pre_only`); none for a family without one."""
        if self.text_stream is None:
            return []
        modules = dict(denoiser.named_modules())
        return [name for name in self.blocks(denoiser, 2 * self.patch(denoiser))
                if not getattr(modules[name], "context_pre_only", False)]

    def text_tokens(self, pipe) -> int | None:
        """The length of the text stream in a generation at the pipeline's defaults (its tokenizers pad to their
        maximum length); None without a pipeline or a tokenizer to ask."""
        if self.text_stream is None or pipe is None:
            return None
        total = 0
        for attribute, limit in self.text_sequence:
            tokenizer = getattr(pipe, attribute, None)
            if limit is None:
                if tokenizer is None:
                    return None
                limit = int(tokenizer.model_max_length)
            total += limit
        return total

    def no_text_stream(self, block: str) -> str:
        """Why `<block>:text` is not a site of this family, in one line."""
        if self.text_stream is None:
            return (f"{self.name} blocks have no text stream: {block}:text names the text tokens of a joint (MMDiT) "
                    f"block, which only SD3 and FLUX have; capture {block} (the image stream) instead")
        return (f"{block} writes no text stream (the last joint block only reads it); the text stream is captured "
                f"after the blocks before it")

    def text_input(self, args, kwargs) -> torch.Tensor:
        """(batch, tokens, C): the text stream a joint block reads."""
        return args[1] if len(args) > 1 else kwargs["encoder_hidden_states"]

    def text_output(self, output) -> torch.Tensor:
        return output[self.text_stream]

    def replace_text_output(self, output, hidden: torch.Tensor):
        index = self.text_stream
        return output[:index] + (hidden,) + output[index + 1:]

    def describe(self) -> str:
        return f"{self.name} ({self.denoiser_class}: {self.models})"


_SIGNATURES: dict[type, inspect.Signature] = {}


def _signature(cls) -> inspect.Signature:
    if cls not in _SIGNATURES:
        _SIGNATURES[cls] = inspect.signature(cls.forward)
    return _SIGNATURES[cls]


def _unet_blocks(unet, latent_side: int) -> dict[str, tuple[int, int, int]]:
    """The U-Net's spatial transformers: (channels, side, side) at their level's resolution."""
    n_levels = len(unet.config.block_out_channels)
    infos = {}
    for name, module in unet.named_modules():
        if type(module).__name__ != UNET_BLOCK_CLASS:
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
        side = latent_side // 2 ** level
        infos[name] = (module.config.in_channels, side, side)
    return infos


_UNET_PARTS = {"down_blocks": 0, "mid_block": 1, "up_blocks": 2}


def _unet_position(name: str) -> tuple[int, int, int]:
    """Where a U-Net block runs in a call: (down / mid / up, the level's index, the attention's index)."""
    parts = name.split(".")
    level = int(parts[1]) if parts[0] != "mid_block" else 0
    return _UNET_PARTS[parts[0]], level, int(parts[-1])


FAMILIES: dict[str, DenoiserFamily] = {}


def register_family(family: DenoiserFamily) -> DenoiserFamily:
    FAMILIES[family.denoiser_class] = family
    return family


UNET = register_family(DenoiserFamily(
    "unet", "UNet2DConditionModel", "unet", "SD 1.x, SD 2.x, SDXL",
    tokenizers=(("tokenizer", None), ("tokenizer_2", None)),
    pipelines=("StableDiffusionPipeline", "StableDiffusionXLPipeline")))
SD3 = register_family(DenoiserFamily(
    "sd3", "SD3Transformer2DModel", "transformer", "Stable Diffusion 3 / 3.5",
    block_lists=("transformer_blocks",), tokens=True, image_stream=1, text_stream=0,
    text_sequence=(("tokenizer", None), ("tokenizer_3", 256)),  # CLIP's 77 (both CLIPs side by side), T5's 256
    tokenizers=(("tokenizer", None), ("tokenizer_2", None), ("tokenizer_3", 256)),
    pipelines=("StableDiffusion3Pipeline",)))
FLUX = register_family(DenoiserFamily(
    "flux", "FluxTransformer2DModel", "transformer", "FLUX.1",
    block_lists=("transformer_blocks", "single_transformer_blocks"), tokens=True, image_stream=1, text_stream=0,
    text_sequence=(("tokenizer_2", 512),), packing=2, cfg_batch=False, tokenizers=(("tokenizer", None), ("tokenizer_2", 512)),
    pipelines=("FluxPipeline",)))
PIXART = register_family(DenoiserFamily(
    "pixart", "PixArtTransformer2DModel", "transformer", "PixArt-alpha, PixArt-Sigma",
    block_lists=("transformer_blocks",), tokens=True, tokenizers=(("tokenizer", 300),),
    call_options={"use_resolution_binning": False, "clean_caption": False},
    pipelines=("PixArtAlphaPipeline", "PixArtSigmaPipeline")))
SANA = register_family(DenoiserFamily(
    "sana", "SanaTransformer2DModel", "transformer", "Sana",
    block_lists=("transformer_blocks",), tokens=True, tokenizers=(("tokenizer", 300),),
    call_options={"use_resolution_binning": False, "clean_caption": False},
    pipelines=("SanaPipeline",)))


def supported() -> str:
    return "; ".join(f.describe() for f in FAMILIES.values())


def denoiser_of(pipe):
    """The pipeline's denoiser: its `unet` or its `transformer` (None if it has neither)."""
    for attribute in ("unet", "transformer"):
        module = getattr(pipe, attribute, None)
        if module is not None:
            return module
    return None


def family_of_module(denoiser) -> DenoiserFamily:
    family = FAMILIES.get(type(denoiser).__name__)
    if family is None:
        raise UnsupportedPipeline(f"{type(denoiser).__name__} has no denoiser adapter; supported families: "
                                  f"{supported()}")
    return family


# Why a pipeline class whose denoiser has an adapter is still refused, by a part of its name (diffusers' naming).
_NOT_DRIVEN = (
    ("PAG", "it runs perturbed-attention guidance, whose denoiser batch is [uncond, cond, perturbed], not the "
            "[uncond, cond] halves the hooks, the store and the edits read"),
    ("ControlNet", "it needs a control image, which the workbench does not give"),
    ("Adapter", "it needs an adapter's conditioning image, which the workbench does not give"),
    ("Img2Img", "it starts from an input image, which the workbench does not give"),
    ("Inpaint", "it paints into an input image and mask, which the workbench does not give"),
    ("Combined", "it chains a prior and a decoder pipeline (Kandinsky), each with its own denoiser"),
    ("Kandinsky", "it is conditioned on image embeddings from a prior, not on the prompt"),
)


def check_pipeline_class(class_names, family: DenoiserFamily, denoiser: str) -> None:
    """Refuse, in one line, a pipeline that passes the denoiser check but is not one of the family's text-to-image
    pipelines (`DenoiserFamily.pipelines`): the workbench calls it with a prompt, its own latents and guidance, and
    reads its batch as [uncond, cond]. `class_names`: the class and its bases (a subclass of a driven pipeline keeps
    its call), or a saved pipeline's `_class_name`."""
    class_names = list(class_names)
    if any(name in family.pipelines for name in class_names) and "PAGMixin" not in class_names:
        return
    name = class_names[0] if class_names else "this pipeline"
    why = next((reason for part, reason in _NOT_DRIVEN if part in name or part + "Mixin" in class_names),
               "it is not a text-to-image pipeline the workbench has been checked against")
    raise UnsupportedPipeline(f"{name} ({denoiser}) is not supported: {why}; the workbench drives "
                              f"{', '.join(family.pipelines)} for the {family.name} family "
                              f"(load its weights as one of those)")


def family_of(pipe) -> DenoiserFamily:
    """The family of a pipeline's denoiser, or one line naming the pipeline class and the supported families (or,
    for a pipeline class of a supported denoiser that the workbench does not drive, why: `check_pipeline_class`)."""
    denoiser = denoiser_of(pipe)
    name = type(denoiser).__name__ if denoiser is not None else "no unet or transformer"
    family = FAMILIES.get(name)
    if family is None:
        raise UnsupportedPipeline(f"{type(pipe).__name__} ({name}) is not supported: no denoiser adapter for it; "
                                  f"supported families: {supported()}")
    check_pipeline_class([c.__name__ for c in type(pipe).__mro__], family, name)
    return family


def family_of_index(model_index: dict) -> DenoiserFamily:
    """The family named by a saved pipeline's model_index.json, before anything is loaded."""
    for attribute in ("unet", "transformer"):
        entry = model_index.get(attribute)
        if isinstance(entry, list) and len(entry) == 2 and entry[1] in FAMILIES:
            family = FAMILIES[entry[1]]
            check_pipeline_class([str(model_index.get("_class_name", "this pipeline"))], family, entry[1])
            return family
    denoisers = [f"{k}: {v[1]}" for k, v in model_index.items() if k in ("unet", "transformer", "prior")
                 and isinstance(v, list) and len(v) == 2]
    raise UnsupportedPipeline(f"{model_index.get('_class_name', 'this pipeline')} "
                              f"({', '.join(denoisers) or 'no unet or transformer'}) is not supported: no denoiser "
                              f"adapter for it; supported families: {supported()}")


def step_of_calls(n_calls: int, n_steps: int, order: int) -> list[int]:
    """The scheduler step of each denoiser call of one generation, by diffusers' own progress rule: a call ends a
    step when it is the last, or past the warm-up calls (n_calls - n_steps * order) and a multiple of the
    scheduler's order. Heun (order 2), 4 steps, 7 calls: [0, 0, 1, 1, 2, 2, 3]; PNDM, 4 steps, 5 calls (one
    warm-up call): [0, 0, 1, 2, 3]; Euler: one call a step."""
    warmup = n_calls - n_steps * order
    steps, step = [], 0
    for i in range(n_calls):
        steps.append(step)
        if i == n_calls - 1 or ((i + 1) > warmup and (i + 1) % order == 0):
            step += 1
    return steps


__all__ = ["FAMILIES", "FLUX", "PIXART", "SANA", "SD3", "UNET", "DenoiserFamily", "UnsupportedPipeline",
           "check_pipeline_class", "denoiser_of", "family_of", "family_of_index", "family_of_module", "register_family",
           "step_of_calls", "supported"]

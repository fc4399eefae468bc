"""The loaded text-to-image model's type: `T2IModel` (a pipeline and what hooks and edits need to know of it: its
blocks and text streams, defaults, vocabulary, world and denoiser family), its sites' shapes (`BlockInfo`,
`TextStreamInfo`, `block_info`, `text_stream_info`) and the checks of a generation request."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..names import T2I
from .protocol import Hookable
from .denoisers import UNET, DenoiserFamily, denoiser_of, family_of_module
from .t2i_generation import generate, pipeline_default
from .t2i_registry import SDXL_BLOCKS, ModelError

MAX_STEPS = 1000
MAX_SEED = 2**64 - 1  # torch generators take 64-bit seeds
MAX_SIDE = 2048



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
class T2IModel(Hookable):
    """A loaded pipeline and what a user needs to know to hook and edit it; a `interp.models.protocol.LoadedModel`
    (``kind`` "t2i", ``sites``, ``capture``, ``intervene``, ``describe``)."""

    kind = T2I  # the protocol's: a class attribute, not a field

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



__all__ = ["MAX_SEED", "MAX_SIDE", "MAX_STEPS", "BlockInfo", "T2IModel", "TextStreamInfo", "block_info",
           "default_latent_side", "text_stream_info"]

"""The embedded text-to-image model: a real diffusers `StableDiffusionXLPipeline`, tiny.

Built exactly like SDXL (two CLIP text encoders whose penultimate hidden states are
concatenated for cross-attention, `text_time` added conditioning from the second
encoder's pooled projection and the six size/crop numbers, an `AutoencoderKL`, and a
`UNet2DConditionModel` with SDXL's block layout and names), only small: 64 x 64 images,
a 32 x 32 x 4 latent, 8 x 8 positions at `down_blocks.2` and `mid_block`.

The UNet predicts the clean latent (`prediction_type="sample"`) so that one Euler step
from the largest noise level is the whole generation, as SDXL Turbo does in one step.
The noise schedule ends at zero signal (`rescale_betas_zero_snr`): with SDXL's own
schedule the largest level still leaks the clean latent (sigma 14.6, enough to see an
object over a cell of the latent), so a model trained on it learns to sharpen blobs
it finds in the noise and, from pure noise, draws objects wherever the noise suggests,
ignoring the position in the prompt.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from . import shapes

SPECIAL_TOKENS = ("<|startoftext|>", "<|endoftext|>")
VOCABULARY_FILE = "vocabulary.json"  # the words the model was trained on; prompts are checked against it


@dataclass
class T2IConfig:
    """Sizes of every component. Plain values: change one, retrain with the recipe."""

    image_size: int = shapes.IMAGE_SIZE
    # Text encoders (CLIP): two, as SDXL; the second carries the pooled projection.
    text_hidden: int = 64
    text_layers: int = 2
    text_heads: int = 2
    text_projection: int = 64
    max_tokens: int = 48
    # VAE: 2 levels -> downsampling by 2, 64 x 64 image -> 32 x 32 latent.
    vae_channels: tuple[int, ...] = (16, 32)
    latent_channels: int = 4
    # UNet: SDXL's block types; down_blocks.2 sees latent / 4 = 8 x 8 positions.
    unet_channels: tuple[int, int, int] = (16, 32, 64)
    unet_heads: tuple[int, int, int] = (1, 2, 4)
    # Transformer layers in each attention of a level (the first level has none, as in SDXL). SDXL: (1, 2, 10).
    unet_transformer_layers: tuple[int, int, int] = (1, 1, 1)
    # Which levels have attention (self and cross) at all; SDXL's first has none. Without it a level is resnets only.
    unet_attention: tuple[bool, bool, bool] = (False, True, True)
    time_embed: int = 8  # per added-time number (SDXL: 256)
    # Scheduler: the largest noise level carries no signal, as one-step generation starts from pure noise.
    zero_terminal_snr: bool = True

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


# The recipe's named model configurations (`python -m zoo train t2i --config NAME`).
T2I_CONFIGS = {
    # v1, the shipped `toy`: one transformer layer per attention at every level, so the 8 x 8 blocks
    # (SDXL's four analysed ones) do little the image depends on (docs/saes.md).
    "v1": T2IConfig(),
    # v2: SDXL's proportions. Channels double per level as SDXL's (320, 640, 1280), and most transformer
    # layers sit at the lowest resolution as in SDXL's (1, 2, 10): 2 layers at 16 x 16, 6 at 8 x 8 (fewer than
    # SDXL's 10 to keep the recipe within about 3 hours on two CPU cores; docs/experiments/t2i-blocks.md).
    "sdxl-proportions": T2IConfig(unet_transformer_layers=(1, 2, 6)),
    # v3 (`toy-v3`): v2 with attention, and so the prompt's tokens, only at 8 x 8, in SDXL's four analysed blocks
    # and their neighbours (the 16 x 16 level keeps its resnets, which see the pooled text through the time
    # embedding): v2 drew everything in its last 16 x 16 attention. v4 (`toy-v4`) is this with the recipe's
    # --zero-pooled-text (docs/experiments/t2i-blocks.md).
    "sdxl-blocks-only": T2IConfig(unet_transformer_layers=(1, 2, 6), unet_attention=(False, False, True)),
}


def t2i_config(name: str) -> T2IConfig:
    try:
        return T2I_CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown model configuration {name!r}: use one of {', '.join(T2I_CONFIGS)}") from None


def build_tokenizer_files(directory: Path, max_tokens: int) -> None:
    """Write a CLIP BPE tokenizer whose whole words are the shapes world's vocabulary.

    Each word is one token (`circle</w>`), made by merges from its letters, so the
    standard `CLIPTokenizer` reads it; a word outside the world falls apart into letters
    and is rejected by the vocabulary check before generation.
    """
    directory.mkdir(parents=True, exist_ok=True)
    words = shapes.vocabulary() + [","]
    vocab: dict[str, int] = {}

    def add(token: str) -> None:
        vocab.setdefault(token, len(vocab))

    for c in "abcdefghijklmnopqrstuvwxyz,":
        add(c)
        add(c + "</w>")
    merges: list[tuple[str, str]] = []
    for word in words:
        # Add merges until BPE, which applies the earliest-learned merge first, reads the word
        # as one token. A new merge ranks after all earlier ones, so earlier words stay whole.
        while len(pieces := _bpe(word, merges)) > 1:
            merges.append((pieces[0], pieces[1]))
            add(pieces[0] + pieces[1])
    for special in SPECIAL_TOKENS:
        add(special)
    (directory / "vocab.json").write_text(json.dumps(vocab, indent=0))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "CLIPTokenizer",
        "model_max_length": max_tokens,
        "bos_token": SPECIAL_TOKENS[0],
        "eos_token": SPECIAL_TOKENS[1],
        "unk_token": SPECIAL_TOKENS[1],
        "pad_token": SPECIAL_TOKENS[1],
        "do_lower_case": True,
    }, indent=2))
    (directory / VOCABULARY_FILE).write_text(json.dumps(shapes.vocabulary()))


def _bpe(word: str, merges: list[tuple[str, str]]) -> list[str]:
    """Byte-pair encoding of one word with CLIP's end-of-word marker, merges in rank order."""
    ranks = {m: i for i, m in enumerate(merges)}
    pieces = list(word[:-1]) + [word[-1] + "</w>"]
    while len(pieces) > 1:
        pairs = [(ranks.get((a, b), len(ranks)), i) for i, (a, b) in enumerate(zip(pieces, pieces[1:]))]
        rank, i = min(pairs)
        if rank == len(ranks):
            break
        pieces = pieces[:i] + [pieces[i] + pieces[i + 1]] + pieces[i + 2:]
    return pieces


def build_pipeline(config: T2IConfig, tokenizer_dir: Path):
    """A randomly initialised pipeline of the given sizes (float32, CPU)."""
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(str(tokenizer_dir))
    text_config = CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=config.text_hidden, intermediate_size=4 * config.text_hidden,
        num_hidden_layers=config.text_layers, num_attention_heads=config.text_heads,
        max_position_embeddings=config.max_tokens, projection_dim=config.text_projection,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, hidden_act="gelu",
    )
    text_encoder = CLIPTextModel(text_config)
    text_encoder_2 = CLIPTextModelWithProjection(text_config)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=config.latent_channels,
        down_block_types=("DownEncoderBlock2D",) * len(config.vae_channels),
        up_block_types=("UpDecoderBlock2D",) * len(config.vae_channels),
        block_out_channels=config.vae_channels, layers_per_block=1, norm_num_groups=8,
        sample_size=config.image_size,
    )
    unet = UNet2DConditionModel(
        sample_size=config.image_size // 2 ** (len(config.vae_channels) - 1),
        in_channels=config.latent_channels, out_channels=config.latent_channels,
        down_block_types=tuple("CrossAttnDownBlock2D" if a else "DownBlock2D" for a in config.unet_attention),
        up_block_types=tuple("CrossAttnUpBlock2D" if a else "UpBlock2D" for a in reversed(config.unet_attention)),
        mid_block_type="UNetMidBlock2DCrossAttn",
        block_out_channels=config.unet_channels, layers_per_block=2,
        transformer_layers_per_block=tuple(config.unet_transformer_layers), attention_head_dim=config.unet_heads,
        cross_attention_dim=2 * config.text_hidden, norm_num_groups=8, use_linear_projection=True,
        addition_embed_type="text_time", addition_time_embed_dim=config.time_embed,
        projection_class_embeddings_input_dim=config.text_projection + 6 * config.time_embed,
    )
    scheduler = EulerDiscreteScheduler(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        prediction_type="sample", timestep_spacing="trailing", steps_offset=1,
        rescale_betas_zero_snr=config.zero_terminal_snr,
    )
    return StableDiffusionXLPipeline(
        vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2, tokenizer=tokenizer,
        tokenizer_2=tokenizer, unet=unet, scheduler=scheduler, force_zeros_for_empty_prompt=True,
    )

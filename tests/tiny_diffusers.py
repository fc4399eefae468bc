"""Tiny random-weight pipelines of every supported denoiser family, built offline from configs in a second.

    pipe = tiny_pipeline("flux")           # a diffusers FluxPipeline with a few dims everywhere
    model = tiny_model("sd3")              # the same wrapped as a T2IModel (interp.models.t2i.t2i_model)

Every family reads prompts with the embedded toy's CLIP tokenizer (its words, or letters for anything else), so no
tokenizer is fetched; T5 / Gemma text encoders are built on its vocabulary. Biases and norm gains get noise
(`roughen`), so that a hook that ignored one, or read the wrong stream, would show. Latents are 8 x 8 at the
default size (16 px for the VAEs here with one downsampling), so a generation takes milliseconds.
"""

from __future__ import annotations

import torch

from zoo import WEIGHTS_DIR

FAMILIES = ("sd1", "sd2", "sd3", "flux", "pixart", "sana")  # sd1 and sd2: the U-Net family
TOKENIZER_DIR = WEIGHTS_DIR / "t2i" / "tokenizer"
TEXT = 16   # text encoders' width
LATENT = 8  # latent side at the default size


def roughen(module: torch.nn.Module, seed: int, scale: float = 0.1) -> torch.nn.Module:
    """Add noise to every bias and norm gain (1-D parameter), which random inits leave at 0 or 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            if parameter.ndim == 1:
                parameter.add_(scale * torch.randn(parameter.shape, generator=generator))
    return module


def _tokenizer():
    from transformers import CLIPTokenizer

    return CLIPTokenizer.from_pretrained(str(TOKENIZER_DIR))


def _clip(tokenizer, projection: bool = False):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=TEXT, intermediate_size=32, num_hidden_layers=1,
                            num_attention_heads=2, max_position_embeddings=tokenizer.model_max_length,
                            projection_dim=TEXT, bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config)


def _t5(tokenizer):
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(vocab_size=len(tokenizer), d_model=TEXT, d_kv=8, d_ff=32, num_layers=1,
                                   num_heads=2, relative_attention_num_buckets=8, decoder_start_token_id=0))


def _vae(latent_channels: int = 4, shift: bool = False):
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(8, 8), layers_per_block=1,
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         latent_channels=latent_channels, norm_num_groups=4, sample_size=2 * LATENT,
                         **({"shift_factor": 0.1, "scaling_factor": 1.5} if shift else {}))


def _sd1(tokenizer, scheduler, sd2: bool = False):
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel

    # SD 2.x differs from 1.x inside the U-Net (linear projections in and out of its transformers, heads given per
    # level, upcast attention) and in the scheduler's v-prediction; the pipeline class is the same.
    unet = UNet2DConditionModel(sample_size=LATENT, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(8, 16), norm_num_groups=4, cross_attention_dim=TEXT,
                                attention_head_dim=(2, 4) if sd2 else 2, use_linear_projection=sd2,
                                upcast_attention=sd2, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
    scheduler = scheduler or EulerDiscreteScheduler(beta_schedule="scaled_linear", beta_start=0.00085,
                                                    beta_end=0.012, steps_offset=1,
                                                    prediction_type="v_prediction" if sd2 else "epsilon")
    return StableDiffusionPipeline(vae=_vae(), text_encoder=_clip(tokenizer), tokenizer=tokenizer, unet=unet,
                                   scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)


def _sd3(tokenizer, scheduler):
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    transformer = SD3Transformer2DModel(sample_size=LATENT, patch_size=2, in_channels=4, out_channels=4,
                                        num_layers=2, attention_head_dim=8, num_attention_heads=2,
                                        joint_attention_dim=TEXT, caption_projection_dim=16,
                                        pooled_projection_dim=2 * TEXT, pos_embed_max_size=16)
    return StableDiffusion3Pipeline(transformer=transformer, scheduler=scheduler or FlowMatchEulerDiscreteScheduler(),
                                    vae=_vae(shift=True), text_encoder=_clip(tokenizer, True), tokenizer=tokenizer,
                                    text_encoder_2=_clip(tokenizer, True), tokenizer_2=tokenizer,
                                    text_encoder_3=_t5(tokenizer), tokenizer_3=tokenizer)


def _flux(tokenizer, scheduler):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2,
                                         attention_head_dim=16, num_attention_heads=2, joint_attention_dim=TEXT,
                                         pooled_projection_dim=TEXT, axes_dims_rope=(4, 6, 6))
    pipe = FluxPipeline(scheduler=scheduler or FlowMatchEulerDiscreteScheduler(), vae=_vae(shift=True),
                        text_encoder=_clip(tokenizer), tokenizer=tokenizer, text_encoder_2=_t5(tokenizer),
                        tokenizer_2=tokenizer, transformer=transformer)
    pipe.default_sample_size = LATENT  # FLUX's pipeline fixes 128 (1024 px) in its __init__
    return pipe


def _pixart(tokenizer, scheduler):
    from diffusers import DPMSolverMultistepScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

    transformer = PixArtTransformer2DModel(sample_size=LATENT, num_layers=2, patch_size=2, attention_head_dim=8,
                                           num_attention_heads=2, caption_channels=TEXT, in_channels=4,
                                           out_channels=8, cross_attention_dim=16, norm_type="ada_norm_single",
                                           use_additional_conditions=False)
    return PixArtSigmaPipeline(tokenizer=tokenizer, text_encoder=_t5(tokenizer), vae=_vae(),
                               transformer=transformer, scheduler=scheduler or DPMSolverMultistepScheduler())


def _sana(tokenizer, scheduler):
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel
    from transformers import Gemma2Config, Gemma2Model

    vae = AutoencoderDC(in_channels=3, latent_channels=4, attention_head_dim=2,
                        encoder_block_types=("ResBlock", "EfficientViTBlock"),
                        decoder_block_types=("ResBlock", "EfficientViTBlock"),
                        encoder_block_out_channels=(8, 8), decoder_block_out_channels=(8, 8),
                        encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
                        encoder_layers_per_block=(1, 1), decoder_layers_per_block=(1, 1),
                        downsample_block_type="conv", upsample_block_type="interpolate",
                        decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41407)
    transformer = SanaTransformer2DModel(patch_size=1, in_channels=4, out_channels=4, num_layers=2,
                                         attention_head_dim=4, num_attention_heads=2, num_cross_attention_heads=2,
                                         cross_attention_head_dim=4, cross_attention_dim=8, caption_channels=TEXT,
                                         sample_size=2 * LATENT)  # Sana's pipeline takes 32 px multiples
    text_encoder = Gemma2Model(Gemma2Config(vocab_size=len(tokenizer), hidden_size=TEXT, intermediate_size=32,
                                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                            head_dim=8, max_position_embeddings=8192,
                                            attn_implementation="eager"))
    return SanaPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                        scheduler=scheduler or FlowMatchEulerDiscreteScheduler(shift=3.0))


_BUILDERS = {"sd1": _sd1, "sd2": lambda tokenizer, scheduler: _sd1(tokenizer, scheduler, sd2=True), "sd3": _sd3, "flux": _flux, "pixart": _pixart, "sana": _sana}


def tiny_pipeline(family: str, seed: int = 0, scheduler=None):
    """A tiny random pipeline of `family` (one of FAMILIES), float32 on the CPU, biases and gains roughened."""
    torch.manual_seed(seed)
    pipe = _BUILDERS[family](_tokenizer(), scheduler)
    for i, name in enumerate(("unet", "transformer", "text_encoder", "text_encoder_2", "text_encoder_3")):
        module = getattr(pipe, name, None)
        if module is not None:
            roughen(module, seed + i)
    for _, module in pipe.components.items():
        if isinstance(module, torch.nn.Module):
            module.eval()  # built, not loaded: without this T5's dropout would be on (from_pretrained sets eval)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_model(family: str, seed: int = 0, scheduler=None, steps: int = 2, guidance: float = 3.0):
    from interp.models.t2i import t2i_model

    return t2i_model(tiny_pipeline(family, seed, scheduler), f"tiny-{family}", default_steps=steps,
                     default_guidance=guidance)

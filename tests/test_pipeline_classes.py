"""Pipelines whose denoiser has an adapter but whose call the workbench does not drive (issue 41): perturbed-attention
guidance, img2img, inpaint, ControlNet, Kandinsky are refused by pipeline class in one line; PixArt-alpha (one step
under DPM-Solver++, its 120-token prompts); a model's default steps and guidance from its registry entry or its
pipeline class (issue 42). Tiny random pipelines (tests/tiny_diffusers.py)."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny_diffusers import TOKENIZER_DIR, tiny_pipeline  # noqa: E402

from interp.models.t2i import ModelError, load_t2i, t2i_model  # noqa: E402


@functools.cache
def sd1():
    return tiny_pipeline("sd1")


def _refused(pipe) -> str:
    with pytest.raises(ModelError) as err:
        t2i_model(pipe, "refused")
    message = str(err.value)
    assert "\n" not in message and type(pipe).__name__ in message
    assert "StableDiffusionPipeline" in message or "PixArtSigmaPipeline" in message  # what it drives instead
    return message


def test_a_pag_pipeline_batches_three_parts_and_is_refused_in_one_line():
    from diffusers import PixArtSigmaPAGPipeline, StableDiffusionPAGPipeline

    pag = StableDiffusionPAGPipeline.from_pipe(sd1(), pag_applied_layers=["mid"])
    batches = []
    handle = pag.unet.register_forward_pre_hook(lambda module, args: batches.append(args[0].shape[0]))
    try:  # why: the denoiser batch is [uncond, cond, perturbed], not two halves
        pag(["red circle", "blue square"], num_inference_steps=1, guidance_scale=3.0, pag_scale=2.0,
            output_type="latent")
    finally:
        handle.remove()
    assert batches == [6]
    assert "[uncond, cond, perturbed]" in _refused(pag)
    assert "perturbed-attention" in _refused(PixArtSigmaPAGPipeline.from_pipe(
        tiny_pipeline("pixart"), pag_applied_layers=["transformer_blocks.1"]))


def test_img2img_inpaint_and_controlnet_pipelines_are_refused_in_one_line():
    from diffusers import ControlNetModel, StableDiffusionControlNetPipeline, StableDiffusionImg2ImgPipeline, \
        StableDiffusionInpaintPipeline

    assert "input image" in _refused(StableDiffusionImg2ImgPipeline.from_pipe(sd1()))
    assert "input image and mask" in _refused(StableDiffusionInpaintPipeline.from_pipe(sd1()))
    controlnet = ControlNetModel.from_unet(sd1().unet)
    assert "control image" in _refused(StableDiffusionControlNetPipeline.from_pipe(sd1(), controlnet=controlnet))
    # the text-to-image pipeline of the same components still loads
    assert t2i_model(sd1(), "sd1").family.name == "unet"


def test_sdxl_img2img_of_the_toy_is_refused_in_one_line():
    from diffusers import DiffusionPipeline, StableDiffusionXLImg2ImgPipeline, StableDiffusionXLInpaintPipeline

    from zoo import WEIGHTS_DIR

    toy = DiffusionPipeline.from_pretrained(str(WEIGHTS_DIR / "t2i"))
    assert "input image" in _refused(StableDiffusionXLImg2ImgPipeline.from_pipe(toy))
    assert "input image and mask" in _refused(StableDiffusionXLInpaintPipeline.from_pipe(toy))


@pytest.mark.parametrize("class_name, denoiser, why", [
    ("KandinskyV22CombinedPipeline", "UNet2DConditionModel", "prior and a decoder"),
    ("StableDiffusionXLInpaintPipeline", "UNet2DConditionModel", "input image and mask"),
    ("StableDiffusionXLImg2ImgPipeline", "UNet2DConditionModel", "input image"),
    ("StableDiffusionXLPAGPipeline", "UNet2DConditionModel", "perturbed-attention"),
    ("StableDiffusionXLControlNetPipeline", "UNet2DConditionModel", "control image"),
    ("PixArtSigmaPAGPipeline", "PixArtTransformer2DModel", "perturbed-attention"),
])
def test_a_saved_pipeline_of_another_class_is_refused_before_anything_loads(class_name, denoiser, why, tmp_path,
                                                                           capsys):
    """The model_index.json diffusers writes for these classes (a denoiser the workbench has an adapter for): refused
    by its class, in one line, with no weights present to load."""
    from interp.__main__ import main as interp_main

    index = {"_class_name": class_name, "_diffusers_version": "0.42.1", "scheduler": ["diffusers", "DDPMScheduler"],
             "unet" if denoiser.startswith("UNet") else "transformer": ["diffusers", denoiser]}
    if class_name.startswith("Kandinsky"):
        index |= {"prior_prior": ["diffusers", "PriorTransformer"], "movq": ["diffusers", "VQModel"]}
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ModelError, match=why):
        load_t2i(str(tmp_path), device="cpu")
    assert interp_main(["blocks", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and class_name in err and "Traceback" not in err


# ----------------------------------------------------------------------------- PixArt-alpha

@functools.cache
def pixart_pair():
    """PixArt-alpha and PixArt-Sigma pipelines on the same tiny components, under DPM-Solver++ (both pipelines'
    default scheduler); a tokenizer that reads 300 tokens, as T5's does."""
    from diffusers import PixArtAlphaPipeline, PixArtSigmaPipeline
    from transformers import CLIPTokenizer

    components = {**tiny_pipeline("pixart").components,
                  "tokenizer": CLIPTokenizer.from_pretrained(str(TOKENIZER_DIR), model_max_length=300)}
    return (t2i_model(PixArtAlphaPipeline(**components), "alpha", default_steps=1, default_guidance=3.0),
            t2i_model(PixArtSigmaPipeline(**components), "sigma", default_steps=1, default_guidance=3.0))


def test_pixart_alpha_generates_in_one_step_under_dpm_solver():
    """diffusers' PixArt-alpha reads the step's predicted clean sample at 1 step, which DPM-Solver++ does not return
    (an IndexError): DPM-Solver++ steps to sigma 0, so its next sample is that clean sample, and Alpha's one step is
    Sigma's (the same components; Sigma's pipeline reads the next sample)."""
    alpha, sigma = pixart_pair()
    one_step = alpha.generate(["red circle", "blue square"], seed=[1, 2], output_type="latent")
    torch.testing.assert_close(one_step, sigma.generate(["red circle", "blue square"], seed=[1, 2],
                                                        output_type="latent"), rtol=0, atol=1e-6)
    assert alpha.generate("red circle", seed=1, steps=2, output_type="latent").isfinite().all()


def test_pixart_alpha_one_step_under_a_scheduler_without_a_clean_sample_is_refused_in_one_line():
    from diffusers import DPMSolverMultistepScheduler

    alpha, _ = pixart_pair()
    model = t2i_model(type(alpha.pipe)(**{**alpha.pipe.components,
                                          "scheduler": DPMSolverMultistepScheduler(final_sigmas_type="sigma_min")}),
                      "alpha-sigma-min", default_steps=1, default_guidance=3.0)
    with pytest.raises(ModelError, match="2 or more steps") as err:
        model.generate("red circle", seed=1, output_type="latent")
    assert "\n" not in str(err.value)


def test_pixart_alpha_prompts_over_its_120_tokens_are_refused_not_cut():
    alpha, sigma = pixart_pair()
    prompt = "red " * 150
    with pytest.raises(ModelError, match="reads at most 120"):
        alpha.check_prompt(prompt)
    with pytest.raises(ModelError, match="reads at most 120"):
        alpha.generate(prompt, seed=0, output_type="latent")
    assert sigma.check_prompt(prompt) == prompt.strip()  # Sigma's pipeline reads 300
    assert alpha.check_prompt("red " * 100) == ("red " * 100).strip()


# ----------------------------------------------------------------------------- default steps and guidance (issue 42)

def test_default_steps_come_from_the_registry_entry_or_the_pipeline_class_not_the_path(tmp_path):
    # a directory named like a one-step model is not one: its pipeline class's own defaults
    sd1().save_pretrained(tmp_path / "my-turbo")
    model = load_t2i(str(tmp_path / "my-turbo"), device="cpu")
    assert (model.default_steps, model.default_guidance) == (50, 7.5)  # StableDiffusionPipeline.__call__'s
    # a Hugging Face cache snapshot of a registered hub id is that model: SDXL Turbo's 1 step without guidance
    snapshot = tmp_path / "hub" / "models--stabilityai--sdxl-turbo" / "snapshots" / "0123abcd"
    sd1().save_pretrained(snapshot)
    model = load_t2i(str(snapshot), device="cpu")
    assert (model.default_steps, model.default_guidance) == (1, 0.0)

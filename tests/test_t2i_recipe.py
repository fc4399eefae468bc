import argparse
import json
import re

import numpy as np
import pytest

from zoo import t2i_recipe


def train(out, unet_steps: int, *extra: str):
    parser = argparse.ArgumentParser()
    t2i_recipe.add_arguments(parser)
    args = parser.parse_args(["--out", str(out), "--scenes", "32", "--vae-steps", "2", "--decoder-steps", str(unet_steps), "--unet-steps", str(unet_steps),
                              "--batch", "4", "--checkpoint-every", "2", "--probe-every", "0", "--threads", "1", *extra])
    t2i_recipe.main(args)


def _weights(directory, component: str) -> dict:
    from safetensors.torch import load_file

    return load_file(next((directory / component).glob("*.safetensors")))


def test_recipe_trains_saves_a_loadable_pipeline_and_resumes(tmp_path):
    train(tmp_path, unet_steps=2)
    train(tmp_path, unet_steps=4)  # as after an interruption at step 2: picks up there, no step lost
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    resumed = [r for r in log if "resumed_at" in r]
    assert {(r["stage"], r["resumed_at"]) for r in resumed} == {("vae", 2), ("decoder", 2), ("unet", 2)}
    from interp.models import load_t2i
    from interp.models.t2i import TOY_BLOCKS

    model = load_t2i(str(tmp_path / "pipeline"), device="cpu")
    assert model.vocabulary and "circle" in model.vocabulary
    # used as the toy is (not as an unknown pipeline: 30 steps with guidance)
    assert (model.default_steps, model.default_guidance) == (1, 0.0) and model.default_blocks == TOY_BLOCKS
    assert model.generate("a red circle", seed=0)[0].size == (64, 64)


def test_a_new_unet_setting_keeps_the_trained_vae_but_a_new_vae_setting_does_not(tmp_path):
    from dataclasses import asdict, replace

    import torch

    cfg = t2i_recipe.RecipeConfig()
    torch.save({"config": json.dumps(asdict(cfg), sort_keys=True), "step": 5}, tmp_path / "vae.ckpt")
    unet_change = replace(cfg, unet_lr=1e-4, model=replace(cfg.model, unet_channels=(8, 16, 32),
                                                           zero_terminal_snr=False))
    assert t2i_recipe.load_checkpoint(tmp_path / "vae.ckpt", unet_change, "vae")["step"] == 5
    with pytest.raises(SystemExit, match="different recipe configuration"):
        t2i_recipe.load_checkpoint(tmp_path / "vae.ckpt", unet_change, "unet")
    with pytest.raises(SystemExit, match="different recipe configuration"):
        t2i_recipe.load_checkpoint(tmp_path / "vae.ckpt", replace(cfg, model=replace(cfg.model, latent_channels=8)),
                                   "vae")


def test_a_checkpoint_of_another_shapes_world_is_refused_and_its_latents_not_reused(tmp_path, monkeypatch):
    from dataclasses import asdict

    import torch

    from zoo import shapes

    cfg = t2i_recipe.RecipeConfig()
    torch.save({"config": json.dumps(asdict(cfg), sort_keys=True), "step": 5}, tmp_path / "vae.ckpt")
    assert t2i_recipe.load_checkpoint(tmp_path / "vae.ckpt", t2i_recipe.RecipeConfig(), "vae")["step"] == 5
    monkeypatch.setitem(shapes.COLOURS, "orange", (250, 120, 10))  # a new palette draws every image anew
    repainted = t2i_recipe.RecipeConfig()
    assert repainted.world != cfg.world
    for stage in ("vae", "decoder", "unet"):
        with pytest.raises(SystemExit, match="another shapes world"):
            t2i_recipe.load_checkpoint(tmp_path / "vae.ckpt", repainted, stage)
    encoded = []
    monkeypatch.setattr(t2i_recipe, "encode_latents", lambda vae, images: encoded.append(1) or torch.ones(2, 4, 8, 8))
    images = torch.zeros(2, 64, 64, 3, dtype=torch.uint8).numpy()
    t2i_recipe.cached_latents(tmp_path / "latents.pt", None, images, cfg)
    t2i_recipe.cached_latents(tmp_path / "latents.pt", None, images, cfg)
    assert len(encoded) == 1  # kept for a resumed run
    t2i_recipe.cached_latents(tmp_path / "latents.pt", None, images, repainted)
    assert len(encoded) == 2  # but not reused for another world's images


def test_one_step_generation_starts_where_the_schedule_holds_no_signal():
    """Zero terminal SNR: at the first timestep of one-step generation the model input is pure noise, as in
    training, so the model cannot learn to read the clean image out of the noise."""
    from pathlib import Path

    from zoo.t2i import T2IConfig, build_pipeline, build_tokenizer_files

    tokenizer = Path(__import__("tempfile").mkdtemp())
    build_tokenizer_files(tokenizer, 48)
    scheduler = build_pipeline(T2IConfig(), tokenizer).scheduler
    scheduler.set_timesteps(1)
    signal = scheduler.alphas_cumprod[int(scheduler.timesteps[0])] ** 0.5
    assert signal < 1e-3  # SDXL's own schedule leaves 0.068: an object shows through the noise


@pytest.mark.parametrize("freeze", [False, True])
def test_frozen_text_encoders_keep_their_weights_and_a_kept_vae_is_kept(tmp_path, freeze):
    """`--freeze-text-encoders` (SDXL's way): the text encoders keep their initial weights while the UNet
    learns; by default they learn with it. `--vae-from` keeps a saved pipeline's VAE bit for bit."""
    import torch

    from zoo import WEIGHTS_DIR
    from zoo.t2i import T2IConfig, build_pipeline

    kept = WEIGHTS_DIR / "t2i"
    if not (kept / "model_index.json").exists():
        pytest.skip("embedded t2i weights missing")
    train(tmp_path, 2, "--vae-from", str(kept), *(["--freeze-text-encoders"] if freeze else []))
    saved = tmp_path / "pipeline"
    assert json.loads((saved / "recipe.json").read_text())["vae_from"] == str(kept)
    assert all(torch.equal(v, _weights(kept, "vae")[k]) for k, v in _weights(saved, "vae").items())
    assert json.loads((saved / "vae" / "config.json").read_text())["scaling_factor"] == pytest.approx(
        json.loads((kept / "vae" / "config.json").read_text())["scaling_factor"])
    torch.manual_seed(0)  # the recipe's seed, set before it builds the pipeline
    initial = build_pipeline(T2IConfig(), tmp_path / "tokenizer").to(torch.float16)
    for component, module in (("text_encoder", initial.text_encoder), ("unet", initial.unet)):
        same = all(torch.equal(v, module.state_dict()[k]) for k, v in _weights(saved, component).items())
        assert same == (component == "text_encoder" and freeze), component
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert not any(r.get("stage") in ("vae", "decoder") for r in log)  # steps 2-3 skipped


def test_vae_from_a_directory_without_a_pipeline_or_negative_pretraining_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no saved pipeline VAE there"):
        train(tmp_path, 2, "--vae-from", str(tmp_path / "nothing"))
    with pytest.raises(SystemExit, match="must be 0 .none. or a number of steps"):
        train(tmp_path, 2, "--pretrain-text-encoders", "-5")


def test_pretrained_text_encoders_learn_to_match_captions_to_images_then_stay_frozen(tmp_path):
    """`--pretrain-text-encoders N`: a toy CLIP stage trains both encoders against the latents (retrieval within
    the batch rises above chance), resumes from its checkpoint, and the UNet stage then keeps them frozen."""
    import torch

    from zoo import WEIGHTS_DIR

    kept = WEIGHTS_DIR / "t2i"
    if not (kept / "model_index.json").exists():
        pytest.skip("embedded t2i weights missing")
    train(tmp_path, 0, "--vae-from", str(kept), "--pretrain-text-encoders", "50")
    train(tmp_path, 2, "--vae-from", str(kept), "--pretrain-text-encoders", "100")  # resumes at step 50
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert {"stage": "text", "resumed_at": 50} in [{k: r[k] for k in ("stage", "resumed_at") if k in r} for r in log]
    retrieval = [r["retrieval"] for r in log if r.get("stage") == "text" and "retrieval" in r]
    assert retrieval[-1] > 0.5  # 32 captions, chance 1/32
    recipe = json.loads((tmp_path / "pipeline" / "recipe.json").read_text())
    assert recipe["freeze_text_encoders"] and recipe["text_pretrain_steps"] == 100
    state = torch.load(tmp_path / "text.ckpt", weights_only=True)["modules"]
    saved = _weights(tmp_path / "pipeline", "text_encoder")
    assert all(torch.equal(v, state["text_encoder." + k].half()) for k, v in saved.items())


def test_the_sdxl_proportions_config_puts_most_transformer_layers_at_the_lowest_resolution(tmp_path):
    from zoo.t2i import T2I_CONFIGS, build_pipeline, build_tokenizer_files, t2i_config

    build_tokenizer_files(tmp_path / "tokenizer", 48)
    depth = {}
    for name in ("v1", "sdxl-proportions"):
        unet = build_pipeline(t2i_config(name), tmp_path / "tokenizer").unet
        depth[name] = {block: len(dict(unet.named_modules())[block].transformer_blocks)
                       for block in ("down_blocks.1.attentions.1", "down_blocks.2.attentions.1", "mid_block.attentions.0",
                                     "up_blocks.0.attentions.1", "up_blocks.1.attentions.2")}
    assert set(depth["v1"].values()) == {1}
    v2 = depth["sdxl-proportions"]
    assert v2["down_blocks.1.attentions.1"] == v2["up_blocks.1.attentions.2"] == 2  # SDXL: 2 at its middle level
    assert v2["down_blocks.2.attentions.1"] == v2["mid_block.attentions.0"] == v2["up_blocks.0.attentions.1"] == 6
    assert T2I_CONFIGS["sdxl-proportions"].unet_channels == T2I_CONFIGS["v1"].unet_channels  # doubling per level
    blocks_only = build_pipeline(t2i_config("sdxl-blocks-only"), tmp_path / "tokenizer").unet
    attentions = {name for name, _ in blocks_only.named_modules()
                  if re.fullmatch(r"(down_blocks\.\d|up_blocks\.\d|mid_block)\.attentions\.\d", name)}
    assert attentions == {"down_blocks.2.attentions.0", "down_blocks.2.attentions.1", "mid_block.attentions.0",
                          "up_blocks.0.attentions.0", "up_blocks.0.attentions.1", "up_blocks.0.attentions.2"}
    with pytest.raises(ValueError, match="unknown model configuration 'sdxl'.*v1, sdxl-proportions"):
        t2i_config("sdxl")
    parser = argparse.ArgumentParser()
    t2i_recipe.add_arguments(parser)
    assert parser.parse_args(["--config", "sdxl-proportions"]).config == "sdxl-proportions"
    with pytest.raises(SystemExit):  # argparse: invalid choice, exit 2 with the choices
        parser.parse_args(["--config", "sdxl"])


def test_a_checkpoint_written_before_a_model_field_existed_resumes_as_its_default(tmp_path):
    from dataclasses import asdict, replace

    import torch

    cfg = t2i_recipe.RecipeConfig()
    written = asdict(cfg)
    del written["model"]["unet_transformer_layers"]  # a v1 checkpoint, before the field was added
    torch.save({"config": json.dumps(written, sort_keys=True), "step": 7}, tmp_path / "unet.ckpt")
    assert t2i_recipe.load_checkpoint(tmp_path / "unet.ckpt", cfg)["step"] == 7
    deeper = replace(cfg, model=replace(cfg.model, unet_transformer_layers=(1, 2, 6)))
    with pytest.raises(SystemExit, match="different recipe configuration"):
        t2i_recipe.load_checkpoint(tmp_path / "unet.ckpt", deeper)


def test_zero_pooled_text_trains_a_model_whose_prompt_reaches_the_unet_only_by_cross_attention(tmp_path):
    """`--zero-pooled-text`: text_encoder_2's projection is zero and stays so through training and saving, so the
    saved pipeline's pooled prompt embedding (the time-embedding path) is zero while its other weights learned."""
    import torch

    from interp.models import load_t2i

    train(tmp_path, 2, "--zero-pooled-text")
    saved = _weights(tmp_path / "pipeline", "text_encoder_2")
    assert saved["text_projection.weight"].abs().max() == 0
    assert json.loads((tmp_path / "pipeline" / "recipe.json").read_text())["pooled_text"] is False
    pipe = load_t2i(str(tmp_path / "pipeline"), device="cpu").pipe
    with torch.no_grad():
        _, _, pooled, _ = pipe.encode_prompt("a red circle", do_classifier_free_guidance=False)
    assert pooled.abs().max() == 0


@pytest.mark.parametrize("objective", ["sample", "epsilon", "v_prediction"])
def test_each_objective_targets_a_quantity_from_which_the_clean_latent_is_recovered(objective):
    """The recipe's noised input and target: x0 comes back from them by the identity its scheduler uses."""
    import torch

    x0, noise = torch.randn(3, 4, 8, 8), torch.randn(3, 4, 8, 8)
    alpha_bar = torch.tensor([0.9, 0.4, 0.02]).view(-1, 1, 1, 1)
    model_input, target = t2i_recipe.noised_and_target(x0, noise, alpha_bar, objective)
    assert torch.allclose(model_input, alpha_bar.sqrt() * x0 + (1 - alpha_bar).sqrt() * noise)
    recovered = {"sample": lambda: target,
                 "epsilon": lambda: (model_input - (1 - alpha_bar).sqrt() * target) / alpha_bar.sqrt(),
                 "v_prediction": lambda: alpha_bar.sqrt() * model_input - (1 - alpha_bar).sqrt() * target}[objective]()
    assert torch.allclose(recovered, x0, atol=1e-4)


def test_a_base_model_recipe_saves_a_multi_step_cfg_pipeline_and_a_one_step_model_starts_from_it(tmp_path,
                                                                                                 tiny_toy_base):
    """`--objective v_prediction` (toy-base): a tiny run trains, saves a pipeline whose scheduler reads v, with its
    sampling defaults in recipe.json, that generates at those steps with classifier-free guidance (the U-Net batch
    holds both halves); `--init-from` starts a one-step model from its UNet and text encoders."""
    import torch

    from interp.hooks.diffusion import capture_updates
    from interp.models import load_t2i

    base = tiny_toy_base  # trained by `train(base, 2, "--objective", "v_prediction", "--sampling-steps", "3",
                          # "--guidance", "2")`, once for the session (tests/conftest.py)
    recipe = json.loads((base / "pipeline" / "recipe.json").read_text())
    assert (recipe["objective"], recipe["sampling_steps"], recipe["guidance"]) == ("v_prediction", 3, 2.0)
    assert recipe["empty_prompt_share"] == 0.1  # prompt dropout for the unconditional half
    scheduler = json.loads((base / "pipeline" / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["prediction_type"] == "v_prediction"
    assert torch.load(base / "unet.ckpt", weights_only=True)["step"] == 2
    model = load_t2i(str(base / "pipeline"), device="cpu")
    with capture_updates(model, ["mid_block.attentions.0"]) as cap:
        image = model.generate("a red circle", steps=recipe["sampling_steps"], guidance=recipe["guidance"],
                               seed=0, output_type="np")
    assert image.shape == (1, 64, 64, 3) and np.isfinite(image).all()
    assert cap.updates("mid_block.attentions.0", half="all").shape[:2] == (3, 2)  # 3 steps, [uncond, cond]
    # `zoo evaluate` scores it at its own steps and guidance, and says which
    from zoo.__main__ import main as zoo_main

    assert zoo_main(["evaluate", "--model", str(base / "pipeline"), "--n", "2", "--out", str(tmp_path / "e")]) == 0
    evaluated = json.loads((tmp_path / "e" / "t2i_eval.json").read_text())
    assert (evaluated["steps"], evaluated["guidance"]) == (3, 2.0)

    turbo = tmp_path / "turbo"
    train(turbo, 0, "--init-from", str(base / "pipeline"), "--vae-from", str(base / "pipeline"))
    for component in ("unet", "text_encoder", "text_encoder_2"):
        started = _weights(turbo / "pipeline", component)
        assert all(torch.equal(v, _weights(base / "pipeline", component)[k]) for k, v in started.items()), component
    assert json.loads((turbo / "pipeline" / "scheduler" / "scheduler_config.json").read_text())[
        "prediction_type"] == "sample"


def test_epsilon_on_a_zero_snr_schedule_and_guidance_without_dropped_prompts_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="use v_prediction"):
        train(tmp_path, 2, "--objective", "epsilon")
    with pytest.raises(SystemExit, match="needs the unconditional model"):
        train(tmp_path, 2, "--objective", "v_prediction", "--empty-prompt-share", "0")

import argparse
import json

from interp.zoo import t2i_recipe


def train(out, unet_steps: int):
    parser = argparse.ArgumentParser()
    t2i_recipe.add_arguments(parser)
    args = parser.parse_args(["--out", str(out), "--scenes", "32", "--vae-steps", "2", "--decoder-steps", str(unet_steps), "--unet-steps", str(unet_steps),
                              "--batch", "4", "--checkpoint-every", "2", "--probe-every", "0", "--threads", "1"])
    t2i_recipe.main(args)


def test_recipe_trains_saves_a_loadable_pipeline_and_resumes(tmp_path):
    train(tmp_path, unet_steps=2)
    train(tmp_path, unet_steps=4)  # as after an interruption at step 2: picks up there, no step lost
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    resumed = [r for r in log if "resumed_at" in r]
    assert {(r["stage"], r["resumed_at"]) for r in resumed} == {("vae", 2), ("decoder", 2), ("unet", 2)}
    from interp.models import load_t2i

    model = load_t2i(str(tmp_path / "pipeline"), device="cpu")
    assert model.vocabulary and "circle" in model.vocabulary
    assert model.generate("a red circle", seed=0)[0].size == (64, 64)


def test_a_new_unet_setting_keeps_the_trained_vae_but_a_new_vae_setting_does_not(tmp_path):
    from dataclasses import asdict, replace

    import pytest
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


def test_one_step_generation_starts_where_the_schedule_holds_no_signal():
    """Zero terminal SNR: at the first timestep of one-step generation the model input is pure noise, as in
    training, so the model cannot learn to read the clean image out of the noise."""
    from pathlib import Path

    from interp.zoo.t2i import T2IConfig, build_pipeline, build_tokenizer_files

    tokenizer = Path(__import__("tempfile").mkdtemp())
    build_tokenizer_files(tokenizer, 48)
    scheduler = build_pipeline(T2IConfig(), tokenizer).scheduler
    scheduler.set_timesteps(1)
    signal = scheduler.alphas_cumprod[int(scheduler.timesteps[0])] ** 0.5
    assert signal < 1e-3  # SDXL's own schedule leaves 0.068: an object shows through the noise

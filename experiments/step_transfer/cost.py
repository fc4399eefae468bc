"""The step-transfer study's cost figure: one UNet-stage step of the toy-base recipe, timed (`cost`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from .study import Study

def base_step_seconds(steps: int = 4, batch: int = 32, threads: int = 1) -> dict:
    """Seconds of one UNet-stage step of the toy-base recipe (`--objective v_prediction`, the v1 sizes, batch 32):
    text encoders and UNet forward and backward, the recipe's own noising, target and loss. Median of `steps` after
    a warm-up step; the machine's load average is recorded beside it (the cores are shared)."""
    import os
    import tempfile

    from zoo import shapes
    from zoo.t2i import build_pipeline, build_tokenizer_files
    from zoo.t2i_recipe import (TIME_IDS, RecipeConfig, encode_text, noised_and_target, set_objective,
                                       weighted_mse)

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = RecipeConfig(objective="v_prediction", unet_batch=batch)
    with tempfile.TemporaryDirectory() as tokenizer_dir:
        build_tokenizer_files(Path(tokenizer_dir), cfg.model.max_tokens)
        pipe = build_pipeline(cfg.model, Path(tokenizer_dir))
    set_objective(pipe, cfg.objective)
    modules = torch.nn.ModuleList([pipe.unet, pipe.text_encoder, pipe.text_encoder_2]).train()
    opt = torch.optim.AdamW(modules.parameters(), lr=cfg.unet_lr)
    rng = np.random.default_rng(0)
    latent = cfg.model.image_size // 2 ** (len(cfg.model.vae_channels) - 1)
    times = []
    for i in range(steps + 1):
        start = time.perf_counter()
        prompts = shapes.world_prompts(batch, seed=i)
        x0 = torch.randn(batch, cfg.model.latent_channels, latent, latent)
        t = torch.from_numpy(rng.integers(0, 1000, size=batch))
        model_input, target = noised_and_target(x0, torch.randn_like(x0),
                                                pipe.scheduler.alphas_cumprod[t].view(-1, 1, 1, 1), cfg.objective)
        embeds, pooled = encode_text(pipe, prompts)
        pred = pipe.unet(model_input, t, embeds, added_cond_kwargs={
            "text_embeds": pooled, "time_ids": torch.tensor([TIME_IDS], dtype=torch.float32).expand(batch, -1)}).sample
        loss = weighted_mse(pred, target, torch.ones(batch, 1, latent, latent))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(modules.parameters(), 1.0)
        opt.step()
        if i:
            times.append(time.perf_counter() - start)
    return {"step_s": float(np.median(times)), "steps_timed": steps, "batch": batch, "threads": threads,
            "load_average_1min": os.getloadavg()[0], "cpu_count": os.cpu_count()}


def cost(study: Study, args) -> int:
    from interp.atomic import atomic_write_text

    measured = base_step_seconds(threads=args.threads)
    study.run_root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(study.run_root / "base_step_cost.json", json.dumps(measured, indent=2) + "\n")
    print(json.dumps(measured, indent=2))
    return 0



__all__ = ["base_step_seconds", "cost"]

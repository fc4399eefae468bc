"""Cost of one U-Net training step of the text-to-image recipe (forward and backward at the recipe's batch), for
a model config at the embedded model's latent size (32 x 32: 8 x 8 at the U-Net's lowest level) against the same
U-Net on a latent twice as fine (64 x 64, as a VAE without downsampling gives: 16 x 16 at the lowest level, where
an object of the shapes world spans 3-5 cells instead of 1.4-2.3). The ratio, measured side by side, is what a
recipe with the finer latent would cost against the budget (issue 22: about 3 hours on two cores).

    python -m benchmarks.t2i_recipe_step [--config sdxl-blocks-only] [--steps 3] [--out runs/bench/t2i_recipe_step.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from zoo.t2i import T2I_CONFIGS, build_pipeline, build_tokenizer_files
from zoo.t2i_recipe import RecipeConfig


def step_seconds(unet, latent: int, batch: int, text: torch.Tensor, pooled: torch.Tensor, steps: int) -> list[float]:
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-4)
    x = torch.randn(batch, unet.config.in_channels, latent, latent)
    t = torch.full((batch,), 999)
    time_ids = torch.zeros(batch, 6)
    times = []
    for i in range(steps + 1):  # the first is a warm-up
        start = time.perf_counter()
        out = unet(x, t, text, added_cond_kwargs={"text_embeds": pooled, "time_ids": time_ids}).sample
        loss = out.pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i:
            times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="sdxl-blocks-only", choices=sorted(T2I_CONFIGS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=RecipeConfig.unet_batch)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="runs/bench/t2i_recipe_step.json")
    args = parser.parse_args()
    if args.steps < 1 or args.batch < 1:
        raise SystemExit("--steps and --batch must be at least 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = T2I_CONFIGS[args.config]
    tokenizer_dir = Path(args.out).parent / "tokenizer"
    build_tokenizer_files(tokenizer_dir, config.max_tokens)
    unet = build_pipeline(config, tokenizer_dir).unet.train()
    text = torch.randn(args.batch, config.max_tokens, unet.config.cross_attention_dim)
    pooled = torch.randn(args.batch, config.text_projection)
    toy_latent = config.image_size // 2 ** (len(config.vae_channels) - 1)
    result = {"config": args.config, "batch": args.batch, "threads": torch.get_num_threads(), "steps": args.steps}
    # interleaved rounds, so that load on the machine falls on both sizes alike
    rounds = {toy_latent: [], 2 * toy_latent: []}
    for _ in range(2):
        for latent in rounds:
            rounds[latent] += step_seconds(unet, latent, args.batch, text, pooled, args.steps)
    for latent, times in rounds.items():
        result[f"step_s_latent{latent}"] = statistics.median(times)
    result["finer_over_toy"] = result[f"step_s_latent{2 * toy_latent}"] / result[f"step_s_latent{toy_latent}"]
    for key, value in result.items():
        print(f"{key:24s} {value:.4g}" if isinstance(value, float) else f"{key:24s} {value}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""Hooks at real width: FLUX.1's transformer (its real config's widths, random weights) at a reduced depth, one call.

    python benchmarks/flux_real_size.py [--double 2] [--single 2] [--size 512] [--text-tokens 128] [--rounds 1]
                                        [--dtype float32] [--out runs/bench/flux_real_size.json]

The transformer is built from `interp/models/configs/flux1-dev-transformer.json` (hidden 3072 = 24 heads x 128,
T5 width 4096, CLIP pooled 768, 64 packed latent channels) with `--double` double-stream and `--single`
single-stream blocks instead of 19 and 38: every block is the real block, only fewer of them (a double block is
340 M parameters, a single one 142 M; the full model, 11.9 B, is 47.6 GB in float32). At 512 px the latent is
64 x 64, packed 2 x 2 into 1024 image tokens; the text stream has `--text-tokens` T5 tokens (FLUX.1-dev's
pipeline pads to 512).

Four variants of one denoiser call, run in interleaved rounds, medians compared with the plain call, in the report
format of `benchmarks/t2i_real_size.py` (SDXL Turbo's U-Net):

  plain     the transformer call, no hooks
  capture   `capture_updates` on the first and last double block, the first double block's text stream
            (`transformer_blocks.0:text`) and the last single block
  sae       capture, then a TopK SAE (d_in 3072, d_sae 12288, k 10) encodes the 1024 image tokens of the first
            double block
  paint     `apply_edits`: an SAE feature added inside a quarter-image mask on the token grid of the first double
            block (the Paint tab's edit)

Peak memory as in t2i_real_size: resident set sampled every 5 ms minus the level just before the call (CPU), or
torch's peak allocation (CUDA). The transformer is called directly with random text conditioning (T5 and CLIP are
not what is measured); outside `run_pipeline` each call counts as one step.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.t2i_real_size import measured  # noqa: E402
from interp.cli import add_dtype_argument, parse_dtype  # noqa: E402
from interp.edits import Edit  # noqa: E402
from interp.hooks import apply_edits, capture_updates  # noqa: E402
from interp.models.t2i import block_info  # noqa: E402

CONFIG = ROOT / "interp" / "models" / "configs" / "flux1-dev-transformer.json"


def flux_config(double: int, single: int) -> dict:
    """FLUX.1-dev's transformer config with `double` double-stream and `single` single-stream blocks."""
    config = json.loads(CONFIG.read_text())
    config.pop("_note", None)
    config.update(num_layers=double, num_single_layers=single)
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--double", type=int, default=2, help="double-stream blocks (FLUX.1: 19)")
    parser.add_argument("--single", type=int, default=2, help="single-stream blocks (FLUX.1: 38)")
    parser.add_argument("--size", type=int, default=512, help="image side in pixels (latent: size / 8, tokens: "
                                                               "(size / 16) ** 2)")
    parser.add_argument("--text-tokens", type=int, default=128, help="T5 tokens of the text stream (FLUX.1: 512)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--d-sae", type=int, default=4 * 3072)
    add_dtype_argument(parser, what="the denoiser")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.double < 1 or args.single < 1:
        parser.error("--double and --single must be at least 1")
    if args.size % 16:
        parser.error("--size must be a multiple of 16 (8 for the VAE, 2 for the packing)")
    command = "python benchmarks/flux_real_size.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    print(f"command: {command}", flush=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    from diffusers import FluxPipeline, FluxTransformer2DModel

    from saes.sae import SAE, SAEConfig

    dtype = parse_dtype(args.dtype)
    torch.manual_seed(0)
    started = time.perf_counter()
    config = flux_config(args.double, args.single)
    transformer = FluxTransformer2DModel.from_config(config).to(args.device, dtype).eval()
    build_seconds = time.perf_counter() - started
    latent = args.size // 8
    side = latent // 2  # tokens per side after packing
    width = transformer.config.num_attention_heads * transformer.config.attention_head_dim
    first, last = "transformer_blocks.0", f"transformer_blocks.{args.double - 1}"
    sites = list(dict.fromkeys([first, last, f"{first}:text", f"single_transformer_blocks.{args.single - 1}"]))
    blocks = block_info(transformer, latent_side=latent)
    device = args.device
    inputs = {
        "hidden_states": torch.randn(1, side * side, transformer.config.in_channels, device=device, dtype=dtype),
        "encoder_hidden_states": torch.randn(1, args.text_tokens, transformer.config.joint_attention_dim,
                                             device=device, dtype=dtype),
        "pooled_projections": torch.randn(1, transformer.config.pooled_projection_dim, device=device, dtype=dtype),
        "timestep": torch.tensor([1.0], device=device, dtype=dtype),  # the pipeline passes t / 1000
        "img_ids": FluxPipeline._prepare_latent_image_ids(1, side, side, device, dtype),
        "txt_ids": torch.zeros(args.text_tokens, 3, device=device, dtype=dtype),
    }
    if transformer.config.guidance_embeds:
        inputs["guidance"] = torch.tensor([3.5], device=device, dtype=torch.float32)
    sae = SAE(SAEConfig(d_in=width, d_sae=args.d_sae, architecture="topk", k=10))
    with torch.no_grad():  # random unit-norm decoder rows, encoder their transpose
        sae.W_dec.copy_(torch.nn.functional.normalize(torch.randn(args.d_sae, width), dim=1))
        sae.W_enc.copy_(sae.W_dec.T)
    sae = sae.to(device)
    # A mask is given at the block grid of the denoiser's default size (FLUX: 1024 px, 64 x 64 tokens), as the UI
    # draws it; at another size the edit scales it to that call's grid.
    info = block_info(transformer)[first]
    mask = torch.zeros(info.height, info.width)
    mask[: info.height // 2, : info.width // 2] = 1.0
    paint = Edit(first, "add", feature=7, strength=8.0, mask=mask.tolist())

    def call():
        with torch.inference_mode():
            transformer(**inputs)

    def capture():
        with capture_updates(transformer, sites) as cap:
            call()
        return cap

    def capture_and_encode():
        cap = capture()
        update = cap.updates(first)[0]  # (batch, 3072, 32, 32)
        with torch.inference_mode():
            sae.encode(update.permute(0, 2, 3, 1).reshape(-1, width).float())

    def painted():
        with apply_edits(transformer, [paint], saes={first: sae}):
            call()

    variants = {"plain": call, "capture": capture, "sae": capture_and_encode, "paint": painted}
    shapes = {s: list(t.shape[2:]) for s, t in ((s, capture().updates(s)) for s in sites)}  # also the warm-up
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    memory: dict[str, list[int]] = {name: [] for name in variants}
    for round_index in range(args.rounds):
        order = list(variants) if round_index % 2 == 0 else list(reversed(variants))
        for name in order:
            s, m = measured(variants[name], device)
            seconds[name].append(s)
            memory[name].append(m)
            print(f"round {round_index} {name}: {s:.2f} s, peak +{m / 2**20:.0f} MiB", flush=True)
    median = {name: statistics.median(v) for name, v in seconds.items()}
    result = {
        "command": command, "config": str(CONFIG.relative_to(ROOT)), "double_blocks": args.double,
        "single_blocks": args.single, "size": args.size, "latent": latent, "image_tokens": side * side,
        "text_tokens": args.text_tokens, "dtype": args.dtype, "device": device, "threads": torch.get_num_threads(),
        "rounds": args.rounds, "parameters": sum(p.numel() for p in transformer.parameters()),
        "build_seconds": build_seconds, "sites": shapes, "d_sae": args.d_sae,
        "median_seconds": median, "ratio_to_plain": {name: median[name] / median["plain"] for name in variants},
        "peak_extra_mib": {name: max(v) / 2**20 for name, v in memory.items()},
        "seconds": seconds,
    }
    print(json.dumps({k: result[k] for k in ("parameters", "sites", "median_seconds", "ratio_to_plain",
                                             "peak_extra_mib")}, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Hooks at real size: SDXL Turbo's U-Net (its real config, random weights) at 512 px, one step.

    python benchmarks/t2i_real_size.py [--rounds 3] [--size 512] [--dtype float32] [--out runs/bench/t2i_real_size.json]

Four variants of one denoiser call, run in interleaved rounds so that a busy machine slows all alike, medians
compared with the plain call:

  plain     the U-Net call, no hooks
  capture   `capture_updates` on SDXL's four blocks (the store's capture)
  sae       capture, then a TopK SAE (d_in 1280, d_sae 5120, k 10) encodes every position of the deepest block
  paint     `apply_edits`: an SAE feature added inside a mask (the Paint tab's edit) on up_blocks.0.attentions.1

Peak memory is the process' resident set sampled every 5 ms during each call, minus the resident set just before
it (CPU), or torch's peak allocation (CUDA). The U-Net is called directly with random text conditioning (SDXL's
text encoders are not what is measured): outside `run_pipeline` each call counts as one step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from interp.cli import add_dtype_argument, parse_dtype  # noqa: E402
from interp.edits import Edit  # noqa: E402
from interp.hooks import apply_edits, capture_updates  # noqa: E402
from interp.models.t2i import SDXL_BLOCKS, block_info  # noqa: E402

CONFIG = ROOT / "interp" / "models" / "configs" / "sdxl-turbo-unet.json"
PAINTED = "up_blocks.0.attentions.1"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measured(fn, device: str) -> tuple[float, int]:
    """(seconds, peak extra bytes) of fn()."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - start, torch.cuda.max_memory_allocated() - before
    before = rss_bytes()
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    return seconds, max(peak[0], rss_bytes()) - before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=512, help="image side in pixels (latent: size / 8)")
    add_dtype_argument(parser, what="the denoiser")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from diffusers import UNet2DConditionModel

    from saes.sae import SAE, SAEConfig

    dtype = parse_dtype(args.dtype)
    torch.manual_seed(0)
    started = time.perf_counter()
    unet = UNet2DConditionModel.from_config(json.loads(CONFIG.read_text())).to(args.device, dtype).eval()
    build_seconds = time.perf_counter() - started
    latent = args.size // 8
    blocks = block_info(unet, latent_side=latent)
    sample = torch.randn(1, unet.config.in_channels, latent, latent, device=args.device, dtype=dtype)
    text = torch.randn(1, 77, unet.config.cross_attention_dim, device=args.device, dtype=dtype)
    added = {"text_embeds": torch.randn(1, 1280, device=args.device, dtype=dtype),
             "time_ids": torch.tensor([[args.size, args.size, 0, 0, args.size, args.size]], device=args.device,
                                      dtype=dtype)}
    timestep = torch.tensor([999], device=args.device)
    sae = SAE(SAEConfig(d_in=1280, d_sae=5120, architecture="topk", k=10))
    with torch.no_grad():  # random unit-norm decoder rows, encoder their transpose
        sae.W_dec.copy_(torch.nn.functional.normalize(torch.randn(5120, 1280), dim=1))
        sae.W_enc.copy_(sae.W_dec.T)
    sae = sae.to(args.device)
    info = blocks[PAINTED]
    mask = torch.zeros(info.height, info.width)
    mask[: info.height // 2, : info.width // 2] = 1.0
    paint = Edit(PAINTED, "add", feature=7, strength=8.0, mask=mask.tolist())

    def call():
        with torch.inference_mode():
            unet(sample, timestep, encoder_hidden_states=text, added_cond_kwargs=added)

    def capture():
        with capture_updates(unet, SDXL_BLOCKS) as cap:
            call()
        return cap

    def capture_and_encode():
        cap = capture()
        update = cap.updates("mid_block.attentions.0")[0]  # (batch, 1280, H, W)
        with torch.inference_mode():
            sae.encode(update.permute(0, 2, 3, 1).reshape(-1, 1280).float())

    def painted():
        with apply_edits(unet, [paint], saes={PAINTED: sae}):
            call()

    variants = {"plain": call, "capture": capture, "sae": capture_and_encode, "paint": painted}
    call()  # warm-up (allocator, kernels)
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    memory: dict[str, list[int]] = {name: [] for name in variants}
    for round_index in range(args.rounds):
        order = list(variants) if round_index % 2 == 0 else list(reversed(variants))
        for name in order:
            s, m = measured(variants[name], args.device)
            seconds[name].append(s)
            memory[name].append(m)
            print(f"round {round_index} {name}: {s:.2f} s, peak +{m / 2**20:.0f} MiB", flush=True)
    median = {name: statistics.median(v) for name, v in seconds.items()}
    result = {
        "config": str(CONFIG.relative_to(ROOT)), "size": args.size, "latent": latent, "dtype": args.dtype,
        "device": args.device, "threads": torch.get_num_threads(), "rounds": args.rounds,
        "parameters": sum(p.numel() for p in unet.parameters()), "build_seconds": build_seconds,
        "blocks": {b: [blocks[b].channels, blocks[b].height, blocks[b].width] for b in SDXL_BLOCKS},
        "median_seconds": median, "ratio_to_plain": {name: median[name] / median["plain"] for name in variants},
        "peak_extra_mib": {name: max(v) / 2**20 for name, v in memory.items()},
        "seconds": seconds,
    }
    print(json.dumps({k: result[k] for k in ("median_seconds", "ratio_to_plain", "peak_extra_mib")}, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

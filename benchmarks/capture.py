"""Cost of capture hooks, of an active edit, and of the store's writer, measured side by side.

    python -m benchmarks.capture [--model toy|DIR|sdxl-turbo] [--rounds 15] [--out runs/bench/capture.json]

Generation is timed in interleaved rounds (plain, with the four capture hooks, with an
active edit), so a machine busy with other work slows all three alike; medians are
compared. The store's atomic shard writer (temp file, fsync, rename) is timed against a
plain `safetensors` save of the same fp16 tensors. Uses the embedded model when its
weights exist, else a random-weight pipeline of the same build.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


from safetensors.torch import save_file

import zoo  # noqa: F401 - registers the embedded models with the core (interp.embedded)
from interp.edits import Edit
from interp.hooks import apply_edits, capture_updates, generate
from interp.models.t2i import KNOWN_MODELS, SDXL_BLOCKS, T2IModel, block_info, load_t2i
from interp.store import write_shard


def load_model(name: str):
    if name == "toy" and not (Path(KNOWN_MODELS["toy"].source) / "model_index.json").exists():
        from zoo.t2i import T2IConfig, build_pipeline, build_tokenizer_files

        tokenizer_dir = Path(tempfile.mkdtemp())
        build_tokenizer_files(tokenizer_dir, 48)
        torch.manual_seed(0)
        pipe = build_pipeline(T2IConfig(), tokenizer_dir)
        pipe.set_progress_bar_config(disable=True)
        return T2IModel(name="random (toy build; embedded weights absent)", pipe=pipe, default_steps=1,
                        default_guidance=0.0, blocks=block_info(pipe.unet)), "random"
    return load_t2i(name), name


def timed(fn) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="toy")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch", type=int, default=4, help="images per generation")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--store-images", type=int, default=64, help="images whose updates the writer saves")
    parser.add_argument("--out", default="runs/bench/capture.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, model_name = load_model(args.model)
    steps = args.steps or model.default_steps
    blocks = [b for b in SDXL_BLOCKS if b in model.blocks]
    prompts = ["a red circle on a white background"] * args.batch
    seeds = list(range(args.batch))
    edit_block = model.blocks[SDXL_BLOCKS[-1]]
    edit = Edit(edit_block.name, "add", direction=[1.0] * edit_block.channels, strength=2.0)

    def plain():
        generate(model, prompts, steps=steps, seed=seeds)

    def captured():
        with capture_updates(model, blocks):
            generate(model, prompts, steps=steps, seed=seeds)

    def edited():
        with apply_edits(model, [edit]):
            generate(model, prompts, steps=steps, seed=seeds)

    cases = {"plain": plain, "capture_4_blocks": captured, "edit_add": edited}
    for fn in cases.values():  # warm-up
        fn()
    times = {k: [] for k in cases}
    for _ in range(args.rounds):
        for key, fn in cases.items():
            times[key].append(timed(fn))
    median = {k: statistics.median(v) for k, v in times.items()}

    # Store writer vs plain safetensors on the same fp16 tensors.
    with capture_updates(model, blocks, device="cpu") as cap:
        for start in range(0, args.store_images, args.batch):
            generate(model, prompts, steps=steps, seed=seeds, output_type="latent")
    tensors = {b: torch.cat([cap.updates(b, generation=g) for g in range(cap.n_generations)], dim=1)
               .transpose(0, 1).half().contiguous() for b in blocks}
    megabytes = sum(t.numel() * t.element_size() for t in tensors.values()) / 1e6
    write_times = {"store_write_shard": [], "plain_save_file": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(5):
            write_times["store_write_shard"].append(timed(lambda: write_shard(Path(tmp) / f"s{i}.safetensors",
                                                                                tensors)))
            write_times["plain_save_file"].append(timed(lambda: save_file(tensors, str(Path(tmp) / f"p{i}.st"))))
    throughput = {k: megabytes / statistics.median(v) for k, v in write_times.items()}

    result = {
        "model": model_name, "device": str(model.unet.device), "threads": args.threads, "batch": args.batch,
        "steps": steps, "rounds": args.rounds, "blocks": blocks,
        "generation_seconds_median": median,
        "ratio_capture_vs_plain": median["capture_4_blocks"] / median["plain"],
        "ratio_edit_vs_plain": median["edit_add"] / median["plain"],
        "store_megabytes": megabytes,
        "write_mb_per_s": throughput,
        "ratio_store_write_vs_plain_save": throughput["store_write_shard"] / throughput["plain_save_file"],
    }
    print(f"model {model_name}, {args.batch} images x {steps} step(s), median of {args.rounds} interleaved rounds")
    print(f"  plain generation        {median['plain'] * 1e3:8.1f} ms")
    print(f"  with 4 capture hooks    {median['capture_4_blocks'] * 1e3:8.1f} ms   ratio "
          f"{result['ratio_capture_vs_plain']:.3f}x (target <= 1.10x)")
    print(f"  with an active edit     {median['edit_add'] * 1e3:8.1f} ms   ratio "
          f"{result['ratio_edit_vs_plain']:.3f}x (target <= 1.10x)")
    print(f"  store writer (atomic, fsync) {throughput['store_write_shard']:8.1f} MB/s vs plain save_file "
          f"{throughput['plain_save_file']:8.1f} MB/s ({megabytes:.1f} MB; ratio "
          f"{result['ratio_store_write_vs_plain_save']:.2f})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One-step generation speed of a text-to-image model: median latency at batch 1, and
images per second at batch 1 and batch 16 (batching's gain as a ratio measured in the same run).

    python -m benchmarks.generate [--model toy] [--repeats 10] [--out runs/bench/generate.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import zoo  # noqa: F401 - registers the embedded models with the core (interp.embedded)
from interp.models import load_t2i

PROMPT = "a small red circle at the top left and a large blue striped star in the center on a white background"


def timed(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="toy")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="runs/bench/generate.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_t2i(args.model)
    single = timed(lambda: model.generate(PROMPT, steps=1, seed=0), args.repeats)
    batch = timed(lambda: model.generate([PROMPT] * 16, steps=1, seed=list(range(16))), max(3, args.repeats // 3))
    result = {
        "model": args.model, "device": str(model.unet.device), "threads": torch.get_num_threads(),
        "median_latency_batch1_s": statistics.median(single),
        "images_per_s_batch1": 1 / statistics.median(single),
        "images_per_s_batch16": 16 / statistics.median(batch),
    }
    result["batch16_over_batch1_throughput"] = result["images_per_s_batch16"] / result["images_per_s_batch1"]
    for key, value in result.items():
        print(f"{key:34s} {value:.4g}" if isinstance(value, float) else f"{key:34s} {value}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

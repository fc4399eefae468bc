"""The whole SAEBench suite (core, sparse probing, SCR, TPP, absorption) on SmolLM2's layer-15 SAE, one wall clock.

    python -m benchmarks.saebench_full [--threads 2] [--data-dir ../shared/data] [--out runs/saebench-full]

Runs, back to back in one process and in this order, what the three per-eval benchmarks run:
benchmarks.saebench_smollm2 (core and sparse probing), `saes bench --evals scr,tpp` on Dolly with its planted
spurious attribute, and benchmarks.saebench_absorption (3,000 words). Writes SAEBench's JSON for every eval under
--out and <out>/timings.json: each stage's wall and CPU seconds, the load average before and after it, the total,
and the CPU (lscpu's model name). Issue 43's goal: the total within 30 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

SAE_DIR = "saes/pretrained/smollm2/blocks.15.hook_resid_post"
MODEL = "smollm2-135m-instruct"


def _cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-words", type=int, default=3000)
    parser.add_argument("--out", default="runs/saebench-full")
    args = parser.parse_args(argv)
    if not 1 <= args.threads <= 256:
        parser.error("--threads must be between 1 and 256")
    from benchmarks import saebench_absorption, saebench_smollm2
    from saes.__main__ import main as saes_main

    out = Path(args.out)
    data = Path(args.data_dir)
    threads = str(args.threads)
    stages = [
        ("core, sparse_probing", lambda: saebench_smollm2.main(
            ["--threads", threads, "--data-dir", str(data), "--evals", "core,sparse_probing", "--out", str(out)])),
        ("scr, tpp", lambda: saes_main(
            ["bench", "--sae", SAE_DIR, "--model", MODEL, "--evals", "scr,tpp", "--dataset",
             str(data / "dolly-sample.jsonl"), "--threads", threads, "--out", str(out)])),
        ("absorption", lambda: saebench_absorption.main(
            ["--max-words", str(args.max_words), "--threads", threads, "--out", str(out)])),
    ]
    timings = {"cpu": saebench_smollm2.cpu_name(), "threads": args.threads, "stages": []}
    start = time.perf_counter()
    for name, run in stages:
        wall, cpu, load = time.perf_counter(), _cpu_seconds(), os.getloadavg()
        code = run()
        timings["stages"].append({"evals": name, "exit_code": code,
                                  "wall_seconds": round(time.perf_counter() - wall, 1),
                                  "cpu_seconds": round(_cpu_seconds() - cpu, 1), "load_before": load,
                                  "load_after": os.getloadavg()})
        print(json.dumps(timings["stages"][-1]), flush=True)
        if code:
            break
    timings["total_wall_seconds"] = round(time.perf_counter() - start, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    print(f"whole suite: {timings['total_wall_seconds'] / 60:.1f} min wall on {timings['cpu']} "
          f"({args.threads} threads)")
    return max(stage["exit_code"] for stage in timings["stages"])


if __name__ == "__main__":
    raise SystemExit(main())

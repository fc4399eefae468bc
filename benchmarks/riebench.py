"""RIEBench edit throughput: edits per second of each method, measured side by side in one run.

An edit = plan (encode, score, select) + the regeneration with the edits applied; the two
generations every method starts from (`prepare_task`) are timed separately, since a sweep
shares them across configurations. Ratios are to the prompt swap's generation.

    python -m benchmarks.riebench [--model toy] [--saes DIR] [--tasks 9] [--k-trans 5] [--out runs/bench/riebench.json]

Without --saes, random TopK SAEs of the published SDXL Turbo shape ratio (4x the block
channels, k=10) stand in: the cost of an edit does not depend on the SAE's weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


from riebench.methods import MethodConfig, load_saes, make_method, prepare_task, run_plan
from riebench.tasks import ShapesSuiteConfig, shapes_suite


def random_saes(model, blocks) -> dict:
    from saes.sae import SAE, SAEConfig

    generator = torch.Generator().manual_seed(0)
    saes = {}
    for b in blocks:
        c = model.blocks[b].channels
        sae = SAE(SAEConfig("topk", c, 4 * c, k=10))
        with torch.no_grad():
            sae.W_enc.copy_(torch.randn(c, 4 * c, generator=generator))
            sae.W_dec.copy_(torch.nn.functional.normalize(sae.W_enc.T.clone(), dim=1))
        saes[b] = sae
    return saes


def load_model(name: str):
    from interp.models import load_t2i
    from interp.models.t2i import ModelError

    try:
        return load_t2i(name, device="cpu"), name
    except ModelError as err:
        if name != "toy":
            raise
        # The embedded weights are missing: a random-weight pipeline of the same sizes costs the same.
        import tempfile

        from interp.models.t2i import T2IModel, block_info
        from zoo.t2i import T2IConfig, build_pipeline, build_tokenizer_files

        print(f"note: {err}; timing a random-weight pipeline of the toy model's sizes")
        directory = Path(tempfile.mkdtemp())
        build_tokenizer_files(directory, 48)
        pipe = build_pipeline(T2IConfig(), directory)
        pipe.set_progress_bar_config(disable=True)
        from interp.models.t2i import TOY_BLOCKS

        return (T2IModel("random", pipe, 1, 0.0, blocks=block_info(pipe.unet), default_blocks=TOY_BLOCKS,
                         world="shapes"),  # the toy's recipe, untrained: its world, as a saved one would be
                "random (toy sizes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="toy")
    parser.add_argument("--saes", default=None)
    parser.add_argument("--tasks", type=int, default=9, help="tasks timed (one per category, cycling)")
    parser.add_argument("--k-trans", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: no oversubscription on a shared CPU)")
    parser.add_argument("--out", default="runs/bench/riebench.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, model_name = load_model(args.model)
    blocks = list(model.default_blocks)  # the toy's six, SDXL's four
    saes = load_saes(args.saes, blocks) if args.saes else random_saes(model, blocks)
    per_category = -(-args.tasks // 9)
    tasks = shapes_suite(ShapesSuiteConfig(per_category=per_category)).tasks
    tasks = sorted(tasks, key=lambda t: t.id[-3:])[: args.tasks]  # interleave the categories
    configs = [MethodConfig("prompt-swap", blocks=blocks), MethodConfig("sae", args.k_trans, blocks=blocks),
               MethodConfig("sae", args.k_trans, blocks=blocks, variant="adaptive"),
               MethodConfig("neurons", args.k_trans, blocks=blocks), MethodConfig("activation-diff", args.k_trans, blocks=blocks)]
    methods = {c.method: make_method(c.method, model, saes) for c in configs}
    prepare_times, edit_times = [], {c.label: [] for c in configs}
    prepare_task(model, tasks[0], blocks, neurons=True)  # warm-up
    for task in tasks:
        start = time.perf_counter()
        ctx = prepare_task(model, task, blocks, neurons=True)
        prepare_times.append(time.perf_counter() - start)
        for config in configs:
            start = time.perf_counter()
            plan = methods[config.method].plan(ctx, config)
            if config.method == "prompt-swap":  # time the generation the swap stands for
                from interp.hooks import generate
                generate(model, plan.prompt, steps=ctx.steps, seed=ctx.seed)
            else:
                run_plan(model, ctx, plan)
            edit_times[config.label].append(time.perf_counter() - start)
    swap = statistics.median(edit_times["prompt-swap"])
    result = {"model": model_name, "threads": torch.get_num_threads(), "tasks": len(tasks), "k_trans": args.k_trans,
              "prepare_two_generations_s": statistics.median(prepare_times), "methods": {}}
    print(f"model {model_name}, {len(tasks)} tasks, k_trans={args.k_trans}, threads={torch.get_num_threads()}")
    width = max(38, *(len(label) for label in edit_times))
    print(f"{'prepare (two generations + capture)':{width}s} {statistics.median(prepare_times) * 1000:8.1f} ms")
    print(f"{'method':{width}s} {'ms/edit':>8s} {'edits/s':>8s} {'vs swap':>8s}")
    for label, times in edit_times.items():
        median = statistics.median(times)
        result["methods"][label] = {"median_s": median, "edits_per_s": 1 / median, "time_over_prompt_swap": median / swap}
        print(f"{label:{width}s} {median * 1000:8.1f} {1 / median:8.2f} {median / swap:8.2f}")
    # A whole benchmark pass per configuration: the two generations plus the edit, per task.
    for label in edit_times:
        result["methods"][label]["tasks_per_s_with_prepare"] = 1 / (result["methods"][label]["median_s"]
                                                                    + result["prepare_two_generations_s"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

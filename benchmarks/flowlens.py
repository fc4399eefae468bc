"""FlowLens analysis time against plain scikit-learn PCA on the same matrix, side by side in one run.

Synthetic residuals (N prompts, L layers, width d) with a few strong directions; the stacked
(N*L, d) matrix is the one both sides decompose.

- ``sklearn``: ``sklearn.decomposition.PCA(k).fit_transform(stacked)`` (the baseline);
- ``flowlens projections``: ``layer_projections(residuals, "stacked", k)`` (PCA + per-layer projections);
- ``flowlens low-rank``: the same with ``torch.svd_lowrank`` (what FlowLens uses for large d);
- ``flowlens full``: projections + concentration statistics of every layer (what ``analyze`` computes).

    python -m benchmarks.flowlens [--prompts 400] [--layers 16] [--width 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

# Run from anywhere; and this script's own name must not shadow the flowlens package.

import numpy as np


def timed_side_by_side(functions: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each function; the functions take turns so machine load hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            started = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="BLAS/torch threads for every side")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import torch
    from sklearn.decomposition import PCA

    from flowlens.geometry import concentration_by_layer, layer_projections, stacked

    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    # Same BLAS threads for all sides: on a shared machine, oversubscribed BLAS threads are 100x slower.
    threadpool_limits(args.threads)
    rng = np.random.default_rng(0)
    residuals = rng.normal(size=(args.prompts, args.layers, args.width))
    residuals[..., :4] *= [20.0, 10.0, 5.0, 3.0]
    matrix = stacked(residuals)

    rows = timed_side_by_side({
        "sklearn PCA": lambda: PCA(args.k).fit_transform(matrix),
        "flowlens projections": lambda: layer_projections(residuals, "stacked", args.k, "sklearn"),
        "flowlens low-rank": lambda: layer_projections(residuals, "stacked", args.k, "lowrank"),
        "flowlens full": lambda: (layer_projections(residuals, "stacked", args.k),
                                  concentration_by_layer(residuals, args.k)),
    }, args.repeats)
    baseline = rows["sklearn PCA"]
    print(f"stacked matrix {matrix.shape[0]} x {matrix.shape[1]} (N={args.prompts}, L={args.layers}), k={args.k}, "
          f"median of {args.repeats}, {args.threads} thread(s)")
    for name, seconds in rows.items():
        print(f"{name:>22}: {seconds:8.3f} s  ({seconds / baseline:5.2f}x sklearn PCA)")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"shape": list(matrix.shape), "k": args.k, "seconds": rows,
                       "ratio_to_sklearn": {k: v / baseline for k, v in rows.items()}}, handle, indent=2)


if __name__ == "__main__":
    main()

"""Every SAE trainer of this project, judged on planted features: sae-lens' synthetic data and its own eval.

    OMP_NUM_THREADS=2 python -m benchmarks.synthetic_trainers --samples 819200 --batch-size 512 --lr 2e-3 [--threads 2]
        [--out experiments/results/synthetic_trainers.json]

One synthetic dataset from sae-lens 6 (`sae_lens.synthetic.SyntheticModel`): `--features` planted unit directions
in `--d-in` dimensions (more features than dimensions: superposition), Zipfian firing probabilities, a hierarchy
of features (a child fires only with its parent; some siblings mutually exclusive), low-rank correlations between
features, noisy magnitudes and a bias, all from one seed. One stream of `--samples` activations is drawn from it
once, and every trainer of saes.trainers.TRAINERS (the SAEs; transcoders are not SAEs) trains on exactly those
batches, stepped in turn batch by batch as saes.train.train drives a trainer (so that load from other processes
hits all alike); samples/s is the stream over each trainer's own seconds in prepare + step (data in memory). The
sae-lens architectures (lens-topk, batchtopk, matryoshka, jumprelu, standard, gated) train through sae-lens' own
SAETrainer.step (saes.trainers.LensTrainer); topk and p-anneal are this project's own trainers.

Each trained SAE (and an untrained TopK SAE, the random baseline) is then scored by sae-lens' own
`eval_sae_on_synthetic_data` on the same `--eval-samples` fresh samples (the global seed is reset before each):
MCC (Hungarian-matched |cosine| between decoder rows and planted directions), uniqueness (distinct planted
features matched / latents), precision / recall / F1 / accuracy of each latent as a detector of its matched
feature, L0, dead latents, shrinkage and explained variance. Our inference `SAE` is passed as it is: the eval
only uses .eval(), .W_dec (d_sae, d_in), .encode and .decode, which it has with sae-lens' meaning.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

from saes.train import TrainConfig
from saes.trainers import TRAINERS, TRANSCODER_TRAINERS, LensTrainer, make_trainer

# Sparsity settings of the architectures without a k (their L0 follows a penalty): chosen once on this dataset
# so that their L0 lands near the planted L0; the table reports each SAE's L0 so the reader sees where it landed.
ARCHITECTURE_OPTIONS = {
    "standard": {"l1_coefficient": 1.0},
    "gated": {"l1_coefficient": 1.0},
    "jumprelu": {"l0_coefficient": 1.0},
    "p-anneal": {"initial_sparsity_penalty": 0.1},
}


def sae_trainers() -> list[str]:
    """Every registered SAE trainer (transcoders train on (input, output) pairs: not SAEs)."""
    return [name for name in TRAINERS if name not in TRANSCODER_TRAINERS]


def make_synthetic_model(d_in: int, n_features: int, seed: int):
    """sae-lens' synthetic model: hierarchy, correlations, Zipfian firing probabilities, noisy magnitudes."""
    from sae_lens.synthetic import (HierarchyConfig, LowRankCorrelationConfig, SyntheticModel,
                                    SyntheticModelConfig, ZipfianFiringProbabilityConfig)

    cfg = SyntheticModelConfig(
        num_features=n_features, hidden_dim=d_in, seed=seed,
        firing_probability=ZipfianFiringProbabilityConfig(exponent=0.5, max_prob=0.2, min_prob=0.01),
        hierarchy=HierarchyConfig(total_root_nodes=max(1, n_features // 16), branching_factor=(2, 4), max_depth=2,
                                  mutually_exclusive_portion=0.3, compensate_probabilities=True),
        correlation=LowRankCorrelationConfig(rank=8, correlation_scale=0.1, seed=seed),
        std_firing_magnitudes=0.1, mean_firing_magnitudes=1.0, bias=0.5)
    return SyntheticModel(cfg)


@torch.no_grad()
def draw_stream(model, n_samples: int, batch_size: int, seed: int) -> list[torch.Tensor]:
    """n_samples // batch_size batches of the model's hidden activations, drawn once (sae-lens' generator
    samples from torch's global RNG, so it is seeded here)."""
    torch.manual_seed(seed)
    return [model.sample(batch_size).float() for _ in range(n_samples // batch_size)]


def evaluate(sae, model, n_samples: int, seed: int) -> dict:
    """sae-lens' eval_sae_on_synthetic_data on the same n_samples fresh samples for every SAE."""
    from sae_lens.synthetic import eval_sae_on_synthetic_data

    torch.manual_seed(seed)
    result = eval_sae_on_synthetic_data(sae, model.feature_dict, model.activation_generator,
                                        num_samples=n_samples, batch_size=min(n_samples, 8192))
    return result.to_dict()


def train_interleaved(architectures: list[str], batches: list[torch.Tensor], *, d_sae: int, k: int, lr: float,
                      seed: int, options: dict[str, dict] | None = None, curve=None,
                      curve_every: int = 0, lrs: dict[str, float] | None = None) -> dict[str, tuple]:
    """Train every architecture on the same batches, step by step in turn (so that load from other processes
    hits all alike), each as saes.train.train drives its trainer: check_batch, prepare on the first batch, one
    step per batch, to_inference at the end (train()'s checkpoint and log files are left out: they are not the
    trainer's speed). Returns {name: (inference SAE, seconds in prepare + steps, median step seconds, curve)}:
    curve, every `curve_every` steps (0: none), is `curve(inference SAE)`'s dict with the step and samples seen,
    measured outside the timed seconds (the recovery curve that shows whether training has converged)."""
    from saes.train import check_batch

    d_in = batches[0].shape[1]
    total = sum(batch.shape[0] for batch in batches)
    trainers, seconds, steps, curves = {}, {}, {}, {}
    for name in architectures:
        config = TrainConfig(architecture=name, d_in=d_in, d_sae=d_sae, k=k, batch_size=batches[0].shape[0],
                             lr=(lrs or {}).get(name, lr), total_tokens=total, dead_after_tokens=max(1, total // 10), seed=seed,
                             options=dict((options or {}).get(name, {}))).validate()
        trainers[name], seconds[name], steps[name], curves[name] = make_trainer(config), 0.0, [], []
    for index, raw in enumerate(batches):
        batch = check_batch(raw, d_in, index)
        for name, trainer in trainers.items():
            started = time.perf_counter()
            if index == 0:
                trainer.prepare(batch)
            metrics = trainer.step(batch)
            spent = time.perf_counter() - started
            seconds[name] += spent
            steps[name].append(spent)
            if not all(map(math.isfinite, metrics.values())):
                raise RuntimeError(f"{name} diverged at step {index}: {metrics}")
            if curve is not None and curve_every and ((index + 1) % curve_every == 0 or index + 1 == len(batches)):
                point = curve(trainer.to_inference(architecture_trained=name))
                curves[name].append({"step": index + 1, "samples": (index + 1) * batch.shape[0],
                                     "train_mse_loss": metrics.get("mse_loss"), **point})
    return {name: (trainer.to_inference(architecture_trained=name), seconds[name], statistics.median(steps[name]),
                   curves[name]) for name, trainer in trainers.items()}


def random_sae(d_in: int, d_sae: int, k: int, seed: int, first_batch: torch.Tensor):
    """An untrained TopK SAE (random unit decoder rows, b_pre at the batch's median): the floor of every metric."""
    trainer = make_trainer(TrainConfig(d_in=d_in, d_sae=d_sae, k=k, seed=seed))
    trainer.prepare(first_batch)
    return trainer.to_inference()


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration, subprocess.SubprocessError):
        return platform.processor() or "unknown"


def run(*, d_in: int = 64, n_features: int = 256, d_sae: int = 256, k: int | None = None, samples: int = 1_000_000,
        batch_size: int = 1024, lr: float = 3e-4, eval_samples: int = 50_000, data_seed: int = 42, seed: int = 0,
        architectures: list[str] | None = None, options: dict[str, dict] | None = None, curve_every: int = 0,
        curve_samples: int = 10_000, lrs: dict[str, float] | None = None, log=print) -> dict:
    """The whole benchmark; returns the result dict (see the module docstring).

    data_seed (the planted dictionary and the stream) must differ from seed (the trainers' initialisation): the
    FeatureDictionary and our TopK / P-anneal decoders both start from torch.randn(n, d_in) under their seed, so
    with equal seeds and d_sae == n_features an untrained SAE would hold the planted directions exactly."""
    architectures = architectures or sae_trainers()
    options = ARCHITECTURE_OPTIONS if options is None else options
    for name in architectures:
        if name not in TRAINERS or name in TRANSCODER_TRAINERS:
            raise ValueError(f"unknown SAE trainer {name!r}; choose among {', '.join(sae_trainers())}")
    if set(lrs or {}) - set(architectures):
        raise ValueError(f"a learning rate for a trainer not run: {', '.join(sorted(set(lrs) - set(architectures)))}")
    if data_seed == seed:
        raise ValueError(f"data_seed must differ from seed (both {seed}): the planted dictionary and the untrained "
                         "decoders both start from torch.randn under their seed")
    model = make_synthetic_model(d_in, n_features, data_seed)
    torch.manual_seed(data_seed + 10)
    true_l0 = float((model.activation_generator.sample(20_000) > 0).sum(1).float().mean())
    k = k or max(1, round(true_l0))
    batches = draw_stream(model, samples, batch_size, data_seed + 1)
    n = len(batches) * batch_size
    log(f"planted: {n_features} features in d_in={d_in}, true L0 {true_l0:.2f}; SAEs d_sae={d_sae}, k={k}, "
        f"{n} samples in batches of {batch_size}, lr {lr}")
    rows = {"random (untrained topk)": {"architecture": "topk", "via": "-", "seconds": 0.0, "samples_per_s": None,
                                        "options": {}, **evaluate(random_sae(d_in, d_sae, k, seed, batches[0]), model,
                                                                  eval_samples, data_seed + 2)}}
    def curve(sae) -> dict:  # a smaller eval on its own fresh samples: MCC, F1, L0 and EV as training goes
        r = evaluate(sae, model, curve_samples, data_seed + 3)
        return {"mcc": r["mcc"], "f1": r["classification"]["f1_score"], "l0": r["sae_l0"],
                "explained_variance": r["explained_variance"], "dead_latents": r["dead_latents"]}

    trained = train_interleaved(architectures, batches, d_sae=d_sae, k=k, lr=lr, seed=seed, options=options,
                                curve=curve, curve_every=curve_every, lrs=lrs)
    for name, (sae, seconds, median_step, points) in trained.items():
        via = "sae-lens SAETrainer.step" if issubclass(TRAINERS[name], LensTrainer) else "ours"
        rows[name] = {"architecture": name, "via": via,
                      "seconds": seconds, "samples_per_s": n / seconds, "median_step_s": median_step,
                      "options": options.get(name, {}), **evaluate(sae, model, eval_samples, data_seed + 2),
                      "curve": points}
        r = rows[name]
        log(f"{name:12s} {r['samples_per_s']:9.0f} samples/s  MCC {r['mcc']:.3f}  uniq {r['uniqueness']:.3f}  "
            f"F1 {r['classification']['f1_score']:.3f}  L0 {r['sae_l0']:.1f}  EV {r['explained_variance']:.3f}")
    return {"benchmark": "synthetic_trainers",
            "dataset": {"generator": "sae_lens.synthetic.SyntheticModel", "config": model.cfg.to_dict(),
                        "true_l0": true_l0, "train_samples": n, "eval_samples": eval_samples},
            "settings": {"d_sae": d_sae, "k": k, "batch_size": batch_size, "lr": lr, "lrs": lrs or {}, "seed": seed,
                         "data_seed": data_seed, "dead_after_tokens": max(1, n // 10), "curve_every": curve_every,
                         "curve_samples": curve_samples},
            "timed": "each trainer's prepare (first batch) and step calls only: the stream is drawn before training, "
                     "held in memory and shared by every trainer; evals, curves and to_inference are not timed",
            "eval": "sae_lens.synthetic.eval_sae_on_synthetic_data",
            "rows": rows}


def table(result: dict) -> str:
    lines = ["| trainer | via | samples/s | median step ms | MCC | uniqueness | F1 | precision | recall | L0 | dead "
             "| shrinkage | EV |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in result["rows"].items():
        c = r["classification"]
        speed = f"{r['samples_per_s']:,.0f}" if r["samples_per_s"] else "-"
        step = f"{1e3 * r['median_step_s']:.1f}" if r.get("median_step_s") else "-"
        lines.append(f"| {name} | {r.get('via', '-')} | {speed} | {step} | {r['mcc']:.3f} | {r['uniqueness']:.3f} | "
                     f"{c['f1_score']:.3f} | {c['precision']:.3f} | {c['recall']:.3f} | {r['sae_l0']:.1f} | "
                     f"{r['dead_latents']} | {r['shrinkage']:.3f} | {r['explained_variance']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-in", type=int, default=64)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--d-sae", type=int, default=256)
    parser.add_argument("--k", type=int, default=None, help="default: the planted L0, rounded")
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--eval-samples", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0, help="the trainers' initialisation")
    parser.add_argument("--data-seed", type=int, default=42, help="the planted dictionary and the stream")
    parser.add_argument("--architectures", nargs="*", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--curve-every", type=int, default=0,
                        help="steps between points of the recovery curve (MCC on --curve-samples; 0: none)")
    parser.add_argument("--curve-samples", type=int, default=10_000)
    parser.add_argument("--lr-for", action="append", default=[], metavar="TRAINER=LR",
                        help="one trainer's own learning rate (default: --lr for all)")
    parser.add_argument("--out", default="experiments/results/synthetic_trainers.json")
    args = parser.parse_args()
    for name, value, low, high in (("--d-in", args.d_in, 2, 4096), ("--features", args.features, 2, 65536),
                                   ("--d-sae", args.d_sae, 2, 65536), ("--samples", args.samples, 1, 10**8),
                                   ("--batch-size", args.batch_size, 1, 65536),
                                   ("--eval-samples", args.eval_samples, 1, 10**7),
                                   ("--threads", args.threads, 1, 256), ("--curve-every", args.curve_every, 0, 10**6),
                                   ("--curve-samples", args.curve_samples, 1, 10**6)):
        if not low <= value <= high:
            parser.error(f"{name} must be in {low}..{high}, got {value}")
    if args.samples < args.batch_size:
        parser.error("--samples must hold at least one batch")
    torch.set_num_threads(args.threads)
    if args.k is not None and not 1 <= args.k <= args.d_sae:
        parser.error(f"--k must be in 1..--d-sae ({args.d_sae}), got {args.k}")
    lrs = {}
    for item in args.lr_for:
        name, _, value = item.partition("=")
        try:
            lrs[name] = float(value)
        except ValueError:
            parser.error(f"--lr-for takes TRAINER=LR, got {item!r}")
    if not all(0 < v < 1 for v in (args.lr, *lrs.values())):
        parser.error(f"learning rates must be in (0, 1), got {args.lr} and {lrs}")
    try:
        result = run(d_in=args.d_in, n_features=args.features, d_sae=args.d_sae, k=args.k, samples=args.samples,
                     batch_size=args.batch_size, lr=args.lr, eval_samples=args.eval_samples, seed=args.seed,
                     data_seed=args.data_seed, architectures=args.architectures, curve_every=args.curve_every,
                     curve_samples=args.curve_samples, lrs=lrs)
    except ValueError as err:  # an unknown trainer, equal seeds, a bad option: one line, nothing written
        parser.error(str(err))
    result.update({"cpu": cpu_model(), "threads": args.threads, "torch": torch.__version__,
                   "sae_lens": __import__("sae_lens").__version__,
                   "command": "python -m benchmarks.synthetic_trainers " + " ".join(
                       f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                       if v is not None and k not in ("out", "architectures", "lr_for"))
                   + "".join(f" --lr-for {item}" for item in args.lr_for)
                   + (" --architectures " + " ".join(args.architectures) if args.architectures else "")})
    print(table(result))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

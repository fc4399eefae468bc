"""Reconstruction metrics of an SAE over an activation stream.

explained_variance = 1 - FVU = 1 - sum ||x - x_hat||^2 / sum ||x - mean(x)||^2 over the whole
stream; l0 = mean number of active latents per vector; dead = features that never fired;
dense = features firing on more than `dense_threshold` of the vectors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch

from interp.cli import MIXED_DEFAULT, add_backend_argument, add_dtype_argument, add_out_argument, at_least, dtype_name

from .pool import load_model, model_block
from .sae import SAE


@torch.no_grad()
def evaluate(sae: SAE, batches: Iterable[torch.Tensor], max_tokens: int | None = None,
             dense_threshold: float = 0.1) -> dict:
    """batches: (batch, d_in) tensors. Returns plain numbers plus per-feature firing frequency."""
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    d_in, d_sae = sae.cfg.d_in, sae.cfg.d_sae
    total = torch.zeros(d_in, dtype=torch.float64)
    total_sq = torch.zeros(d_in, dtype=torch.float64)
    error_sq = torch.zeros((), dtype=torch.float64)
    fire_counts = torch.zeros(d_sae, dtype=torch.float64)
    activation_sum = torch.zeros(d_sae, dtype=torch.float64)
    active_total, n = 0, 0
    for batch in batches:
        if batch.ndim != 2 or batch.shape[1] != d_in:
            raise ValueError(f"activations have shape {tuple(batch.shape)}, the SAE expects (batch, {d_in})")
        batch = batch.float()
        if not torch.isfinite(batch).all():
            raise ValueError("activations contain NaN or Inf values")
        latents = sae.encode(batch)
        reconstruction = sae.decode(latents)
        if not torch.isfinite(reconstruction).all():
            raise ValueError(f"the SAE's reconstruction holds NaN or Inf after {n} vectors: its weights overflow on "
                             "these activations (a diverged SAE); retrain it with a lower learning rate")
        active = latents > 0
        total += batch.sum(0).double()
        total_sq += batch.double().pow(2).sum(0)
        error_sq += (reconstruction - batch).double().pow(2).sum()
        fire_counts += active.sum(0).double()
        activation_sum += latents.sum(0).double()
        active_total += int(active.sum())
        n += batch.shape[0]
        if max_tokens is not None and n >= max_tokens:
            break
    if n == 0:
        raise ValueError("the activation stream is empty")
    variance_sum = float((total_sq - total.pow(2) / n).sum())
    frequency = fire_counts / n
    return {
        "tokens": n,
        "explained_variance": 1.0 - float(error_sq) / max(variance_sum, 1e-12),
        "mse": float(error_sq) / (n * d_in),
        "l0": active_total / n,
        "dead_features": int((fire_counts == 0).sum()),
        "dead_fraction": float((fire_counts == 0).double().mean()),
        "dense_features": int((frequency > dense_threshold).sum()),
        "dense_threshold": dense_threshold,
        "d_sae": d_sae,
        "feature_frequency": frequency.float().tolist(),
        "feature_mean_activation": (activation_sum / fire_counts.clamp_min(1)).float().tolist(),
    }


def markdown_table(rows: dict[str, dict]) -> str:
    """rows: name (block or SAE) -> evaluate() result -> a markdown table of the headline numbers."""
    lines = ["| SAE | tokens | explained variance | L0 | dead | dense |", "|---|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['tokens']} | {r['explained_variance']:.3f} | {r['l0']:.2f} | "
                     f"{r['dead_features']} ({100 * r['dead_fraction']:.1f}%) | {r['dense_features']} |")
    return "\n".join(lines) + "\n"


def default_eval_path(sae_dir, overwrite: bool = False) -> Path:
    """Where ``saes eval`` writes without --out: ``<sae_dir>/eval.json`` for the user's own SAE; for a shipped one
    (which is never rewritten by default), ``runs/eval/<its path under the shipped root>/eval.json`` in the working
    directory, so evaluating ``saes/pretrained/toy/mid_block.attentions.0`` leaves the shipped eval.json as it is
    (``overwrite``: into the shipped directory, on purpose)."""
    from interp.shipped import shipped_root

    sae_dir = Path(sae_dir).resolve()
    root = shipped_root(sae_dir)
    if root is None or overwrite:
        return sae_dir / "eval.json"
    return Path("runs") / "eval" / root.name / sae_dir.relative_to(root) / "eval.json"


def write_eval(sae_dir, out, result: dict, table: str, overwrite: bool = False) -> Path:
    """``saes eval``'s outputs: strict JSON at ``out`` (default: `default_eval_path`) and the table beside it
    (``.md``); prints the table and where both went."""
    from interp.atomic import atomic_write_text

    from .strict_json import write_json

    out = Path(out or default_eval_path(sae_dir, overwrite))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    atomic_write_text(out.with_suffix(".md"), table)
    print(table, end="")
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return out


def add_eval_arguments(parser) -> None:
    """`saes eval`: where the activations come from (a store, or --world N generations), splice fidelity, and for a
    language model's SAE the held-out --text."""
    parser.add_argument("--sae", required=True, help="SAE directory (cfg.json + sae_weights.safetensors)")
    parser.add_argument("--store", default=None, help="activation store to measure on")
    parser.add_argument("--world", type=at_least(1), default=None, metavar="N",
                        help="instead of a store: N fresh generations of shapes-world captions (needs --model)")
    parser.add_argument("--world-seed", type=int, default=1, help="seed of the --world captions")
    parser.add_argument("--seed", type=int, default=0, help="image i is generated with seed + i (--world)")
    parser.add_argument("--model", default=None, help="toy, sdxl-turbo, ... : also measure splice-in fidelity")
    parser.add_argument("--fidelity-images", type=at_least(0), default=32, help="images generated for splice fidelity")
    parser.add_argument("--steps", type=int, default=None,
                        help="denoising steps (default: the store's, else the model's)")
    parser.add_argument("--guidance", type=float, default=None, help="classifier-free guidance (default: the model's)")
    parser.add_argument("--block", default=None, help="default: the block the SAE was trained on")
    parser.add_argument("--tokens", type=at_least(1), default=None, help="evaluate on at most this many vectors")
    parser.add_argument("--batch-size", type=at_least(1), default=4096)
    parser.add_argument("--threads", type=at_least(1), default=1)
    parser.add_argument("--text", default=None, help="language models (with --model toy-chat, ...): held-out text "
                                                     "(JSONL or plain) for CE loss clean / SAE spliced / zero-ablated, "
                                                     "loss recovered and KL; --tokens caps the scored tokens")
    parser.add_argument("--context", type=at_least(3), default=128, help="--text: tokens per sequence")
    parser.add_argument("--sequences-per-batch", type=at_least(1), default=8, help="--text: sequences per forward pass")
    add_backend_argument(parser, what="--text: ")
    add_dtype_argument(parser, default=None, said=MIXED_DEFAULT)
    add_out_argument(parser, default=None, help="JSON path (default: SAE_DIR/eval.json, or for a shipped SAE "
                                                    "runs/eval/<its path>/eval.json; .md beside it)")


def image_eval_command(args) -> int:
    """`saes eval` for an SAE on a text-to-image model's block: EV, L0 and dead features on a store or --world N
    generations, and with --model splice fidelity (`saes.lm_eval`'s `eval_command` sends a language model's SAE to
    `lm_eval_command`)."""
    from .train import open_store

    sae = SAE.load(args.sae)
    block = args.block or sae.cfg.metadata.get("hook_name")
    if not block:
        raise ValueError("the SAE does not name its block; pass --block")
    if args.store is None and args.world is None:
        raise ValueError("give the activations to evaluate on: --store DIR or --world N (with --model)")
    if args.store is None and args.model is None:
        raise ValueError("--world generates fresh images: it needs --model")
    model = load_model(args) if args.model else None
    if args.store is not None:
        store, store_block = open_store(args.store, block)
        batches = store.batches(store_block, batch_size=args.batch_size, shuffle=False)
        prompts, seeds = store.prompts, list(store.manifest["seeds"])
        if args.steps is None:
            args.steps = int(store.manifest["steps"])
    else:
        from interp.ground_truth import world

        from .pool import generate_pool

        prompts = world("shapes").prompts(args.world, args.world_seed)  # --world N: the shapes world's captions
        seeds = [args.seed + i for i in range(args.world)]
        updates = generate_pool(model, [model_block(model, block)], prompts, seeds, steps=args.steps).updates
        vectors = next(iter(updates.values())).permute(0, 2, 3, 1).reshape(-1, sae.cfg.d_in)
        batches = vectors.split(args.batch_size)
    result = evaluate(sae, batches, max_tokens=args.tokens)
    result.update(sae=str(args.sae), block=block)
    if model is not None:
        result["model_dtype"] = dtype_name(model.denoiser.dtype)
    table = markdown_table({block: result})
    if model is not None and args.fidelity_images > 0:
        from .fidelity import fidelity_table, splice_fidelity

        n = min(args.fidelity_images, len(prompts))
        result["splice_fidelity"] = splice_fidelity(model, sae, model_block(model, block), prompts[:n], seeds[:n],
                                                    steps=args.steps, progress=True)
        table += "\n" + fidelity_table({block: result["splice_fidelity"]})
    write_eval(args.sae, args.out, result, table, overwrite=args.overwrite)
    return 0

"""python -m saes {train,eval,import-sdxl} ...

    python -m saes train --store runs/store --block unet.mid_block.attentions.0 --out runs/sae/mid
    python -m saes eval --sae runs/sae/mid --store runs/store --block unet.mid_block.attentions.0
    python -m saes import-sdxl --checkpoint down.2.1_k10_hidden5120_auxk256_bs4096_lr0.0001/final --out runs/sae/down21
    torchrun --nproc-per-node 2 -m saes train ...      (data-parallel; each rank reads its own share)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path


def _open_store(path: str, block: str):
    from interp.store import ActivationStore  # written by interp; imported only when a store is used

    store = ActivationStore(path)
    if block not in store.blocks:
        raise ValueError(f"block {block!r} is not in the store at {path}; it has: {', '.join(store.blocks)}")
    return store


def _channels(store, block: str) -> int:
    """The block's channel count: from the store's manifest if it says, else from a first batch."""
    if hasattr(store, "channels"):
        return int(store.channels(block))
    first = next(iter(store.batches(block, batch_size=2, shuffle=False)), None)
    if first is None:
        raise ValueError(f"block {block!r} of the store holds no activations")
    return int(first.shape[1])


def _parse_options(pairs: list[str]) -> dict:
    options = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--option expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _train(args) -> int:
    import torch
    import torch.distributed as dist

    from .train import TrainConfig, train

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.set_num_threads(args.threads)
    store = _open_store(args.store, args.block)
    config = TrainConfig(architecture=args.architecture, d_in=_channels(store, args.block), d_sae=args.d_sae, k=args.k,
                         batch_size=args.batch_size, lr=args.lr, total_tokens=args.tokens,
                         dead_after_tokens=args.dead_after_tokens, options=_parse_options(args.option),
                         log_every_steps=args.log_every, checkpoint_every_steps=args.checkpoint_every,
                         seed=args.seed, metadata={"hook_name": args.block, "store": str(args.store)}).validate()

    def stream():
        """Epochs of shuffled batches, for as long as training asks; rank r takes every world-th batch.
        Under DDP only full batches are used, so that every rank counts the same tokens per step."""
        for epoch in itertools.count():
            batches = store.batches(args.block, batch_size=args.batch_size, shuffle=True, seed=args.seed + epoch)
            if world > 1:
                batches = (batch for batch in batches if len(batch) == args.batch_size)
            yielded = 0
            for batch in itertools.islice(batches, rank, None, world):
                yielded += 1
                yield batch
            if yielded == 0:
                raise ValueError(f"block {args.block!r} of the store has too few vectors for one batch of "
                                 f"{args.batch_size} per process; lower --batch-size")

    train(config, stream(), args.out, resume=not args.restart)
    if rank == 0:
        print(f"wrote {args.out} ({config.architecture}, d_in={config.d_in}, d_sae={config.d_sae})")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def _eval(args) -> int:
    from .evaluate import evaluate, markdown_table
    from .sae import SAE

    sae = SAE.load(args.sae)
    block = args.block or sae.cfg.metadata.get("hook_name")
    if not block:
        raise ValueError("the SAE does not name its block; pass --block")
    store = _open_store(args.store, block)
    result = evaluate(sae, store.batches(block, batch_size=args.batch_size, shuffle=False), max_tokens=args.tokens)
    result.update(sae=str(args.sae), block=block)
    out = Path(args.out or Path(args.sae) / "eval.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    table = markdown_table({block: result})
    out.with_suffix(".md").write_text(table)
    print(table, end="")
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


def _import_sdxl(args) -> int:
    from .importers import import_openai_topk

    metadata = {"hook_name": args.block} if args.block else {}
    sae = import_openai_topk(args.checkpoint, k=args.k, **metadata)
    sae.save(args.out)
    print(f"wrote {args.out} (topk, d_in={sae.cfg.d_in}, d_sae={sae.cfg.d_sae}, k={sae.cfg.k})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m saes", description="Train, evaluate and import SAEs.")
    commands = parser.add_subparsers(dest="command", required=True)

    tr = commands.add_parser("train", help="train an SAE on one block of an activation store (resumable)")
    tr.add_argument("--store", required=True, help="activation store directory (python -m interp collect)")
    tr.add_argument("--block", required=True, help="block name, e.g. unet.mid_block.attentions.0")
    tr.add_argument("--out", required=True, help="output directory: SAE, checkpoint, train_log.jsonl")
    tr.add_argument("--architecture", default="topk",
                    help="topk (ours, fast), or sae-lens': batchtopk, jumprelu, standard, lens-topk")
    tr.add_argument("--d-sae", type=int, default=5120)
    tr.add_argument("--k", type=int, default=10)
    tr.add_argument("--batch-size", type=int, default=4096)
    tr.add_argument("--lr", type=float, default=1e-4)
    tr.add_argument("--tokens", type=int, default=20_000_000, help="training vectors in total")
    tr.add_argument("--dead-after-tokens", type=int, default=10_000_000)
    tr.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="architecture option, e.g. aux_k=256 or l1_coefficient=5")
    tr.add_argument("--log-every", type=int, default=10, help="steps between log lines")
    tr.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1) // int(os.environ.get("WORLD_SIZE", "1"))))
    tr.add_argument("--restart", action="store_true", help="ignore an existing checkpoint in --out")
    tr.set_defaults(run=_train)

    ev = commands.add_parser("eval", help="explained variance, L0, dead and dense features (JSON + markdown)")
    ev.add_argument("--sae", required=True, help="SAE directory (cfg.json + sae_weights.safetensors)")
    ev.add_argument("--store", required=True)
    ev.add_argument("--block", default=None, help="default: the block the SAE was trained on")
    ev.add_argument("--tokens", type=int, default=None, help="evaluate on at most this many vectors")
    ev.add_argument("--batch-size", type=int, default=4096)
    ev.add_argument("--out", default=None, help="JSON path (default: SAE_DIR/eval.json; .md beside it)")
    ev.set_defaults(run=_eval)

    im = commands.add_parser("import-sdxl", help="convert a published SDXL Turbo SAE (state_dict.pth) to sae-lens format")
    im.add_argument("--checkpoint", required=True, help="state_dict.pth or its directory (with mean.pt / std.pt)")
    im.add_argument("--out", required=True)
    im.add_argument("--block", default=None, help="block name to record, e.g. unet.down_blocks.2.attentions.1")
    im.add_argument("--k", type=int, default=None, help="default: config.json beside it, else 10")
    im.set_defaults(run=_import_sdxl)

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError, NotADirectoryError, PermissionError, OSError, ImportError,
            FloatingPointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""python -m saes {train,eval,features,causal,report,probe,export,import-sdxl,bench} ...

    python -m saes train --store runs/store --block unet.mid_block.attentions.0 --out runs/sae/mid
    python -m saes eval --sae runs/sae/mid --store runs/store --block unet.mid_block.attentions.0
    python -m saes eval --sae runs/sae/mid --world 64 --model toy          (+ splice-in fidelity)
    python -m saes eval --sae runs/sae/l2 --model toy-chat --text heldout.jsonl --tokens 20000   (LM: CE, KL)
    python -m saes features --model toy --sae saes/pretrained/toy --world 400 --out runs/features
    python -m saes features --sae runs/lm-sae/blocks.2.hook_resid_post --model toy-chat --text corpus.jsonl  (LM)
    python -m saes causal --model toy --sae runs/toy-saes --scenes 24       (causal label scores into the cards)
    python -m saes report --model toy --root saes/pretrained/toy --features-summary runs/features/features_summary.json
    python -m saes export --sae saes/pretrained/smollm2/blocks.15.hook_resid_post --format saedashboard --out runs/np
    python -m saes bench --sae saes/pretrained/toy-chat/blocks.1.hook_resid_post --model toy-chat --evals core
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

import zoo  # noqa: F401 - registers the embedded models and worlds with the core (interp.embedded)

from interp.cli import parse_options as _parse_options
from interp.cli import (MIXED_DEFAULT, add_backend_argument, add_dtype_argument, at_least, probability, run_command,
                        t2i_dtype)
from interp.shipped import add_overwrite_options


STORE_POOL_IMAGES = 400  # `saes features --store` without --images: the pool's size


def _open_store(path: str, block: str):
    """(the store, the block's name in it): the store names blocks as the model does, without `unet.`."""
    from interp.store import ActivationStore  # written by interp; imported only when a store is used

    store = ActivationStore(path)
    name = block.removeprefix("unet.")
    if name not in store.blocks:
        raise ValueError(f"block {block!r} is not in the store at {path}; it has: {', '.join(store.blocks)}")
    return store, name


def _channels(store, block: str) -> int:
    """The block's channel count: from the store's manifest if it says, else from a first batch."""
    if hasattr(store, "channels"):
        return int(store.channels(block))
    first = next(iter(store.batches(block, batch_size=2, shuffle=False)), None)
    if first is None:
        raise ValueError(f"block {block!r} of the store holds no activations")
    return int(first.shape[1])


def _store_metadata(store, block: str, path: str) -> dict:
    """The SAE's metadata: its hook and sae-lens' model_name (the store's model); for a language-model store also
    context_size, prepend_bos and dataset_path, so that sae-lens and TransformerLens users can attach it."""
    from interp.names import LM

    metadata = {"hook_name": block, "store": str(path)}
    if store.manifest.get("model"):  # which model the SAE reads: the SAE is refused with any other
        metadata["model_name"] = store.manifest["model"]
    if getattr(store, "kind", None) == LM:
        manifest = store.manifest
        metadata.update(model_name=manifest["model"], context_size=int(manifest["context"]), prepend_bos=True,
                        dataset_path=manifest["text"])
    return metadata


def _add_train_arguments(parser) -> None:
    """`saes train`: the store and block, the architecture and its sizes, the schedule, resuming."""
    parser.add_argument("--store", required=True, help="activation store directory (python -m interp collect)")
    parser.add_argument("--block", required=True, help="block name, e.g. unet.mid_block.attentions.0")
    parser.add_argument("--out", required=True, help="output directory: SAE, checkpoint, train_log.jsonl")
    parser.add_argument("--architecture", default="topk",
                        help="topk or p-anneal (ours), or sae-lens': batchtopk, matryoshka, jumprelu, standard, gated, "
                             "lens-topk; transcoders (with --target-block): topk-transcoder, batchtopk-transcoder")
    parser.add_argument("--target-block", default=None,
                        help="transcoders: the block they write (blocks.L.mlp.hook_out; --block is then the MLP's "
                             "input blocks.L.mlp.hook_in), from the same store")
    parser.add_argument("--d-sae", type=int, default=5120)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--tokens", type=int, default=20_000_000, help="training vectors in total")
    parser.add_argument("--dead-after-tokens", type=int, default=10_000_000)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="architecture option, e.g. aux_k=256, l1_coefficient=5 or matryoshka_widths=[32,128,256]")
    parser.add_argument("--log-every", type=int, default=10, help="steps between log lines")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--autocast", action="store_true",
                        help="topk: the dense encoder product in bfloat16 (about 1.5x faster a step on a CPU with AMX, "
                             "the same EV; it only chooses the k latents, whose values and gradients stay float32)")
    parser.add_argument("--threads", type=at_least(1),
                        default=max(1, (os.cpu_count() or 1) // int(os.environ.get("WORLD_SIZE", "1"))))
    parser.add_argument("--restart", action="store_true", help="ignore an existing checkpoint in --out")
    parser.add_argument("--shard-latents", action="store_true",
                        help="topk under torchrun: each process holds d_sae / world latents (exact global top k); "
                             "checkpoints hold the whole SAE (docs/distributed.md)")


def _train(args) -> int:
    import torch
    import torch.distributed as dist

    from .train import TrainConfig, train

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        from interp.distributed import init_process_group

        init_process_group()
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.set_num_threads(args.threads)
    from .trainers import TRANSCODER_TRAINERS

    store, block = _open_store(args.store, args.block)
    target = None
    if (args.target_block is None) != (args.architecture not in TRANSCODER_TRAINERS):
        raise ValueError(f"--target-block goes with a transcoder architecture ({', '.join(TRANSCODER_TRAINERS)}) "
                         "and a transcoder architecture needs it")
    metadata = _store_metadata(store, block, args.store)
    if args.target_block is not None:
        target = _open_store(args.store, args.target_block)[1]
        metadata["hook_name_out"] = target
    config = TrainConfig(architecture=args.architecture, d_in=_channels(store, block),
                         d_out=_channels(store, target) if target else 0, d_sae=args.d_sae, k=args.k,
                         batch_size=args.batch_size, lr=args.lr, total_tokens=args.tokens,
                         dead_after_tokens=args.dead_after_tokens, options=_parse_options(args.option),
                         log_every_steps=args.log_every, checkpoint_every_steps=args.checkpoint_every,
                         seed=args.seed, metadata=metadata, autocast=args.autocast,
                         shard_latents=args.shard_latents).validate()

    def stream():
        """Epochs of shuffled batches, for as long as training asks; rank r takes every world-th batch.
        Under DDP only full batches are used, so that every rank counts the same tokens per step."""
        for epoch in itertools.count():
            batches = store.batches(block, batch_size=args.batch_size, shuffle=True, seed=args.seed + epoch,
                                    paired=target)
            if world > 1:
                batches = (batch for batch in batches if len(batch) == args.batch_size)
            yielded = 0
            for batch in itertools.islice(batches, rank, None, world):
                yielded += 1
                yield batch
            if yielded == 0:
                raise ValueError(f"block {block!r} of the store has too few vectors for one batch of "
                                 f"{args.batch_size} per process; lower --batch-size")

    train(config, stream(), args.out, resume=not args.restart)
    if rank == 0:
        print(f"wrote {args.out} ({config.architecture}, d_in={config.d_in}, d_sae={config.d_sae})")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def _add_eval_arguments(parser) -> None:
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
    parser.add_argument("--out", default=None, help="JSON path (default: SAE_DIR/eval.json, or for a shipped SAE "
                                                    "runs/eval/<its path>/eval.json; .md beside it)")


def _eval(args) -> int:
    from .evaluate import evaluate, markdown_table, write_eval
    from .sae import SAE

    from .lm_eval import lm_eval_command, wants_lm_eval

    if wants_lm_eval(args):  # a language model's SAE: splice loss on --text, EV on an LM store
        return lm_eval_command(args)
    sae = SAE.load(args.sae)
    block = args.block or sae.cfg.metadata.get("hook_name")
    if not block:
        raise ValueError("the SAE does not name its block; pass --block")
    if args.store is None and args.world is None:
        raise ValueError("give the activations to evaluate on: --store DIR or --world N (with --model)")
    if args.store is None and args.model is None:
        raise ValueError("--world generates fresh images: it needs --model")
    model = _load_model(args) if args.model else None
    if args.store is not None:
        store, store_block = _open_store(args.store, block)
        batches = store.batches(store_block, batch_size=args.batch_size, shuffle=False)
        prompts, seeds = store.prompts, list(store.manifest["seeds"])
        if args.steps is None:
            args.steps = int(store.manifest["steps"])
    else:
        from interp.ground_truth import world

        from .pool import generate_pool

        prompts = world("shapes").prompts(args.world, args.world_seed)  # --world N: the shapes world's captions
        seeds = [args.seed + i for i in range(args.world)]
        updates = generate_pool(model, [_model_block(model, block)], prompts, seeds, steps=args.steps).updates
        vectors = next(iter(updates.values())).permute(0, 2, 3, 1).reshape(-1, sae.cfg.d_in)
        batches = vectors.split(args.batch_size)
    result = evaluate(sae, batches, max_tokens=args.tokens)
    result.update(sae=str(args.sae), block=block)
    if model is not None:
        from interp.cli import dtype_name

        result["model_dtype"] = dtype_name(model.denoiser.dtype)
    table = markdown_table({block: result})
    if model is not None and args.fidelity_images > 0:
        from .fidelity import fidelity_table, splice_fidelity

        n = min(args.fidelity_images, len(prompts))
        result["splice_fidelity"] = splice_fidelity(model, sae, _model_block(model, block), prompts[:n], seeds[:n],
                                                    steps=args.steps, progress=True)
        table += "\n" + fidelity_table({block: result["splice_fidelity"]})
    write_eval(args.sae, args.out, result, table, overwrite=args.overwrite)
    return 0


def _load_model(args):
    import torch

    from interp.models import load_t2i

    torch.set_num_threads(args.threads)
    model = load_t2i(args.model, device=getattr(args, "device", None), dtype=t2i_dtype(getattr(args, "dtype", None)))
    # --steps / --guidance replace the model's defaults for every generation of the command
    # (a pipeline outside the known names defaults to its pipeline class's own steps and guidance).
    if getattr(args, "steps", None) is not None:
        model.check_request(args.steps)
        model.default_steps = args.steps
    if getattr(args, "guidance", None) is not None:
        model.default_guidance = float(args.guidance)
    return model


def _model_block(model, block: str) -> str:
    """The block's name in the model (`unet.` prefix dropped), or a clear error."""
    name = block[len("unet."):] if block.startswith("unet.") else block
    if name in getattr(model, "text_sites", {}):
        raise ValueError(f"{name} is a text stream (tokens, no image grid): feature cards, heatmaps and splice "
                         f"fidelity read a block's image grid; train and evaluate its SAE on a store "
                         f"(saes train / saes eval --store)")
    if name not in model.blocks:
        raise ValueError(f"{model.name} has no block {block!r}; its blocks are: {', '.join(model.blocks)}")
    return name


def _sae_dirs(paths: list[str]) -> list[Path]:
    """SAE directories: each path is one (cfg.json inside) or holds one per block."""
    from .sae import CFG_FILENAME

    dirs = []
    for path in map(Path, paths):
        if (path / CFG_FILENAME).is_file():
            dirs.append(path)
        elif path.is_dir() and any(path.glob(f"*/{CFG_FILENAME}")):
            dirs.extend(sorted(p.parent for p in path.glob(f"*/{CFG_FILENAME}")))
        else:
            raise ValueError(f"{path} is not an SAE directory (no {CFG_FILENAME}) nor a directory of them")
    return dirs


def _add_features_arguments(parser) -> None:
    """`saes features`: the SAEs, the analysis images (a store or --world N generations), the cards' options, and
    for a language model's SAEs the --text corpus."""
    parser.add_argument("--model", default="toy", help="the model the SAEs belong to (images are generated with it)")
    parser.add_argument("--sae", required=True, nargs="+",
                        help="SAE directories, or a directory with one SAE per block (e.g. saes/pretrained/toy)")
    parser.add_argument("--store", default=None, help="analyse the first --images images of this activation store")
    parser.add_argument("--world", type=int, default=None, metavar="N", help="analyse N fresh shapes-world images")
    parser.add_argument("--world-seed", type=int, default=1, help="seed of the --world captions")
    parser.add_argument("--seed", type=int, default=0, help="image i is generated with seed + i (--world)")
    parser.add_argument("--images", type=at_least(1), default=None,
                        help=f"with --store: how many of its images (default: {STORE_POOL_IMAGES}, or all it holds if "
                             f"fewer)")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    parser.add_argument("--guidance", type=float, default=None, help="classifier-free guidance (default: the model's)")
    parser.add_argument("--top", type=int, default=6, help="top-activating images per feature")
    parser.add_argument("--label-min-auroc", type=probability, default=0.7, help="AUROC a label needs (0 to 1)")
    parser.add_argument("--pool-dir", default=None, help="where the image pool goes (default: parent of the first SAE)")
    parser.add_argument("--model-name", default=None, help="the model's name in features.json (default: --model)")
    parser.add_argument("--overwrite", action="store_true",
                        help="rewrite files shipped with the repository (saes/pretrained/...) and replace an image "
                             "pool that other blocks' cards point into; without it either is an error")
    add_dtype_argument(parser, default=None, said=MIXED_DEFAULT)
    parser.add_argument("--threads", type=at_least(1), default=1)
    parser.add_argument("--out", default=None, help="directory for features.html and features_summary.json (LM "
                                                    "SAEs: for features.json and features.html; default: the SAE's)")
    parser.add_argument("--text", default=None, help="SAEs on a language model's residual stream: the corpus (JSONL "
                                                     "with Dolly's or text fields, or plain text lines)")
    parser.add_argument("--tokens", type=at_least(1), default=20_000, help="--text: corpus tokens analysed")
    add_backend_argument(parser, what="--text: ")


def _features(args) -> int:
    from interp.shipped import refuse_shipped

    from .features import ANALYSE_ELSEWHERE, analyse, default_pool_dir
    from interp.models.spec import LM, saved_kind

    from .lm_features import lm_features_command
    from .pool import generate_pool, store_pool
    from .probes import AnalysisConfig
    from .sae import SAE, check_sae_model

    if args.text is not None or any(saved_kind(path) == LM for path in args.sae):  # LM SAEs: cards over text
        return lm_features_command(args)
    if args.out is None:
        raise ValueError("give --out DIR, where features.html and features_summary.json go")
    if (args.store is None) == (args.world is None):
        raise ValueError("give exactly one source of analysis images: --store DIR or --world N")
    if args.world is not None and args.world < 1:
        raise ValueError("the number of analysis images must be at least 1")
    if args.top < 1:
        raise ValueError("--top must be at least 1")
    sae_dirs = _sae_dirs(args.sae)
    if not args.overwrite:  # before any image is generated; analyse checks the rest before writing
        refuse_shipped(sae_dirs + [args.pool_dir or default_pool_dir(sae_dirs), args.out], "saes features",
                       ANALYSE_ELSEWHERE)
    model = _load_model(args)
    saes = {}
    for directory in sae_dirs:
        sae = SAE.load(directory)
        check_sae_model({directory.name: sae}, args.model, directory)  # cards of toy-v2's SAEs on toy mean nothing
        block = sae.cfg.metadata.get("hook_name") or directory.name
        block = _model_block(model, block)
        if sae.cfg.d_in != model.blocks[block].channels:
            raise ValueError(f"the SAE in {directory} reads {sae.cfg.d_in} channels but {block} has "
                             f"{model.blocks[block].channels}")
        if block in saes:
            raise ValueError(f"two SAEs given for {block}: {saes[block][1]} and {directory}")
        saes[block] = (sae, directory)
    if args.store is not None:
        from interp.store import ActivationStore

        store = ActivationStore(args.store)
        missing = [b for b in saes if b not in store.blocks]
        if missing:
            raise ValueError(f"the store at {args.store} lacks {', '.join(missing)}; it has: {', '.join(store.blocks)}")
        if args.images is not None and args.images > len(store):
            raise ValueError(f"--images {args.images}: the store at {args.store} holds {len(store)} images; "
                             f"give at most {len(store)}")
        pool = store_pool(model, store, list(saes), args.images or min(STORE_POOL_IMAGES, len(store)))
    else:
        from interp.ground_truth import world

        from .probes import check_block_grid

        for block in saes:  # the cards label by the world's cells: a block too coarse for them, before any image
            check_block_grid(block, model.blocks[block].height, model.blocks[block].width, world("shapes"))
        prompts = world("shapes").prompts(args.world, args.world_seed)  # --world N: the shapes world's captions
        pool = generate_pool(model, list(saes), prompts, [args.seed + i for i in range(args.world)],
                             steps=args.steps)
    config = AnalysisConfig(n_top_images=args.top, label_min_auroc=args.label_min_auroc)
    summary = analyse(saes, pool, args.model_name or args.model, args.out, config, pool_dir=args.pool_dir,
                      overwrite=args.overwrite)
    for block, entry in summary["blocks"].items():
        print(f"{block}: {entry['live_features']} of {entry['features']} features fire on the pool, "
              f"{entry['labelled_features']} labelled (AUROC >= {args.label_min_auroc})")
    print(f"wrote features.json beside each SAE, the image pool, {Path(args.out) / 'features.html'} and "
          f"{Path(args.out) / 'features_summary.json'}")
    return 0


def _causal(args) -> int:
    from .causal import causal_command

    return causal_command(args, _load_model)


def _add_report_arguments(parser) -> None:
    """`saes report`: the SAEs under --root, the fresh generations they are measured on, the feature analysis."""
    parser.add_argument("--model", default="toy")
    parser.add_argument("--root", required=True, help="directory with one SAE per block (e.g. saes/pretrained/toy)")
    parser.add_argument("--features-summary", default=None, help="features_summary.json of `python -m saes features`")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    parser.add_argument("--guidance", type=float, default=None, help="classifier-free guidance (default: the model's)")
    parser.add_argument("--store", default=None, help="the training activation store: dead features over all of it")
    parser.add_argument("--eval-images", type=int, default=500, help="fresh images for EV, L0, dead features")
    parser.add_argument("--fidelity-images", type=int, default=64, help="images for splice fidelity")
    parser.add_argument("--world-seed", type=int, default=2, help="seed of the fresh captions")
    parser.add_argument("--seed", type=int, default=100_000, help="image i is generated with seed + i")
    parser.add_argument("--notes-file", default=None, help="markdown appended to REPORT.md as its Notes section")
    parser.add_argument("--model-name", default=None, help="the model's name in the report (default: --model)")
    add_dtype_argument(parser, default=None)
    parser.add_argument("--threads", type=at_least(1), default=1)
    parser.add_argument("--out", default=None, help="default: --root")
    parser.add_argument("--overwrite", action="store_true",
                        help="rewrite REPORT.md and report.json shipped with the repository (saes/pretrained/...)")


def _report(args) -> int:
    from interp.shipped import refuse_shipped

    from .report import build_report, write_report

    if not args.overwrite:
        refuse_shipped([args.out or args.root], "saes report", "pass --out DIR to write the report elsewhere")
    model = _load_model(args)
    if args.model_name:
        model.name = args.model_name
    summary = json.loads(Path(args.features_summary).read_text()) if args.features_summary else None
    store = None
    if args.store:
        from interp.store import ActivationStore

        store = ActivationStore(args.store)
    report = build_report(model, args.root, n_eval_images=args.eval_images, n_fidelity_images=args.fidelity_images,
                          features_summary=summary, world_seed=args.world_seed, seed=args.seed, store=store)
    if args.notes_file:
        report["notes"] = Path(args.notes_file).read_text().strip()
    from interp.models.t2i import resolve

    source = resolve(args.model)[0]
    if os.path.isdir(source):  # which weights the SAEs were measured on: checkable later
        from .report import weights_fingerprint

        report["model_weights_sha256"] = weights_fingerprint(source)
    md = write_report(report, args.out or args.root)
    print(md, end="")
    return 0


def _add_probe_arguments(parser) -> None:
    """`saes probe`: the model and the fresh generations its blocks are probed on."""
    parser.add_argument("--model", default="toy", help="toy, a saved pipeline directory (e.g. a recipe run's), ...")
    parser.add_argument("--images", type=int, default=300, help="fresh shapes-world generations")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    parser.add_argument("--guidance", type=float, default=None, help="classifier-free guidance (default: the model's)")
    parser.add_argument("--world-seed", type=int, default=2, help="seed of the fresh captions")
    parser.add_argument("--seed", type=int, default=100_000, help="image i is generated with seed + i")
    parser.add_argument("--ablate-images", type=at_least(0), default=200,
                        help="generations with each block ablated in turn, read by the probe (0: none)")
    add_dtype_argument(parser, default=None)
    parser.add_argument("--threads", type=at_least(1), default=1)
    parser.add_argument("--out", required=True, help="directory for probes.json and PROBES.md")


def _probe(args) -> int:
    from interp.atomic import atomic_write_text

    from .report import probe_blocks, probe_markdown
    from .strict_json import write_json

    model = _load_model(args)
    probes = probe_blocks(model, n_images=args.images, world_seed=args.world_seed, seed=args.seed,
                          ablate_images=args.ablate_images)
    md = probe_markdown(probes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "probes.json", probes, indent=2)
    atomic_write_text(out / "PROBES.md", md)
    print(md, end="")
    return 0


def _add_import_sdxl_arguments(parser) -> None:
    """`saes import-sdxl`: the published checkpoint and where its sae-lens directory goes."""
    parser.add_argument("--checkpoint", required=True, help="state_dict.pth or its directory (with mean.pt / std.pt)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--block", default=None, help="block name to record, e.g. unet.down_blocks.2.attentions.1")
    parser.add_argument("--k", type=int, default=None, help="default: config.json beside it, else 10")


def _import_sdxl(args) -> int:
    from .importers import import_openai_topk

    metadata = {"hook_name": args.block} if args.block else {}
    sae = import_openai_topk(args.checkpoint, k=args.k, **metadata)
    sae.save(args.out)
    print(f"wrote {args.out} (topk, d_in={sae.cfg.d_in}, d_sae={sae.cfg.d_sae}, k={sae.cfg.k})")
    return 0


def _add_bench_arguments(parser) -> None:
    from .bench.run import add_bench_arguments

    add_bench_arguments(parser)


def _bench(args) -> int:
    from .bench.run import bench_command

    return bench_command(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m saes", description="Train, evaluate and import SAEs.")
    commands = parser.add_subparsers(dest="command", required=True)

    from .causal import add_causal_arguments
    from .export import add_export_arguments, export_command
    from .circuits import add_fidelity_arguments, add_graph_arguments, fidelity_command, graph_command
    from .transcoder_set import add_arguments as add_transcoder_set_arguments
    from .transcoder_set import command as transcoder_set_command

    for name, help_text, add_arguments, command in (
        ("train", "train an SAE on one block of an activation store (resumable)", _add_train_arguments, _train),
        ("eval", "explained variance, L0, dead and dense features, and with --model splice-in fidelity (JSON + "
                 "markdown)", _add_eval_arguments, _eval),
        ("features", "feature cards: frequency, mean activation, top images with heatmaps, shapes-world labels by "
                     "AUROC (JSON + HTML)", _add_features_arguments, _features),
        ("causal", "causal label scores: how often painting a labelled feature into held-out objects makes the "
                   "probe read its label (into features.json)", add_causal_arguments, _causal),
        ("report", "evaluation report of a model's SAEs: EV, L0, dead, splice fidelity, which blocks carry which "
                   "attributes (REPORT.md + report.json)", _add_report_arguments, _report),
        ("probe", "where a model codes each attribute, before any SAE: linear probes, dimensions, the one-direction "
                  "ceiling and the mixture distance per value in every block (shapes world)", _add_probe_arguments,
         _probe),
        ("export", "feature cards in the field's viewer formats: SAEDashboard's Neuronpedia batches or "
                   "Neuronpedia's bulk-import tree (text and image SAEs)", add_export_arguments, export_command),
        ("import-sdxl", "convert a published SDXL Turbo SAE (state_dict.pth) to sae-lens format",
         _add_import_sdxl_arguments, _import_sdxl),
        ("bench", "SAEBench's evals (core, sparse probing, ...) on a CPU, one SAEBench JSON per SAE and eval",
         _add_bench_arguments, _bench),
        ("graph", "a prompt's attribution graph from per-layer transcoders (circuit-tracer's JSON), and feature "
                  "ablations beside its predictions", add_graph_arguments, graph_command),
        ("train-transcoders", "a transcoder for every layer of an LM, all trained side by side from one forward pass "
                              "per chunk of text (resumable)", add_transcoder_set_arguments, transcoder_set_command),
        ("transcoder-eval", "the replacement model's fidelity with every MLP replaced by its transcoder (CE "
                            "recovered, KL)", add_fidelity_arguments, fidelity_command),
    ):
        sub = commands.add_parser(name, help=help_text)
        add_arguments(sub)
        sub.set_defaults(run=command)

    return run_command(add_overwrite_options(parser).parse_args(argv),
                       interrupted="interrupted; run the same command again to resume")


if __name__ == "__main__":
    sys.exit(main())

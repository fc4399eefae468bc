"""The text-to-image collector and the `python -m interp collect` command: what fills an activation store
(`interp.store`: its format, writer steps and reader) from a text-to-image model.

    collect         a text-to-image model's block updates, image by image (CollectionPlan); under `torchrun`
                    the ranks share the shards
    stream_vectors  a block's updates straight from generation to a trainer, with no disk

`collect_command` sends a language model to `interp.collect_lm` (LMCollectionPlan, collect_lm: its residuals at hook
names, token by token of a corpus, `--text`). Both plans are `interp.store.StorePlan`s: shards, checksums, the manifest
and resuming are the store's one writer's; torchrun's process group is `interp.distributed.joined_ranks`.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import torch

from .cli import (MIXED_DEFAULT, add_backend_argument, add_device_argument, add_dtype_argument, add_out_argument,
                  at_least, dtype_name, parse_dtype)
from .collect_lm import LM_POSITIONS
from .distributed import joined_ranks, torchrun_rank
from .hooks.diffusion import capture_updates
from .models.t2i import MAX_SEED, generate
from .store import (CALLS_PER_STEP, FORMAT, MANIFEST_FILE, PLAN_FILE, SHARD_DIR, STEP_REDUCTION, STORE_DTYPE, VERSION,
                    ActivationStore, StoreError, StorePlan, check_plan, prepare_directory, shard_is_whole,
                    shard_metadata, shard_name, window_batches, write_manifest, write_resumable_shard)

# Images a `collect --world` run may ask for: its plan lists every caption (about 120 MB of plan.json at the
# limit), and the toy's six blocks store 64 KB per image and step. A larger store comes from --prompts.
MAX_WORLD_IMAGES = 1_000_000


@dataclass
class CollectionPlan(StorePlan):
    """What a collection records; a resumed run must have the same plan."""

    model: str
    blocks: list[str]
    prompts: list[str]
    seeds: list[int]
    steps: int
    guidance: float
    half: str = "cond"               # which CFG half is stored ("cond" is the whole batch without CFG)
    images_per_shard: int = 16
    shapes: dict[str, list[int]] = field(default_factory=dict)  # block -> per image (steps, C, H, W)
    dtype: str = "float16"           # of the stored tensors
    model_dtype: str = "float32"     # the model's weights when it ran (--dtype)
    format: str = FORMAT
    version: int = VERSION

    @property
    def n_images(self) -> int:
        return len(self.prompts)

    @property
    def n_units(self) -> int:
        return self.n_images

    @property
    def units_per_shard(self) -> int:
        return self.images_per_shard


def read_prompts(path: str | os.PathLike) -> list[str]:
    """One prompt per non-empty line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise StoreError(f"cannot read prompts from {path}: {err.strerror or err}") from None
    prompts = [line.strip() for line in lines if line.strip()]
    if not prompts:
        raise StoreError(f"{path} has no prompts (one prompt per line)")
    return prompts


# ----------------------------------------------------------------------------- text-to-image collection

def _capture_images(model, plan: CollectionPlan, start: int, stop: int,
                    stop_after_last: bool = True) -> tuple[dict[str, torch.Tensor], list[int]]:
    """{block: (n, steps, C, H, W) fp16 on the CPU} for images [start, stop), and the denoiser calls each scheduler
    step made (a step of several, Heun's or PNDM's warm-up, is stored as the mean of their updates).
    stop_after_last: the final denoiser call ends after the plan's last block (no VAE either; bit-identical)."""
    with capture_updates(model, plan.blocks, device="cpu", stop_after_last=stop_after_last) as cap:
        generate(model, plan.prompts[start:stop], steps=plan.steps, seed=plan.seeds[start:stop],
                 guidance=plan.guidance, output_type="latent")
    tensors = {block: cap.updates(block, plan.half).transpose(0, 1).to(STORE_DTYPE).contiguous()
               for block in plan.blocks}
    for block, tensor in tensors.items():  # a text stream's length is the pipeline's: say so if it is not
        if plan.shapes and list(tensor.shape[1:]) != list(plan.shapes[block]):
            raise StoreError(f"{block} recorded {list(tensor.shape[1:])} per image, not the {plan.shapes[block]} "
                             f"the plan expects (steps, channels, then the grid or the text tokens)")
    return tensors, cap.calls_per_step(plan.blocks[0])


def collect(model, plan: CollectionPlan, out: str | os.PathLike, rank: int = 0, world_size: int = 1,
            barrier=None, progress: bool = True, stop_after_last: bool = True) -> Path:
    """Record the plan's block updates into `out`; resumes an interrupted run; returns the manifest path.

    With world_size > 1, call on every rank (barrier: a function that waits for all ranks).
    stop_after_last (default): each generation's final denoiser call ends after the plan's last block, and its
    scheduler step and VAE decode are skipped (`capture_updates`' option; the store is bit-identical).
    """
    from tqdm import tqdm

    out = Path(out)
    barrier = barrier or (lambda: None)
    if plan.half not in ("cond", "uncond"):
        raise StoreError(f"half must be 'cond' or 'uncond', not {plan.half!r}")
    if len(plan.seeds) != plan.n_images:
        raise StoreError(f"{plan.n_images} prompts but {len(plan.seeds)} seeds")
    if plan.n_images == 0:
        raise StoreError("no prompts to collect")
    sites = getattr(model, "sites", model.blocks)  # blocks and joint blocks' text streams (`<block>:text`)
    for block in plan.blocks:  # fail before any work on an unknown block
        if block not in sites:
            raise StoreError(f"unknown block {block!r}; the model's blocks are: {', '.join(sites)}")
    # Per image: (steps, C, H, W) of a block's grid, (steps, C, tokens) of a text stream.
    plan.shapes = {b: [plan.steps, *sites[b].shape] for b in plan.blocks}
    fresh = not (out / PLAN_FILE).exists()
    if rank == 0:
        prepare_directory(out, plan)
    barrier()
    if rank != 0:
        check_plan(out, plan)
    shard_dir = out / SHARD_DIR
    mine = [k for k in range(plan.n_shards) if k % world_size == rank]
    todo = [k for k in mine if not shard_is_whole(shard_dir / shard_name(k), plan)]
    for shard in tqdm(todo, desc=f"collect (rank {rank})" if world_size > 1 else "collect",
                      unit="shard", disable=not progress or rank != 0, initial=len(mine) - len(todo),
                      total=len(mine)):
        start, stop = plan.shard_range(shard)
        try:
            tensors, calls = _capture_images(model, plan, start, stop, stop_after_last)
        except Exception:
            # A generation that fails before any shard is written (a model that cannot run these prompts) must
            # not leave a plan that asks to resume: the same command would fail again.
            if fresh and rank == 0 and world_size == 1 and not any(shard_dir.iterdir()):
                (out / PLAN_FILE).unlink(missing_ok=True)
            raise
        tensors["image_index"] = torch.arange(start, stop, dtype=torch.int64)
        write_resumable_shard(plan, shard_dir, shard, tensors, metadata={CALLS_PER_STEP: json.dumps(calls)})
    barrier()
    if rank == 0:
        manifest = plan.to_dict()
        manifest["n_images"] = plan.n_images
        calls = shard_metadata(shard_dir / shard_name(0)).get(CALLS_PER_STEP)
        if calls is not None:  # shards written before steps were scheduler steps do not say
            manifest[CALLS_PER_STEP] = json.loads(calls)
            manifest[STEP_REDUCTION] = "mean"
        write_manifest(out, plan, manifest)
    barrier()
    return out / MANIFEST_FILE


# ----------------------------------------------------------------------------- streaming

def stream_vectors(model, block: str, prompts: Iterable[str], batch_size: int, steps: int | None = None,
                   guidance: float | None = None, seed: int = 0, images_per_generation: int = 8,
                   shuffle: bool = True, buffer_vectors: int = 1 << 16, half: str = "cond",
                   stop_after_last: bool = True) -> Iterator[torch.Tensor]:
    """Float32 (batch, channels) vectors of a block's updates, straight from generation (no disk).

    prompts may be endless (a generator); image i gets seed `seed + i`. Vectors are
    shuffled within a window of about `buffer_vectors`; the last partial batch is yielded.
    stop_after_last (default): each generation's final denoiser call ends after the block (bit-identical).
    """
    steps = model.default_steps if steps is None else steps
    guidance = model.default_guidance if guidance is None else guidance
    prompt_iter = iter(prompts)

    def chunks() -> Iterator[torch.Tensor]:
        image_index = 0
        while chunk := [p for _, p in zip(range(images_per_generation), prompt_iter)]:
            seeds = list(range(seed + image_index, seed + image_index + len(chunk)))
            image_index += len(chunk)
            with capture_updates(model, [block], device="cpu", stop_after_last=stop_after_last) as cap:
                generate(model, chunk, steps=steps, seed=seeds, guidance=guidance, output_type="latent")
            x = cap.updates(block, half)  # (steps, n, C, H, W); a text stream's (steps, n, C, tokens)
            yield x.transpose(0, 1).movedim(2, -1).reshape(-1, x.shape[2]).float()

    yield from window_batches(chunks(), batch_size, buffer_vectors=buffer_vectors, shuffle=shuffle, seed=seed)


# ----------------------------------------------------------------------------- CLI

def add_collect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="toy", help="toy (embedded), sdxl-turbo, sdxl-base, hub id or directory; "
                                                       "or a language model: toy-chat, smollm2-135m-instruct, ...")
    parser.add_argument("--blocks", "--hooks", nargs="+", default=None, dest="blocks",
                        help="block names (default: the model's analysed blocks: SDXL's four, those of them a "
                             "smaller U-Net has, and for the toy model also the two where it draws shape and colour); "
                             "for a language model its TransformerLens hook names, blocks.L.hook_resid_pre|mid|post")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", help="a text file, one prompt per line")
    source.add_argument("--text", help="language models: the corpus, JSONL (Dolly's instruction/context/response, "
                                       "\"text\", or \"prompt\" + \"completion\") or plain text (a document a line)")
    source.add_argument("--world", type=at_least(1, MAX_WORLD_IMAGES), metavar="N",
                        help=f"N random captions of the shapes world (at most {MAX_WORLD_IMAGES:,})")
    parser.add_argument("--world-seed", type=int, default=0, help="seed of the --world captions")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    parser.add_argument("--guidance", type=float, default=None, help="classifier-free guidance (default: the model's)")
    parser.add_argument("--seed", type=at_least(0, MAX_SEED), default=0,
                        help="image i is generated with seed + i (seeds from 0 to 2**64 - 1)")
    parser.add_argument("--half", choices=("cond", "uncond"), default="cond",
                        help="which half of a CFG batch to store (without CFG the batch is the cond half)")
    parser.add_argument("--images-per-shard", type=at_least(1), default=16)
    add_device_argument(parser, default=None, help="cpu or cuda (default: cuda when available; "
                                                       "language models: cpu)")
    lm = parser.add_argument_group("language models (--text)")
    lm.add_argument("--max-tokens", type=at_least(1), default=None, help="collect the corpus' first N tokens "
                    "(default: all); a corpus with fewer is an error unless --allow-fewer")
    lm.add_argument("--allow-fewer", action="store_true", help="with --max-tokens: collect what the corpus has")
    lm.add_argument("--positions", choices=LM_POSITIONS, default="all",
                    help="all: every token but the start token; last: the last token of each sequence")
    lm.add_argument("--context", type=at_least(2), default=128,
                    help="tokens per sequence, the start token included (capped at the model's context); "
                         "longer documents are cut into several sequences")
    lm.add_argument("--tokens-per-shard", type=at_least(1), default=16384)
    lm.add_argument("--batch-size", type=at_least(1), default=16, help="sequences per forward pass")
    add_backend_argument(lm)
    lm.add_argument("--threads", type=at_least(1), default=None, help="torch threads (default: torch's)")
    add_dtype_argument(parser, default=None, what="the model (recorded in the plan)", said=MIXED_DEFAULT)
    add_out_argument(parser, required=True, help="store directory (created; resumed if it holds this plan)")


def collect_command(args) -> int:
    from tqdm import tqdm

    from .models import load_t2i
    from .models.spec import model_spec

    if model_spec(args.model).is_lm:
        from .collect_lm import lm_collect_command

        args.dtype = args.dtype or "float32"
        return lm_collect_command(args)
    if args.text is not None:
        raise StoreError(f"--text is for language models; {args.model} is a text-to-image model: give --prompts "
                         f"or --world")
    rank, world_size = torchrun_rank()
    if args.prompts:
        prompts = read_prompts(args.prompts)
    else:  # --world N: the shapes world's captions, whatever the model
        from .ground_truth import world

        prompts = world("shapes").prompts(args.world, args.world_seed, progress=rank == 0)
    if args.seed + len(prompts) - 1 > MAX_SEED:
        raise StoreError(f"--seed {args.seed} with {len(prompts)} images needs seeds up to "
                         f"{args.seed + len(prompts) - 1}, past the largest seed, {MAX_SEED} (2**64 - 1)")
    device = args.device
    if world_size > 1 and device is None and torch.cuda.is_available():
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    with joined_ranks(world_size) as barrier:  # torchrun: the ranks share the shards
        model = load_t2i(args.model, device=device, dtype=parse_dtype(args.dtype))
        steps = model.default_steps if args.steps is None else args.steps
        guidance = model.default_guidance if args.guidance is None else args.guidance
        model.check_request(steps, guidance=guidance)
        prompts = [model.check_prompt(p) for p in tqdm(prompts, desc="check prompts", unit="prompt",
                                                        disable=rank != 0, mininterval=1.0)]
        blocks = args.blocks if args.blocks is not None else model.default_blocks
        plan = CollectionPlan(model=args.model, blocks=[b.removeprefix("unet.") for b in blocks],
                              prompts=prompts, seeds=[args.seed + i for i in range(len(prompts))], steps=steps,
                              guidance=float(guidance), half=args.half, images_per_shard=args.images_per_shard,
                              model_dtype=dtype_name(model.denoiser.dtype))
        manifest = collect(model, plan, args.out, rank=rank, world_size=world_size, barrier=barrier)
    if rank == 0:
        store = ActivationStore(manifest.parent)
        sizes = ", ".join(f"{b}: {store.n_vectors(b)} x {store.channels(b)}" for b in store.blocks)
        print(f"wrote {manifest} ({len(store)} images, {len(store.shards)} shards; vectors {sizes})")
    return 0

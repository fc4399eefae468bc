"""Collectors: what fills an activation store (`interp.store`: its format, writer steps and reader).

    collect         a text-to-image model's block updates, image by image (CollectionPlan); under `torchrun`
                    the ranks share the shards
    collect_lm      a language model's residuals at hook names, token by token of a corpus (LMCollectionPlan)
    stream_vectors  a block's updates straight from generation to a trainer, with no disk

and the `python -m interp collect` command (`add_collect_arguments`, `collect_command`; for a language model
`lm_collect_command`, `--text`). Both plans are `interp.store.StorePlan`s: shards, checksums, the manifest and
resuming are the store's one writer's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Iterable, Iterator

import torch

from .cli import (MIXED_DEFAULT, add_backend_argument, add_device_argument, add_dtype_argument, add_out_argument,
                  at_least, dtype_name, parse_dtype)
from .hooks.diffusion import capture_updates
from .models.t2i import MAX_SEED, generate
from .store import (CALLS_PER_STEP, FORMAT, LM_INDEX, LM_KIND, MANIFEST_FILE, PLAN_FILE, SHARD_DIR, STEP_REDUCTION,
                    STORE_DTYPE, VERSION, ActivationStore, StoreError, StorePlan, check_plan, prepare_directory,
                    shard_is_whole, shard_metadata, shard_name, window_batches, write_manifest,
                    write_resumable_shard)

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


# ----------------------------------------------------------------------------- language-model collection
#
# An LM store's unit is a token (`interp.store`, LM_KIND): the corpus is cut into sequences of at most `context`
# tokens, each led by one start token (interp.lm_text), and the chosen positions' residuals are stored in reading
# order; the start token's own position is never stored, nor is padding.

LM_POSITIONS = ("all", "last")


@dataclass
class LMCollectionPlan(StorePlan):
    """What an LM residual collection records; a resumed run must have the same plan."""

    model: str
    blocks: list[str]                    # TransformerLens hook names, blocks.{l}.hook_resid_pre|mid|post
    text: str                            # the corpus file as given (its content is text_sha256)
    text_sha256: str
    tokens_sha256: str                   # of the token sequences collected from: the same tokenizer and cut
    context: int
    positions: str = "all"               # all: every token after the start token; last: each sequence's last
    n_tokens: int = 0
    n_sequences: int = 0
    n_documents: int = 0
    tokens_per_shard: int = 16384
    batch_size: int = 16
    start_token: int = 0
    backend: str = "hf"
    shapes: dict[str, list[int]] = field(default_factory=dict)  # hook -> [d_model]
    dtype: str = "float16"               # of the stored tensors
    model_dtype: str = "float32"         # the model's weights when it ran (--dtype)
    kind: str = LM_KIND
    format: str = FORMAT
    version: int = VERSION

    INDEX_KEY: ClassVar[str] = LM_INDEX
    RESUME_IGNORES: ClassVar[tuple[str, ...]] = ("shapes", "text")  # the text's content is text_sha256

    @property
    def n_units(self) -> int:
        return self.n_tokens

    @property
    def units_per_shard(self) -> int:
        return self.tokens_per_shard


def select_positions(sequences: list[list[int]], positions: str = "all") -> list[list[int]]:
    """Per sequence, the positions whose residuals are collected (never 0, the start token)."""
    if positions not in LM_POSITIONS:
        raise StoreError(f"--positions must be one of {', '.join(LM_POSITIONS)}, not {positions!r}")
    if positions == "all":
        return [list(range(1, len(s))) for s in sequences]
    return [[len(s) - 1] if len(s) > 1 else [] for s in sequences]


def limit_tokens(selected: list[list[int]], max_tokens: int | None, allow_fewer: bool = False,
                 source: str = "the corpus") -> tuple[list[list[int]], str | None]:
    """The first `max_tokens` selected positions in reading order (None: all), and a note when there are
    fewer; fewer than asked is an error unless `allow_fewer`."""
    available = sum(map(len, selected))
    if available == 0:
        raise StoreError(f"{source} has no tokens to collect (every sequence is only its start token)")
    if max_tokens is None:
        return selected, None
    if max_tokens < 1:
        raise StoreError(f"--max-tokens must be at least 1, got {max_tokens}")
    if available < max_tokens:
        message = f"{source} has {available:,} tokens to collect, fewer than --max-tokens {max_tokens:,}"
        if not allow_fewer:
            raise StoreError(f"{message}; give a larger text, lower --max-tokens, or pass --allow-fewer to "
                             f"collect the {available:,} there are")
        return selected, f"note: {message}; collecting all {available:,} (--allow-fewer)"
    out, left = [], max_tokens
    for chosen in selected:
        take = chosen[:left]
        out.append(take)
        left -= len(take)
        if left == 0:
            break
    return out, None


def sequences_digest(sequences: list[list[int]], selected: list[list[int]]) -> str:
    digest = hashlib.sha256()
    for seq, chosen in zip(sequences, selected):
        digest.update(json.dumps([seq[:chosen[-1] + 1] if chosen else [], chosen]).encode())
    return digest.hexdigest()


def _lm_batch(lm, plan: LMCollectionPlan, rows: list[tuple[int, list[int], list[int]]]) -> dict[str, torch.Tensor]:
    """Residuals of the chosen positions of some sequences: rows of (sequence index, tokens, positions)."""
    from .hooks.lm import forward_padded, residual_capture

    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    lengths = [chosen[-1] + 1 for _, _, chosen in rows]  # causal: tokens after the last chosen one change nothing
    width = max(lengths)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, ((_, tokens, _), n) in enumerate(zip(rows, lengths)):
        ids[r, :n] = torch.tensor(tokens[:n])
        mask[r, :n] = 1
    with residual_capture(lm, plan.blocks) as capture:
        forward_padded(lm, ids, mask, stop_after=plan.blocks)
    row_index = torch.tensor([r for r, (_, _, chosen) in enumerate(rows) for _ in chosen], dtype=torch.long)
    position = torch.tensor([p for _, _, chosen in rows for p in chosen], dtype=torch.long)
    out = {hook: capture.activations[hook][row_index, position].to(STORE_DTYPE).contiguous() for hook in plan.blocks}
    out["sequence"] = torch.tensor([i for i, _, chosen in rows for _ in chosen], dtype=torch.long)
    out["position"] = position
    out["token_id"] = ids[row_index, position]
    return out


def _lm_shard(lm, plan: LMCollectionPlan, sequences: list[list[int]], selected: list[list[int]],
              offsets: list[int], shard: int) -> dict[str, torch.Tensor]:
    import bisect

    start, stop = plan.shard_range(shard)
    rows = []
    first = bisect.bisect_right(offsets, start) - 1
    for i in range(max(first, 0), len(selected)):
        if offsets[i] >= stop:
            break
        chosen = selected[i][max(start - offsets[i], 0):stop - offsets[i]]
        if chosen:
            rows.append((i, sequences[i], chosen))
    # batched by length, so a batch is not padded to one long document (3-6x fewer padded positions on the
    # SmolLM2 corpus); the tokens then go back to the plan's order
    by_length = sorted(rows, key=lambda row: row[2][-1])
    parts = [_lm_batch(lm, plan, by_length[b:b + plan.batch_size]) for b in range(0, len(rows), plan.batch_size)]
    tensors = {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
    rank = {i: k for k, (i, _, _) in enumerate(rows)}
    order = torch.argsort(torch.tensor([rank[int(i)] for i in tensors["sequence"]]) * (plan.n_tokens + 1)
                          + tensors["position"], stable=True)
    tensors = {key: value[order] for key, value in tensors.items()}
    if len(tensors["position"]) != stop - start:  # the plan's cut and the corpus disagree: a bug, not bad input
        raise RuntimeError(f"shard {shard}: gathered {len(tensors['position'])} tokens, expected {stop - start}")
    tensors[LM_INDEX] = torch.arange(start, stop, dtype=torch.int64)
    return tensors


def collect_lm(lm, plan: LMCollectionPlan, sequences: list[list[int]], selected: list[list[int]],
               out: str | os.PathLike, progress: bool = True, rank: int = 0, world_size: int = 1,
               barrier=None) -> Path:
    """Record the residuals of `selected` positions of `sequences` (see select_positions / limit_tokens)
    at the plan's hooks into the store `out`; resumes an interrupted run; returns the manifest path.

    With world_size > 1 (torchrun), call on every rank with the same plan: rank r writes shards r, r + world, ...
    (a shard is computed the same whoever computes it, so the store equals one process's); rank 0 writes the plan
    and the manifest, and a rank whose plan differs from rank 0's is refused in one line (check_plan)."""
    from tqdm import tqdm

    from .hooks.lm import parse_hook_name

    out = Path(out)
    if plan.n_tokens != sum(map(len, selected)):
        raise StoreError(f"the plan says {plan.n_tokens} tokens but {sum(map(len, selected))} are selected")
    if plan.n_tokens == 0:
        raise StoreError("no tokens to collect")
    for hook in plan.blocks:  # fail before any work on an unknown hook
        parse_hook_name(hook, lm.n_layers)
    if max(map(len, sequences)) > lm.n_ctx:
        raise StoreError(f"a sequence has {max(map(len, sequences))} tokens; the model's context is {lm.n_ctx}")
    plan.shapes = {hook: [lm.d_model] for hook in plan.blocks}
    barrier = barrier or (lambda: None)
    if rank == 0:
        prepare_directory(out, plan)
    barrier()
    if rank != 0:
        check_plan(out, plan)
    offsets = [0]
    for chosen in selected:
        offsets.append(offsets[-1] + len(chosen))
    shard_dir = out / SHARD_DIR
    mine = [k for k in range(plan.n_shards) if k % world_size == rank]
    todo = [k for k in mine if not shard_is_whole(shard_dir / shard_name(k), plan)]
    for shard in tqdm(todo, desc=f"collect (rank {rank})" if world_size > 1 else "collect", unit="shard",
                      disable=not progress or rank != 0, initial=len(mine) - len(todo), total=len(mine)):
        tensors = _lm_shard(lm, plan, sequences, selected, offsets, shard)
        write_resumable_shard(plan, shard_dir, shard, tensors)
    barrier()
    if rank == 0:
        write_manifest(out, plan, plan.to_dict())
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
    from .models.spec import model_spec, refuse_t2i_backend

    if model_spec(args.model).is_lm:
        args.dtype = args.dtype or "float32"
        return lm_collect_command(args)
    if args.text is not None:
        raise StoreError(f"--text is for language models; {args.model} is a text-to-image model: give --prompts "
                         f"or --world")
    try:
        refuse_t2i_backend(getattr(args, "backend", None), args.model)
    except ValueError as error:
        raise StoreError(str(error)) from None
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if args.prompts:
        prompts = read_prompts(args.prompts)
    else:  # --world N: the shapes world's captions, whatever the model
        from .ground_truth import world

        prompts = world("shapes").prompts(args.world, args.world_seed, progress=rank == 0)
    if args.seed + len(prompts) - 1 > MAX_SEED:
        raise StoreError(f"--seed {args.seed} with {len(prompts)} images needs seeds up to "
                         f"{args.seed + len(prompts) - 1}, past the largest seed, {MAX_SEED} (2**64 - 1)")
    barrier = None
    device = args.device
    if world_size > 1:
        import datetime

        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
        barrier = dist.barrier
        if device is None and torch.cuda.is_available():
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    try:
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
    finally:
        if world_size > 1:
            import torch.distributed as dist

            dist.destroy_process_group()
    if rank == 0:
        store = ActivationStore(manifest.parent)
        sizes = ", ".join(f"{b}: {store.n_vectors(b)} x {store.channels(b)}" for b in store.blocks)
        print(f"wrote {manifest} ({len(store)} images, {len(store.shards)} shards; vectors {sizes})")
    return 0


def lm_collect_command(args) -> int:
    """`python -m interp collect --model <LM> --hooks ... --text FILE --out DIR`."""
    from .lm_text import read_documents, read_text_file, start_token, token_sequences
    from .models.lm import load_lm

    if args.text is None:
        raise StoreError(f"{args.model} is a language model: give its corpus with --text FILE (JSONL or plain "
                         f"text), not --prompts / --world")
    if not args.blocks:
        raise StoreError("give the hooks to record: --hooks blocks.L.hook_resid_post [...] "
                         f"(`python -m interp hooks --model {args.model}` lists them)")
    if args.threads:
        torch.set_num_threads(args.threads)
    documents = read_documents(args.text)
    text_sha256 = hashlib.sha256(read_text_file(args.text).encode("utf-8")).hexdigest()
    lm = load_lm(args.model, backend=args.backend, device=args.device or "cpu", dtype=parse_dtype(args.dtype))
    from .hooks.lm import check_hooks

    check_hooks(lm, args.blocks)  # before tokenizing and before any file: a wrong name is the commonest mistake
    context = min(args.context, lm.n_ctx)
    sequences = token_sequences(lm.tokenizer, documents, context)
    selected, note = limit_tokens(select_positions(sequences, args.positions), args.max_tokens, args.allow_fewer,
                                  source=f"{args.text} ({len(documents):,} documents, {len(sequences):,} sequences of "
                                         f"at most {context} tokens)")
    used = sum(1 for chosen in selected if chosen)
    sequences, selected = sequences[:len(selected)], selected
    if note:
        print(note, file=sys.stderr)
    plan = LMCollectionPlan(model=args.model, blocks=list(dict.fromkeys(args.blocks)), text=str(args.text),
                            text_sha256=text_sha256, tokens_sha256=sequences_digest(sequences, selected),
                            context=context, positions=args.positions, n_tokens=sum(map(len, selected)),
                            n_sequences=used, n_documents=len(documents), tokens_per_shard=args.tokens_per_shard,
                            batch_size=args.batch_size, start_token=start_token(lm.tokenizer)[0], backend=args.backend,
                            model_dtype=args.dtype)
    world_size, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world_size > 1:  # torchrun: every rank builds the same plan, and writes its share of the shards
        import torch.distributed as dist

        from .distributed import init_process_group

        init_process_group()  # gloo: the ranks only wait for each other (barriers), whatever the model's device
        try:
            manifest = collect_lm(lm, plan, sequences, selected, args.out, rank=rank, world_size=world_size,
                                  barrier=dist.barrier)
        finally:
            dist.destroy_process_group()
        if rank != 0:
            return 0
    else:
        manifest = collect_lm(lm, plan, sequences, selected, args.out)
    store = ActivationStore(manifest.parent)
    print(f"wrote {manifest} ({store.n_tokens:,} tokens from {plan.n_sequences:,} sequences, {len(store.shards)} "
          f"shards; {', '.join(store.blocks)}: d_model {lm.d_model})")
    return 0

"""Activation store: block updates on disk as sharded fp16 safetensors, resumable, streamable.

Layout of a store directory:

    plan.json                      what is being collected (model, blocks, prompts, seeds, steps, ...)
    shards/shard-000000.safetensors  images [0, n) : {block: (n, steps, C, H, W) fp16, "image_index": (n,)}
                                   (a joint block's text stream `<block>:text`: (n, steps, C, tokens))
    shards/shard-000001.safetensors  images [n, 2n) ...
    manifest.json                  written last: the plan, shapes, dtype and the list of shards,
                                   each with the sha256 of every tensor in it

Every file is written to a temporary name and renamed into place (`os.replace`), readable by
others (0o644, as `interp.atomic` writes), so a shard either exists whole or not at all. An
interrupted collection resumes by skipping the shards that exist. Under `torchrun
--nproc-per-node N`, rank r writes shards r, r + N, r + 2N, ... and rank 0 writes the one
manifest once every shard exists.

Checksums: each shard's tensors are hashed in memory just before they are written (no second
pass over the file) and the digests go into the shard's own header, from which the manifest copies them.
A reader checks a tensor against the manifest's digest the first time it reads it, so a shard
damaged after collection (a flipped bit, a bad copy) is an error naming the shard, never
silently wrong data. Stores written before checksums were recorded (no "sha256" in the
manifest's shard entries) still read, unchecked.

Readers: `ActivationStore(path).batches(block, batch_size)` streams shuffled float32
(batch, channels) vectors (one per position per step per image) a window of shards at a
time; `.image(i, block)` gives one image's (steps, C, H, W). `stream_vectors` feeds a
trainer straight from generation, with no disk.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar, Iterable, Iterator

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .atomic import atomic_write, remove_temporaries
from .cli import MIXED_DEFAULT, add_dtype_argument, at_least, dtype_name, parse_dtype
from .hooks.diffusion import capture_updates
from .models.t2i import MAX_SEED, generate

FORMAT = "interp-activation-store"
VERSION = 1
PLAN_FILE = "plan.json"
# The manifest says how steps were stored: scheduler steps, each the mean of the denoiser calls it made
# (`calls_per_step`: Heun, 4 steps: [2, 2, 2, 1]; Euler: [1, 1, 1, 1]).
CALLS_PER_STEP = "calls_per_step"
STEP_REDUCTION = "step_reduction"
MANIFEST_FILE = "manifest.json"
SHARD_DIR = "shards"
STORE_DTYPE = torch.float16
CHECKSUM = "sha256"  # the key of the digests, in a shard's header metadata and its manifest entry
FILE_MODE = 0o644
# Images a `collect --world` run may ask for: its plan lists every caption (about 120 MB of plan.json at the
# limit), and the toy's six blocks store 64 KB per image and step. A larger store comes from --prompts.
MAX_WORLD_IMAGES = 1_000_000


class StoreError(ValueError):
    """A store that cannot be written or read, what state it is in and what to do."""


@dataclass
class CollectionPlan:
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
    def n_shards(self) -> int:
        return -(-self.n_images // self.images_per_shard)

    def shard_range(self, shard: int) -> tuple[int, int]:
        start = shard * self.images_per_shard
        return start, min(start + self.images_per_shard, self.n_images)

    def to_dict(self) -> dict:
        return asdict(self)


def shard_name(shard: int) -> str:
    return f"shard-{shard:06d}.safetensors"


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


# ----------------------------------------------------------------------------- atomic writes

def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's bytes as safetensors stores them (C order), hashed where they lie in memory."""
    return hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy()).hexdigest()


def write_shard(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> dict[str, str]:
    """A safetensors file written atomically, with each tensor's digest in its header; returns the digests."""
    digests = {name: tensor_digest(tensor) for name, tensor in tensors.items()}
    metadata = {**(metadata or {}), CHECKSUM: json.dumps(digests)}
    # safetensors, like mkstemp, would leave the file private (0o600): atomic_write makes it FILE_MODE
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata), mode=FILE_MODE, durable=True)
    return digests


def write_json(path: Path, obj) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(obj, indent=2)), mode=FILE_MODE, durable=True)


def _clean_temporaries(out: Path) -> None:
    for directory in (out, out / SHARD_DIR):
        remove_temporaries(directory)
        if directory.is_dir():  # the names of the store's own writer before it used interp.atomic
            for tmp in directory.glob("*.tmp-*"):
                tmp.unlink(missing_ok=True)


def _shard_metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as f:
        return f.metadata() or {}


def _shard_digests(path: Path) -> dict[str, str] | None:
    """The digests in a shard's header (cheap: no tensor is read); None for a shard written without them."""
    with safe_open(str(path), framework="pt") as f:
        recorded = (f.metadata() or {}).get(CHECKSUM)
    return json.loads(recorded) if recorded else None


def _shard_is_whole(path: Path, blocks: list[str], index_key: str = "image_index") -> bool:
    """The header of an existing shard lists every block (cheap: no tensor is read)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return set(blocks) | {index_key} <= set(f.keys())
    except Exception:  # noqa: BLE001 - any unreadable file is treated as missing
        return False


# ----------------------------------------------------------------------------- collection

def _capture_images(model, plan: CollectionPlan, start: int, stop: int) -> tuple[dict[str, torch.Tensor], list[int]]:
    """{block: (n, steps, C, H, W) fp16 on the CPU} for images [start, stop), and the denoiser calls each scheduler
    step made (a step of several, Heun's or PNDM's warm-up, is stored as the mean of their updates)."""
    with capture_updates(model, plan.blocks, device="cpu") as cap:
        generate(model, plan.prompts[start:stop], steps=plan.steps, seed=plan.seeds[start:stop],
                 guidance=plan.guidance, output_type="latent")
    tensors = {block: cap.updates(block, plan.half).transpose(0, 1).to(STORE_DTYPE).contiguous()
               for block in plan.blocks}
    for block, tensor in tensors.items():  # a text stream's length is the pipeline's: say so if it is not
        if plan.shapes and list(tensor.shape[1:]) != list(plan.shapes[block]):
            raise StoreError(f"{block} recorded {list(tensor.shape[1:])} per image, not the {plan.shapes[block]} "
                             f"the plan expects (steps, channels, then the grid or the text tokens)")
    return tensors, cap.calls_per_step(plan.blocks[0])


def _check_plan(out: Path, plan: CollectionPlan) -> None:
    existing = json.loads((out / PLAN_FILE).read_text())
    mine = plan.to_dict()
    ignored = getattr(plan, "RESUME_IGNORES", ("shapes",))
    existing.setdefault("model_dtype", mine.get("model_dtype"))  # a plan written before the dtype was recorded
    differing = sorted(k for k in mine if k not in ignored and existing.get(k) != mine[k])
    if differing:
        raise StoreError(f"{out} holds a collection with other settings ({', '.join(differing)} differ); "
                         f"resume with the same arguments or choose another --out")


def _prepare_directory(out: Path, plan: CollectionPlan) -> None:
    try:
        (out / SHARD_DIR).mkdir(parents=True, exist_ok=True)
        probe = out / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise StoreError(f"cannot write to {out}: {err.strerror or err}") from None
    _clean_temporaries(out)
    if (out / PLAN_FILE).exists():
        _check_plan(out, plan)
    else:
        try:
            write_json(out / PLAN_FILE, plan.to_dict())
        except OSError as err:
            raise StoreError(f"cannot write {out / PLAN_FILE}: {err.strerror or err}") from None


def collect(model, plan: CollectionPlan, out: str | os.PathLike, rank: int = 0, world_size: int = 1,
            barrier=None, progress: bool = True) -> Path:
    """Record the plan's block updates into `out`; resumes an interrupted run; returns the manifest path.

    With world_size > 1, call on every rank (barrier: a function that waits for all ranks).
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
        _prepare_directory(out, plan)
    barrier()
    if rank != 0:
        _check_plan(out, plan)
    shard_dir = out / SHARD_DIR
    mine = [k for k in range(plan.n_shards) if k % world_size == rank]
    todo = [k for k in mine if not _shard_is_whole(shard_dir / shard_name(k), plan.blocks)]
    for shard in tqdm(todo, desc=f"collect (rank {rank})" if world_size > 1 else "collect",
                      unit="shard", disable=not progress or rank != 0, initial=len(mine) - len(todo),
                      total=len(mine)):
        start, stop = plan.shard_range(shard)
        try:
            tensors, calls = _capture_images(model, plan, start, stop)
        except Exception:
            # A generation that fails before any shard is written (a model that cannot run these prompts) must
            # not leave a plan that asks to resume: the same command would fail again.
            if fresh and rank == 0 and world_size == 1 and not any(shard_dir.iterdir()):
                (out / PLAN_FILE).unlink(missing_ok=True)
            raise
        tensors["image_index"] = torch.arange(start, stop, dtype=torch.int64)
        _write_resumable_shard(plan, shard_dir, shard, tensors, metadata={CALLS_PER_STEP: json.dumps(calls)})
    barrier()
    if rank == 0:
        manifest = plan.to_dict()
        manifest["n_images"] = plan.n_images
        calls = _shard_metadata(shard_dir / shard_name(0)).get(CALLS_PER_STEP)
        if calls is not None:  # shards written before steps were scheduler steps do not say
            manifest[CALLS_PER_STEP] = json.loads(calls)
            manifest[STEP_REDUCTION] = "mean"
        _write_manifest(out, plan, manifest)
    barrier()
    return out / MANIFEST_FILE


def _write_resumable_shard(plan, shard_dir: Path, shard: int, tensors: dict[str, torch.Tensor],
                           index_key: str = "image_index", metadata: dict[str, str] | None = None) -> None:
    """Write one shard (its [start, stop) in the header); a failed write says how to resume."""
    start, stop = plan.shard_range(shard)
    try:
        write_shard(shard_dir / shard_name(shard), tensors,
                    metadata={**(metadata or {}), "start": str(start), "stop": str(stop)})
    except OSError as err:
        done = sum(_shard_is_whole(shard_dir / shard_name(k), plan.blocks, index_key) for k in range(plan.n_shards))
        raise StoreError(f"cannot write shard {shard} to {shard_dir}: {err.strerror or err}; the store is "
                         f"consistent ({done} of {plan.n_shards} shards complete): fix the cause and run "
                         f"the same command again to resume") from None


def _write_manifest(out: Path, plan, manifest: dict, index_key: str = "image_index") -> None:
    """Check that every shard of the plan exists, then write `manifest` with the shard list and digests."""
    shard_dir = out / SHARD_DIR
    missing = [k for k in range(plan.n_shards)
               if not _shard_is_whole(shard_dir / shard_name(k), plan.blocks, index_key)]
    if missing:
        raise StoreError(f"{len(missing)} shard(s) missing after collection (first: {missing[0]}); "
                         f"run the same command again to resume")
    manifest["shards"] = []
    for k in range(plan.n_shards):
        entry = {"file": f"{SHARD_DIR}/{shard_name(k)}", "start": plan.shard_range(k)[0],
                 "stop": plan.shard_range(k)[1]}
        digests = _shard_digests(shard_dir / shard_name(k))
        if digests is not None:  # a shard written before checksums were recorded has none
            entry[CHECKSUM] = digests
        manifest["shards"].append(entry)
    try:
        write_json(out / MANIFEST_FILE, manifest)
    except OSError as err:
        raise StoreError(f"every shard is written but the manifest is not: {err.strerror or err}; "
                         f"run the same command again to finish") from None


# ----------------------------------------------------------------------------- language-model collection
#
# An LM store has the same files: plan.json, shards/shard-NNNNNN.safetensors and manifest.json (with
# every tensor's sha256), but its unit is a token, not an image. Shard k holds the residuals of tokens
# [k * tokens_per_shard, (k + 1) * tokens_per_shard) of the corpus in reading order:
#     {hook: (n, d_model) fp16, "token_index": (n,), "sequence": (n,), "position": (n,), "token_id": (n,)}
# The corpus is cut into sequences of at most `context` tokens, each led by one start token
# (interp.lm_text); the start token's own position is never stored, nor is padding.

LM_KIND = "lm"
LM_INDEX = "token_index"
LM_POSITIONS = ("all", "last")


@dataclass
class LMCollectionPlan:
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

    RESUME_IGNORES: ClassVar[tuple[str, ...]] = ("shapes", "text")  # the text's content is text_sha256

    @property
    def n_shards(self) -> int:
        return -(-self.n_tokens // self.tokens_per_shard)

    def shard_range(self, shard: int) -> tuple[int, int]:
        start = shard * self.tokens_per_shard
        return start, min(start + self.tokens_per_shard, self.n_tokens)

    def to_dict(self) -> dict:
        return asdict(self)


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
               out: str | os.PathLike, progress: bool = True) -> Path:
    """Record the residuals of `selected` positions of `sequences` (see select_positions / limit_tokens)
    at the plan's hooks into the store `out`; resumes an interrupted run; returns the manifest path."""
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
    _prepare_directory(out, plan)
    offsets = [0]
    for chosen in selected:
        offsets.append(offsets[-1] + len(chosen))
    shard_dir = out / SHARD_DIR
    todo = [k for k in range(plan.n_shards) if not _shard_is_whole(shard_dir / shard_name(k), plan.blocks, LM_INDEX)]
    for shard in tqdm(todo, desc="collect", unit="shard", disable=not progress, initial=plan.n_shards - len(todo),
                      total=plan.n_shards):
        tensors = _lm_shard(lm, plan, sequences, selected, offsets, shard)
        _write_resumable_shard(plan, shard_dir, shard, tensors, LM_INDEX)
    manifest = plan.to_dict()
    _write_manifest(out, plan, manifest, LM_INDEX)
    return out / MANIFEST_FILE


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
    manifest = collect_lm(lm, plan, sequences, selected, args.out)
    store = ActivationStore(manifest.parent)
    print(f"wrote {manifest} ({store.n_tokens:,} tokens from {plan.n_sequences:,} sequences, {len(store.shards)} "
          f"shards; {', '.join(store.blocks)}: d_model {lm.d_model})")
    return 0


# ----------------------------------------------------------------------------- reading

class ActivationStore:
    """A finished store: per-image access and shuffled streams of (batch, channels) vectors.

    Each tensor read is checked against its sha256 in the manifest the first time this object reads
    it (a `StoreError` names a damaged shard); a store written before checksums reads unchecked."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        manifest_file = self.path / MANIFEST_FILE
        if not manifest_file.exists():
            if (self.path / PLAN_FILE).exists():
                raise StoreError(f"{self.path} is an unfinished collection: run the same collect command again "
                                 f"to resume and finish it")
            raise StoreError(f"{self.path} is not an activation store (no {MANIFEST_FILE})")
        try:
            self.manifest: dict = json.loads(manifest_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise StoreError(f"{manifest_file} is damaged ({err}); run the collect command that made the store "
                             f"again to rewrite it") from None
        if self.manifest.get("format") != FORMAT:
            raise StoreError(f"{manifest_file} is not an {FORMAT} manifest")
        self.blocks: list[str] = list(self.manifest["blocks"])
        self.shards: list[dict] = self.manifest["shards"]
        self.kind: str = self.manifest.get("kind", "diffusion")  # "lm": tokens (LMCollectionPlan), else images
        self._checked: set[tuple[str, str]] = set()  # (shard file, block) read and found intact

    def __len__(self) -> int:
        """Images (a diffusion store) or tokens (an LM store)."""
        return int(self.manifest["n_tokens" if self.kind == LM_KIND else "n_images"])

    @property
    def n_tokens(self) -> int:
        """Tokens of an LM store (each one vector per hook)."""
        self._require_lm("n_tokens")
        return int(self.manifest["n_tokens"])

    def _require_lm(self, what: str) -> None:
        if self.kind != LM_KIND:
            raise StoreError(f"{what}: the store at {self.path} holds images, not language-model tokens")

    @property
    def prompts(self) -> list[str]:
        if self.kind == LM_KIND:
            raise StoreError(f"the store at {self.path} holds language-model tokens of {self.manifest['text']}, "
                             f"not prompts of images")
        return list(self.manifest["prompts"])

    def prompt(self, index: int) -> str:
        return self.manifest["prompts"][index]

    def channels(self, block: str) -> int:
        if self.kind == LM_KIND:
            return int(self._shape(block)[-1])
        return int(self._shape(block)[1])

    def n_vectors(self, block: str) -> int:
        if self.kind == LM_KIND:
            self._shape(block)
            return self.n_tokens
        steps, _, *positions = self._shape(block)  # (H, W) of a grid, (tokens,) of a text stream
        return len(self) * steps * math.prod(positions)

    def _shape(self, block: str) -> list[int]:
        if block not in self.blocks:
            raise StoreError(f"block {block!r} is not in the store; it holds: {', '.join(self.blocks)}")
        return self.manifest["shapes"][block]

    def _damaged(self, shard: dict, problem: str) -> StoreError:
        """The error for a shard that is missing or damaged, saying how to rewrite it."""
        name = f"shard {shard['file']} of the store at {self.path}"
        again = "run the collect command that made the store again to rewrite it"
        if not (self.path / shard["file"]).is_file():
            return StoreError(f"{name} is missing: {again}")
        return StoreError(f"{name} {problem}: the file is damaged (a disk or copy error); delete it and {again}")

    def _unchecked(self, shard: dict, block: str) -> bool:
        return CHECKSUM in shard and (shard["file"], block) not in self._checked

    def _read(self, shard: dict, block: str) -> torch.Tensor:
        """(n, steps, C, H, W) of one shard, as stored (fp16), checked against the manifest's digest."""
        try:
            with safe_open(str(self.path / shard["file"]), framework="pt") as f:
                tensor = f.get_tensor(block)
        except Exception as err:  # safetensors' own error type: a truncated file, a broken header
            raise self._damaged(shard, f"cannot be read ({err})") from None
        if self._unchecked(shard, block):
            if tensor_digest(tensor) != shard[CHECKSUM].get(block):
                raise self._damaged(shard, f"does not match its {CHECKSUM} in the manifest ({block!r})")
            self._checked.add((shard["file"], block))
        return tensor

    def image(self, index: int, block: str) -> torch.Tensor:
        """(steps, channels, height, width) float32: the block's update at each step of image `index`
        ((steps, channels, tokens) for a text stream `<block>:text`).
        The first image of a shard reads (and checks) the block's whole tensor of that shard."""
        self._shape(block)
        if self.kind == LM_KIND:
            raise StoreError(f"the store at {self.path} holds language-model tokens, not images: read it with "
                             f".batches(block, batch_size) or .token_table()")
        if not 0 <= index < len(self):
            raise IndexError(f"image {index} out of range: the store has {len(self)} images")
        shard = self.shards[index // self.manifest["images_per_shard"]]
        if self._unchecked(shard, block):
            return self._read(shard, block)[index - shard["start"]].float()
        try:
            with safe_open(str(self.path / shard["file"]), framework="pt") as f:
                return f.get_slice(block)[index - shard["start"]].float()
        except Exception as err:  # safetensors' own error type: a truncated file, a broken header
            raise self._damaged(shard, f"cannot be read ({err})") from None

    def _shard_vectors(self, shard: dict, block: str) -> torch.Tensor:
        """(n * steps * H * W, C) float32: every position of every step of the shard's images (a text stream's
        (n, steps, C, tokens): every token)."""
        x = self._read(shard, block)
        if self.kind == LM_KIND:  # (tokens, d_model)
            return x.float()
        return x.movedim(2, -1).reshape(-1, x.shape[2]).float()

    def token_table(self) -> dict[str, torch.Tensor]:
        """An LM store's token bookkeeping in store order: {"token_index", "sequence", "position", "token_id"},
        each (n_tokens,) int64 (sequence: index into the corpus' cut sequences; position: within it)."""
        self._require_lm("token_table")
        keys = (LM_INDEX, "sequence", "position", "token_id")
        parts = {key: [] for key in keys}
        for shard in self.shards:
            for key in keys:
                parts[key].append(self._read(shard, key))
        return {key: torch.cat(values) for key, values in parts.items()}

    def batches(self, block: str, batch_size: int, shuffle: bool = True, seed: int = 0,
                buffer_vectors: int = 1 << 18, drop_last: bool = False) -> Iterator[torch.Tensor]:
        """One pass over every vector of the block, as float32 (batch, channels) tensors.

        Shuffling is by window: shards are visited in a random order and read until at
        least `buffer_vectors` vectors are in memory, which are shuffled together and
        yielded; memory stays about `buffer_vectors * channels * 4` bytes, not the store.
        """
        self._shape(block)
        if batch_size < 1:
            raise StoreError(f"batch_size must be positive, not {batch_size}")
        order = list(range(len(self.shards)))
        generator = torch.Generator().manual_seed(seed)
        if shuffle:
            random.Random(seed).shuffle(order)
        buffer: list[torch.Tensor] = []
        held = 0
        carry = None
        for position, shard_index in enumerate(order):
            vectors = self._shard_vectors(self.shards[shard_index], block)
            buffer.append(vectors)
            held += len(vectors)
            last = position == len(order) - 1
            if held < buffer_vectors and not last:
                continue
            window = torch.cat(([carry] if carry is not None else []) + buffer)
            buffer, held = [], 0
            if shuffle:
                window = window[torch.randperm(len(window), generator=generator)]
            n_full = len(window) // batch_size * batch_size
            for i in range(0, n_full, batch_size):
                yield window[i:i + batch_size]
            carry = window[n_full:] if n_full < len(window) else None
        if carry is not None and len(carry) and not drop_last:
            yield carry


# ----------------------------------------------------------------------------- streaming

def stream_vectors(model, block: str, prompts: Iterable[str], batch_size: int, steps: int | None = None,
                   guidance: float | None = None, seed: int = 0, images_per_generation: int = 8,
                   shuffle: bool = True, buffer_vectors: int = 1 << 16, half: str = "cond") -> Iterator[torch.Tensor]:
    """Float32 (batch, channels) vectors of a block's updates, straight from generation (no disk).

    prompts may be endless (a generator); image i gets seed `seed + i`. Vectors are
    shuffled within a window of about `buffer_vectors`; the last partial batch is yielded.
    """
    generator = torch.Generator().manual_seed(seed)
    steps = model.default_steps if steps is None else steps
    guidance = model.default_guidance if guidance is None else guidance
    pending: list[torch.Tensor] = []
    held = 0
    carry = None
    image_index = 0
    prompt_iter = iter(prompts)

    def emit(final: bool):
        nonlocal carry, pending, held
        window = torch.cat(([carry] if carry is not None else []) + pending)
        pending, held = [], 0
        if shuffle:
            window = window[torch.randperm(len(window), generator=generator)]
        n_full = len(window) // batch_size * batch_size
        for i in range(0, n_full, batch_size):
            yield window[i:i + batch_size]
        carry = window[n_full:]
        if final and len(carry):
            yield carry

    while True:
        chunk = [p for _, p in zip(range(images_per_generation), prompt_iter)]
        if not chunk:
            break
        seeds = list(range(seed + image_index, seed + image_index + len(chunk)))
        image_index += len(chunk)
        with capture_updates(model, [block], device="cpu") as cap:
            generate(model, chunk, steps=steps, seed=seeds, guidance=guidance, output_type="latent")
        x = cap.updates(block, half)  # (steps, n, C, H, W); a text stream's (steps, n, C, tokens)
        vectors = x.transpose(0, 1).movedim(2, -1).reshape(-1, x.shape[2]).float()
        pending.append(vectors)
        held += len(vectors)
        if held >= buffer_vectors:
            yield from emit(final=False)
    if pending or (carry is not None and len(carry)):
        yield from emit(final=True)


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
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available; "
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
    lm.add_argument("--backend", choices=("hf", "transformer_lens"), default="hf")
    lm.add_argument("--threads", type=at_least(1), default=None, help="torch threads (default: torch's)")
    add_dtype_argument(parser, default=None, what="the model (recorded in the plan)", said=MIXED_DEFAULT)
    parser.add_argument("--out", required=True, help="store directory (created; resumed if it holds this plan)")


def collect_command(args) -> int:
    from tqdm import tqdm

    from .models import load_t2i

    from .lm_text import is_language_model

    if is_language_model(args.model):
        args.dtype = args.dtype or "float32"
        return lm_collect_command(args)
    if args.text is not None:
        raise StoreError(f"--text is for language models; {args.model} is a text-to-image model: give --prompts "
                         f"or --world")
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
        model = load_t2i(args.model, device=device, dtype=parse_dtype(args.dtype) if args.dtype else None)
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

"""The language-model collector: a language model's residuals at hook names, token by token of a corpus
(`LMCollectionPlan`, `collect_lm`), into an activation store (`interp.store`: its format, writer steps and reader),
and the `python -m interp collect --text` command's body (`lm_collect_command`; `interp.collect.collect_command`
sends a language model here). Under `torchrun` the ranks share the shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch

from .cli import parse_dtype
from .distributed import joined_ranks, torchrun_rank
from .store import (FORMAT, LM_INDEX, LM_KIND, MANIFEST_FILE, SHARD_DIR, STORE_DTYPE, VERSION, ActivationStore,
                    StoreError, StorePlan, check_plan, prepare_directory, shard_is_whole, shard_name, write_manifest,
                    write_resumable_shard)

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
    rank, world_size = torchrun_rank()
    with joined_ranks(world_size) as barrier:  # torchrun: every rank builds the same plan, and writes its share
        manifest = collect_lm(lm, plan, sequences, selected, args.out, rank=rank, world_size=world_size,
                              barrier=barrier)
    if rank != 0:
        return 0
    store = ActivationStore(manifest.parent)
    print(f"wrote {manifest} ({store.n_tokens:,} tokens from {plan.n_sequences:,} sequences, {len(store.shards)} "
          f"shards; {', '.join(store.blocks)}: d_model {lm.d_model})")
    return 0

"""Training loop: any iterable of (batch, d_in) float tensors -> an SAE directory.

    out/
      cfg.json, sae_weights.safetensors   the trained SAE (sae-lens format), written at the end
      checkpoint.pt                       trainer state; replaced atomically, resumed from
      train_log.jsonl                     one JSON line per logged step (steps strictly increasing)
      train_summary.json                  the config and final metrics

Resuming replays the stream up to where the run stopped (the skipped batches are read but
not trained on), so a resumed run sees the same data as an uninterrupted one; log lines of
steps after the checkpoint are dropped, as the resumed run writes them again. Under
`torchrun` (DDP) every rank passes its own shard of the stream (equal batch sizes); every
architecture trains on the GLOBAL batch (the ranks' batches, rank 0's first): averaged gradients,
and the batch-level rules (loss normalisation, BatchTopK's threshold, dead-latent counts, the
geometric median of the first batch) taken over all ranks, so the weights equal one process's on
the concatenated batches (tests/test_saes_distributed.py); rank 0 writes the files.

A run that diverges (a non-finite metric or weight, or an explained variance below
MIN_EXPLAINED_VARIANCE) stops with `TrainingDivergedError` before writing anything more: the
last checkpoint and any SAE files already in the directory stay as they were.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import torch
import torch.distributed as dist

from interp.atomic import atomic_write, atomic_write_text
from interp.cli import add_out_argument, at_least, parse_options

from .sae import SAE
from .strict_json import dumps, write_json
from .trainers import TRAINERS, TRANSCODER_TRAINERS, make_trainer

CHECKPOINT_FILENAME = "checkpoint.pt"
LOG_FILENAME = "train_log.jsonl"
SUMMARY_FILENAME = "train_summary.json"
CHECKPOINT_FORMAT = 1
# Fields that may change between a run and its resumption (how long, how often to report).
RESUMABLE_CHANGES = ("total_tokens", "log_every_steps", "checkpoint_every_steps", "shard_latents")
# A fresh SAE explains about none of the variance (0); below -1000 its error is a thousand times
# the activations' variance, which only a diverged run reaches (--lr 1e6 gives -1e13 at step 2).
MIN_EXPLAINED_VARIANCE = -1e3


class CheckpointMismatchError(ValueError):
    """The checkpoint in the output directory was made with a different config, or is unreadable."""


class TrainingDivergedError(FloatingPointError):
    """Training diverged; the message says where, and which checkpoint is kept."""


@dataclass
class TrainConfig:
    """One SAE training run. options: architecture-specific settings (see saes.trainers)."""

    architecture: str = "topk"
    d_in: int = 1280
    d_sae: int = 5120
    k: int = 10
    batch_size: int = 4096
    lr: float = 1e-4
    total_tokens: int = 20_000_000
    dead_after_tokens: int = 10_000_000
    options: dict = field(default_factory=dict)
    log_every_steps: int = 10
    checkpoint_every_steps: int = 100
    seed: int = 0
    metadata: dict = field(default_factory=dict)  # hook_name (block), model_name, store path
    autocast: bool = False  # topk: the dense encoder product in bf16 (it only picks the latents; docs/dtype.md)
    shard_latents: bool = False  # topk under torchrun: each rank holds d_sae / world latents (saes/sharded.py)
    d_out: int = 0  # transcoders: the target's width (each batch row is input then target); 0 for an SAE

    def validate(self) -> "TrainConfig":
        if self.architecture not in TRAINERS:
            raise ValueError(f"unknown architecture {self.architecture!r}; choose one of {', '.join(sorted(TRAINERS))}")
        if self.architecture in ("topk", "batchtopk", "matryoshka", "lens-topk", "topk-transcoder",
                                 "batchtopk-transcoder") and not 0 < self.k <= self.d_sae:
            raise ValueError(f"k={self.k} must be between 1 and the number of latents d_sae={self.d_sae}")
        for name in ("d_in", "d_sae", "batch_size", "total_tokens", "dead_after_tokens", "log_every_steps",
                     "checkpoint_every_steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.shard_latents and (self.architecture != "topk" or self.autocast):
            raise ValueError("--shard-latents is an option of the topk trainer, without --autocast")
        if self.d_out < 0:
            raise ValueError(f"d_out must be positive for a transcoder (0 for an SAE), got {self.d_out}")
        if self.autocast and self.architecture != "topk":
            raise ValueError(f"autocast is an option of the topk trainer (its dense encoder product), not of "
                             f"{self.architecture}")
        return self

    def memory_bytes(self, world: int = 1) -> int:
        """A lower bound of the memory training needs: encoder and decoder with their gradients and
        Adam's two moments (float32), and one batch of dense pre-activations with its gradient. With
        shard_latents over `world` ranks, each rank holds 1 / world of the weights and the pre-activations
        of the global batch (world x batch_size rows) for its latents: the same batch_size x d_sae numbers."""
        shards = world if self.shard_latents else 1
        return 4 * (8 * self.d_sae * self.d_in // shards + 2 * self.batch_size * self.d_sae)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        return cls(**values).validate()


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def check_batch(batch: torch.Tensor, d_in: int, step: int) -> torch.Tensor:
    """Clear errors for activations the SAE cannot train on; returns float32 (batch, d_in)."""
    if not isinstance(batch, torch.Tensor):
        raise TypeError(f"batch {step}: expected a torch.Tensor, got {type(batch).__name__}")
    if batch.ndim != 2 or batch.shape[1] != d_in:
        raise ValueError(f"batch {step}: activations have shape {tuple(batch.shape)}, but the SAE expects "
                         f"(batch, {d_in}); d_in must match the block's channel count")
    batch = batch.float()
    if not torch.isfinite(batch).all():
        bad = int((~torch.isfinite(batch)).sum())
        raise ValueError(f"batch {step}: activations contain {bad} NaN or Inf values")
    return batch


def check_same_config(config: TrainConfig) -> None:
    """Under torchrun every rank must train the same SAE on the same store: one line naming what differs."""
    mine = config.to_dict()
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    for rank, theirs in enumerate(everyone):
        differing = sorted(key for key in mine if theirs.get(key) != mine.get(key))
        if differing:
            details = "; ".join(f"{key}: rank 0 {everyone[0].get(key)!r}" + "".join(
                f", rank {r} {other.get(key)!r}" for r, other in enumerate(everyone) if r) for key in differing)
            raise ValueError(f"the ranks were started with different settings or stores ({details}); start every "
                             "rank with the same command")


def check_equal_batches(batch: torch.Tensor, step: int) -> None:
    """Under DDP every rank must train on as many rows as the others at each step: the averaged gradients
    equal the global batch's only then. One all-reduce of two numbers; the same error on every rank."""
    sizes = torch.tensor([batch.shape[0], -batch.shape[0]], dtype=torch.int64)
    dist.all_reduce(sizes, op=dist.ReduceOp.MAX)
    if int(sizes[0]) != -int(sizes[1]):
        raise ValueError(f"batch {step}: the ranks' batches hold between {-int(sizes[1])} and {int(sizes[0])} rows; "
                         "under torchrun every rank must pass batches of the same size")


def gather_rows(batch: torch.Tensor) -> torch.Tensor:
    """All ranks' rows, rank 0's first (equal counts per rank): the global batch."""
    parts = [torch.empty_like(batch) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, batch.contiguous())
    return torch.cat(parts)


def mean_over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics of the global batch (each rank's, averaged), identical on every rank, so that every rank
    takes the same decision on divergence."""
    names = sorted(metrics)
    values = torch.tensor([metrics[name] for name in names], dtype=torch.float64)
    dist.all_reduce(values)
    values /= dist.get_world_size()
    return dict(zip(names, values.tolist()))


def _format_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def check_memory(config: TrainConfig, world: int = 1) -> None:
    """Refuse, before anything is allocated, a size that this machine's memory cannot hold."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return  # no sysconf here: the allocation itself will tell
    need = config.memory_bytes(world)
    if need > total:
        raise ValueError(f"d_sae={config.d_sae} latents of d_in={config.d_in} channels with batch_size="
                         f"{config.batch_size} need at least {_format_bytes(need)} of memory to train; this "
                         f"machine has {_format_bytes(total)}: choose a smaller --d-sae or --batch-size")


def divergence(metrics: dict[str, float]) -> str | None:
    """What says that training diverged (a non-finite metric, an absurd explained variance), or None."""
    bad = [f"{name} {value}" for name, value in metrics.items() if not math.isfinite(value)]
    if bad:
        return ", ".join(bad)
    if metrics.get("explained_variance", 0.0) < MIN_EXPLAINED_VARIANCE:
        return f"explained variance {metrics['explained_variance']:.3g}"
    return None


def non_finite_weights(trainer) -> list[str]:
    """Names of the trainer's SAE parameters that hold a NaN or an infinity."""
    return [name for name, param in trainer.sae.named_parameters() if not torch.isfinite(param).all()]


def trim_log(path: Path, step: int) -> None:
    """Keep the log lines of steps up to `step` (the checkpoint resumed from; the resumed run logs the later
    steps again, so steps stay strictly increasing). A line cut short by a crash ends the log."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            break
        if entry["step"] <= step:
            kept.append(line)
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def atomic_torch_save(obj, target: Path) -> None:
    """torch.save to a temporary file, then os.replace: a crash never leaves a half-written target."""
    atomic_write(target, lambda tmp: torch.save(obj, tmp))


def load_checkpoint(path: Path, config: TrainConfig) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, corrupt, or not tensors and numbers only
        detail = ": ".join([type(err).__name__, *str(err).splitlines()[:1]])
        raise CheckpointMismatchError(f"{path} cannot be read ({detail}); "
                                      "delete it, or pass --restart, to start over") from None
    if state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointMismatchError(f"{path} is not a checkpoint of this trainer (format {state.get('format')})")
    saved, current = dict(state["config"]), config.to_dict()
    saved.setdefault("autocast", False)  # checkpoints from before the option trained in float32
    saved.setdefault("shard_latents", False)
    saved.setdefault("d_out", 0)  # checkpoints from before transcoders: SAEs
    differing = sorted(key for key in set(saved) | set(current)
                       if key not in RESUMABLE_CHANGES and saved.get(key) != current.get(key))
    if differing:
        details = "; ".join(f"{key}: checkpoint {saved.get(key)!r} vs now {current.get(key)!r}" for key in differing)
        raise CheckpointMismatchError(f"{path} was made with a different config ({details}). "
                                      "Use another --out directory, or delete the checkpoint to start over.")
    return state


def train(config: TrainConfig, batches: Iterable[torch.Tensor], out_dir: str | os.PathLike,
          resume: bool = True, progress: bool = True) -> SAE:
    """Train until config.total_tokens (counted over all ranks); returns the inference SAE."""
    config.validate()
    rank, world = _rank_and_world()
    if world > 1:
        check_same_config(config)
        if config.shard_latents:
            from .sharded import check_shardable

            check_shardable(config.d_sae, world)
    out = Path(out_dir)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    check_memory(config, world)
    trainer = make_trainer(config)
    checkpoint_path = out / CHECKPOINT_FILENAME
    step, tokens_seen, state = 0, 0, {}
    if resume and checkpoint_path.is_file():
        state = load_checkpoint(checkpoint_path, config)
        trainer.load_state_dict(state["trainer"])
        step, tokens_seen = int(state["step"]), int(state["tokens_seen"])
        if rank == 0:
            trim_log(out / LOG_FILENAME, step)
    elif checkpoint_path.is_file() and rank == 0:
        checkpoint_path.unlink()
    if world > 1:
        dist.barrier()
    checkpoint_step = step  # the step of the checkpoint on disk (0: none)

    def diverged(at_step: int, what: str) -> TrainingDivergedError:
        kept = (f"the checkpoint of step {checkpoint_step} in {out} is kept" if checkpoint_step else
                "no checkpoint had been written")
        return TrainingDivergedError(f"training diverged at step {at_step} ({what}); {kept}, and the SAE files "
                                     f"there are unchanged. Lower the learning rate (lr={config.lr}) and run "
                                     "again with --restart, or into another --out")

    def save_checkpoint() -> None:
        nonlocal checkpoint_step
        bad = non_finite_weights(trainer)
        if world > 1:  # every rank takes the same decision (a sharded rank sees only its own latents)
            flags = [None] * world
            dist.all_gather_object(flags, bad)
            bad = sorted({name for names in flags for name in names})
        if bad:
            raise diverged(step, f"NaN or Inf in {', '.join(bad)}")
        trainer_state = trainer.state_dict()  # sharded: a collective that gathers the whole SAE
        if rank == 0:
            atomic_torch_save({"format": CHECKPOINT_FORMAT, "config": config.to_dict(), "step": step,
                               "tokens_seen": tokens_seen, "metrics": metrics, "trainer": trainer_state},
                              checkpoint_path)
        checkpoint_step = step
        if world > 1:
            dist.barrier()

    stream: Iterator[torch.Tensor] = iter(batches)
    for skipped in range(step):  # replay what the interrupted run already trained on
        if next(stream, None) is None:
            raise ValueError(f"the activation stream ended after {skipped} batches while resuming at step {step}")

    bar = None
    if progress and rank == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=config.total_tokens, initial=min(tokens_seen, config.total_tokens), unit="tok",
                   unit_scale=True, desc=f"train {config.architecture}")
    log_file = open(out / LOG_FILENAME, "a" if step > 0 else "w") if rank == 0 else None
    metrics: dict[str, float] = dict(state["metrics"]) if step > 0 else {}
    in_step = False
    started, tokens_at_start = time.perf_counter(), tokens_seen
    try:
        while tokens_seen < config.total_tokens:
            batch = next(stream, None)
            if batch is None:
                if step == 0:
                    raise ValueError("the activation stream is empty")
                break  # the stream ran out: finish with what was seen
            batch = check_batch(batch, config.d_in + config.d_out, step)
            if world > 1:
                check_equal_batches(batch, step)
            if step == 0:
                trainer.prepare(gather_rows(batch) if world > 1 else batch)
            in_step = True  # the weights may be half-updated until step is counted
            metrics = trainer.step(batch)
            if world > 1:
                metrics = mean_over_ranks(metrics)
            problem = divergence(metrics)
            if problem is not None:
                raise diverged(step + 1, problem)
            step += 1
            n_tokens = batch.shape[0] * world
            tokens_seen += n_tokens
            in_step = False
            if bar is not None:
                bar.update(n_tokens)
            if step % config.log_every_steps == 0 or tokens_seen >= config.total_tokens:
                record = {"step": step, "tokens": tokens_seen, **metrics, "dead_features": trainer.n_dead(),
                          "tokens_per_s": (tokens_seen - tokens_at_start) / max(time.perf_counter() - started, 1e-9)}
                if log_file is not None:
                    log_file.write(dumps(record) + "\n")
                    log_file.flush()
                if bar is not None:
                    bar.set_postfix(loss=f"{metrics['loss']:.4f}", ev=f"{metrics['explained_variance']:.3f}",
                                    l0=f"{metrics['l0']:.1f}", dead=record["dead_features"])
            if step % config.checkpoint_every_steps == 0:
                save_checkpoint()
    except KeyboardInterrupt:
        if step > 0 and not in_step:
            save_checkpoint()  # the interrupted run resumes from here (else from the last checkpoint)
        raise
    finally:
        if bar is not None:
            bar.close()
        if log_file is not None:
            log_file.close()
    save_checkpoint()
    sae = trainer.to_inference(**config.metadata, architecture_trained=config.architecture,
                               trained_tokens=tokens_seen)
    dead = trainer.n_dead()  # sharded: a collective
    if rank == 0:
        sae.save(out)
        summary = {"config": config.to_dict(), "steps": step, "tokens": tokens_seen,
                   "final_metrics": {**metrics, "dead_features": dead}}
        write_json(out / SUMMARY_FILENAME, summary, indent=2)
    if world > 1:
        dist.barrier()
    return sae


def open_store(path: str, block: str):
    """(the store, the block's name in it): the store names blocks as the model does, without `unet.`."""
    from interp.store import ActivationStore  # written by interp; imported only when a store is used

    store = ActivationStore(path)
    name = block.removeprefix("unet.")
    if name not in store.blocks:
        raise ValueError(f"block {block!r} is not in the store at {path}; it has: {', '.join(store.blocks)}")
    return store, name


def store_channels(store, block: str) -> int:
    """The block's channel count: from the store's manifest if it says, else from a first batch."""
    if hasattr(store, "channels"):
        return int(store.channels(block))
    first = next(iter(store.batches(block, batch_size=2, shuffle=False)), None)
    if first is None:
        raise ValueError(f"block {block!r} of the store holds no activations")
    return int(first.shape[1])


def store_metadata(store, block: str, path: str) -> dict:
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


def add_train_arguments(parser) -> None:
    """`saes train`: the store and block, the architecture and its sizes, the schedule, resuming."""
    parser.add_argument("--store", required=True, help="activation store directory (python -m interp collect)")
    parser.add_argument("--block", required=True, help="block name, e.g. unet.mid_block.attentions.0")
    add_out_argument(parser, required=True, help="output directory: SAE, checkpoint, train_log.jsonl")
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


def train_command(args) -> int:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        from interp.distributed import init_process_group

        init_process_group()
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.set_num_threads(args.threads)
    store, block = open_store(args.store, args.block)
    target = None
    if (args.target_block is None) != (args.architecture not in TRANSCODER_TRAINERS):
        raise ValueError(f"--target-block goes with a transcoder architecture ({', '.join(TRANSCODER_TRAINERS)}) "
                         "and a transcoder architecture needs it")
    metadata = store_metadata(store, block, args.store)
    if args.target_block is not None:
        target = open_store(args.store, args.target_block)[1]
        metadata["hook_name_out"] = target
    config = TrainConfig(architecture=args.architecture, d_in=store_channels(store, block),
                         d_out=store_channels(store, target) if target else 0, d_sae=args.d_sae, k=args.k,
                         batch_size=args.batch_size, lr=args.lr, total_tokens=args.tokens,
                         dead_after_tokens=args.dead_after_tokens, options=parse_options(args.option),
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

"""A transcoder for every layer of a language model from one forward pass per batch (`saes train-transcoders`).

Collecting each layer's MLP input and output into a store and training the layers one after another reads the
model once per layer's store and writes d_model x 2 x n_layers numbers per token to disk; on a CPU the model's
forward pass costs about as much as training all of its layers' transcoders, so this trains them side by side:
each chunk of whole documents runs through the model once (the MLP's input and output of every layer recorded by
`interp.hooks.lm_replace.MLPOutputEdit`, the start token left out as in `saes transcoder-eval`), and every layer's
trainer (`saes.trainers`' topk- / batchtopk-transcoder, unchanged) takes ``epochs`` shuffled passes over that
chunk's (input, target) rows in batches of ``batch_size``.

    out/
      progress.json                  the configuration and, per layer, the documents it has trained on
      layerL/checkpoint.pt           each layer's trainer state and its position (documents done)
      layerL/train_log.jsonl         one line per logged step
      blocks.L.mlp.hook_in/          each layer's transcoder (sae-lens format), written when it has finished

Resumable per layer: each layer's checkpoint records how many documents it has trained on; a resumed run reads
from the smallest such position, and a layer trains only on chunks past its own, so it sees the same batches as
an uninterrupted run. Chunks are fixed document ranges, so the same corpus gives the same chunks.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from interp.atomic import atomic_write, atomic_write_text

from .strict_json import dumps as strict_dumps

MAX_LAYERS = 256
MAX_DOCUMENTS = 1_000_000


@dataclass
class TranscoderSetConfig:
    architecture: str = "batchtopk-transcoder"
    d_sae: int = 1024
    k: int = 32
    batch_size: int = 1024
    lr: float = 1e-3
    chunk_tokens: int = 4096  # tokens of whole documents per forward pass group (the rows shuffled together)
    epochs: int = 2  # passes over each chunk's rows
    total_tokens: int = 200_000  # distinct tokens read from the corpus (each trained on `epochs` times)
    dead_after_tokens: int = 200_000
    context: int = 1024
    checkpoint_every_chunks: int = 8
    log_every_steps: int = 10
    seed: int = 0
    layers: list[int] = field(default_factory=list)  # empty: every layer
    options: dict = field(default_factory=dict)

    def validate(self) -> "TranscoderSetConfig":
        from .trainers import TRANSCODER_TRAINERS

        if self.architecture not in TRANSCODER_TRAINERS:
            raise ValueError(f"architecture must be one of {', '.join(TRANSCODER_TRAINERS)}, got {self.architecture!r}")
        for name in ("d_sae", "k", "batch_size", "chunk_tokens", "epochs", "total_tokens", "dead_after_tokens",
                     "context", "checkpoint_every_chunks", "log_every_steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.k > self.d_sae:
            raise ValueError(f"k={self.k} must be at most d_sae={self.d_sae}")
        if self.chunk_tokens < self.batch_size:
            raise ValueError(f"a chunk ({self.chunk_tokens} tokens) must hold at least one batch ({self.batch_size})")
        if self.epochs > 16:
            raise ValueError(f"epochs must be at most 16, got {self.epochs}")
        if len(self.layers) > MAX_LAYERS:
            raise ValueError(f"at most {MAX_LAYERS} layers")
        return self


def _chunks(sequences: list[list[int]], chunk_tokens: int, total_tokens: int,
            min_tokens: int = 1) -> list[tuple[int, int]]:
    """Fixed [start, end) ranges of whole sequences of at least chunk_tokens trained tokens each (the start token is
    not trained on), until total_tokens are read; a last, shorter chunk is kept if it holds min_tokens."""
    chunks, start, end, count, seen = [], 0, 0, 0, 0
    for seq in sequences:
        if seen >= total_tokens:
            break
        count += len(seq) - 1
        seen += len(seq) - 1
        end += 1
        if count >= chunk_tokens:
            chunks.append((start, end))
            start, count = end, 0
    if count >= min_tokens:
        chunks.append((start, end))
    return chunks


def _mlp_rows(lm, sequences: list[list[int]], layers: list[int], pad_batch: int = 8) -> dict[int, torch.Tensor]:
    """{layer: (tokens, 2 * d_model)} each layer's MLP (input, output) at every real position but the start token."""
    from interp.hooks.lm import right_padded
    from interp.hooks.lm_replace import MLPOutputEdit

    rows: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    for start in range(0, len(order), pad_batch):
        chunk = [sequences[i] for i in order[start:start + pad_batch]]
        ids, mask = right_padded(lm, chunk)
        keep = mask.bool().clone()
        keep[:, 0] = False
        got: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def recorder(layer):
            def record(x, y):
                got[layer] = (x, y)
                return y
            return record

        with torch.no_grad(), MLPOutputEdit(lm, {layer: recorder(layer) for layer in layers}):
            body = getattr(lm.model, "model", None)
            (body if isinstance(body, torch.nn.Module) else lm.model)(input_ids=ids, attention_mask=mask)
        for layer in layers:
            x, y = got[layer]
            rows[layer].append(torch.cat([x[keep], y[keep]], -1).float())
    return {layer: torch.cat(parts) for layer, parts in rows.items()}


def _check_memory(layer_config, n_layers: int) -> None:
    """Refuse, before anything is allocated or written, sizes whose side-by-side training of every layer's
    transcoder (encoder and decoder, their gradients and Adam's moments, a batch of pre-activations: saes.train's
    lower bound, for each layer) this machine's memory cannot hold."""
    from .train import _format_bytes

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return  # no sysconf here: the allocation itself will tell
    need = layer_config.memory_bytes() * n_layers
    if need > total:
        raise ValueError(f"{n_layers} transcoder(s) of d_sae={layer_config.d_sae} latents on d_in={layer_config.d_in} "
                         f"channels with batch_size={layer_config.batch_size} need at least {_format_bytes(need)} of "
                         f"memory to train side by side; this machine has {_format_bytes(total)}: choose a smaller "
                         f"--d-sae or --batch-size, or fewer --layers")


def train_transcoder_set(lm, sequences: list[list[int]], out: str | os.PathLike, config: TranscoderSetConfig,
                         model_name: str, dataset: str = "", log=print) -> dict[int, Path]:
    """Train one transcoder per layer of ``lm`` on ``sequences`` (start token first) into ``out``; resumes from
    the checkpoints there. Returns {layer: the transcoder's directory}."""
    from .train import TrainConfig
    from .trainers import make_trainer

    config.validate()
    out = Path(out)
    layers = list(config.layers) or list(range(lm.n_layers))
    bad = [layer for layer in layers if not 0 <= layer < lm.n_layers]
    if bad:
        raise ValueError(f"layer(s) {bad} outside 0..{lm.n_layers - 1} of {model_name}")
    if len(sequences) > MAX_DOCUMENTS:
        raise ValueError(f"at most {MAX_DOCUMENTS} sequences")
    progress_path = out / "progress.json"
    saved_config = {**asdict(config), "layers": layers, "model_name": model_name}
    if progress_path.is_file():
        previous = json.loads(progress_path.read_text())
        changed = sorted(k for k in saved_config if k not in ("total_tokens", "checkpoint_every_chunks",
                                                              "log_every_steps")
                         and previous["config"].get(k) != saved_config[k])
        if changed:
            raise ValueError(f"{out} holds a run with other settings ({', '.join(changed)}): give another --out")
    d_model = lm.d_model

    def layer_config(layer: int) -> TrainConfig:
        return TrainConfig(architecture=config.architecture, d_in=d_model, d_out=d_model, d_sae=config.d_sae,
                           k=config.k, batch_size=config.batch_size, lr=config.lr, total_tokens=config.total_tokens,
                           dead_after_tokens=config.dead_after_tokens, options=dict(config.options),
                           seed=config.seed + layer).validate()

    _check_memory(layer_config(layers[0]), len(layers))  # every layer trains side by side: before any write
    out.mkdir(parents=True, exist_ok=True)
    chunks = _chunks(sequences, config.chunk_tokens, config.total_tokens, config.batch_size)
    trainers, done, steps, logs = {}, {}, {}, {}
    for layer in layers:
        tc = layer_config(layer)
        trainer = make_trainer(tc)
        ckpt = out / f"layer{layer}" / "checkpoint.pt"
        done[layer], steps[layer] = 0, 0
        if ckpt.is_file():
            state = torch.load(ckpt, map_location="cpu", weights_only=True)  # tensors and numbers only
            trainer.load_state_dict(state["trainer"])
            done[layer], steps[layer] = int(state["chunks_done"]), int(state["steps"])
        trainers[layer] = trainer
        (out / f"layer{layer}").mkdir(exist_ok=True)
        logs[layer] = open(out / f"layer{layer}" / "train_log.jsonl", "a")

    def write_progress():
        atomic_write_text(progress_path, strict_dumps({"config": saved_config, "chunks": len(chunks),
                                                     "chunks_done": {str(l): done[l] for l in layers}}, indent=1))

    def checkpoint(layer):
        state = {"trainer": trainers[layer].state_dict(), "chunks_done": done[layer], "steps": steps[layer]}
        atomic_write(out / f"layer{layer}" / "checkpoint.pt", lambda tmp: torch.save(state, tmp))

    write_progress()
    first = min(done.values()) if done else len(chunks)
    t0, tokens_read = time.time(), 0
    for index in range(first, len(chunks)):
        lo, hi = chunks[index]
        live = [layer for layer in layers if done[layer] <= index]
        rows = _mlp_rows(lm, sequences[lo:hi], live)
        n = next(iter(rows.values())).shape[0]
        tokens_read += n
        for layer in live:
            data, trainer = rows[layer], trainers[layer]
            if index == 0:
                trainer.prepare(data)
            generator = torch.Generator().manual_seed(config.seed * 1_000_003 + index)
            for epoch in range(config.epochs):
                order = torch.randperm(n, generator=generator)
                for b in range(0, n - config.batch_size + 1, config.batch_size):
                    metrics = trainer.step(data[order[b:b + config.batch_size]])
                    steps[layer] += 1
                    if steps[layer] % config.log_every_steps == 0:
                        logs[layer].write(strict_dumps({"chunk": index, "epoch": epoch, **metrics}) + "\n")
                        logs[layer].flush()
            done[layer] = index + 1
        del rows
        last = index == len(chunks) - 1
        if (index + 1) % config.checkpoint_every_chunks == 0 or last:
            for layer in live:
                checkpoint(layer)
            write_progress()
        elapsed = time.time() - t0
        log(f"chunk {index + 1}/{len(chunks)}: {n} tokens, {len(live)} layers, {elapsed:.0f}s "
            f"({tokens_read / max(elapsed, 1e-9):.1f} tokens/s)")
    for f in logs.values():
        f.close()
    written = {}
    trained_tokens = sum(sum(len(s) - 1 for s in sequences[lo:hi]) for lo, hi in chunks)
    for layer in layers:
        trainer = trainers[layer]
        sae = trainer.to_inference(
            hook_name=f"blocks.{layer}.mlp.hook_in", hook_name_out=f"blocks.{layer}.mlp.hook_out",
            model_name=model_name, context_size=config.context, prepend_bos=True, dataset_path=dataset,
            architecture_trained=config.architecture, trained_tokens=trained_tokens * config.epochs,
            distinct_tokens=trained_tokens)
        target = out / f"blocks.{layer}.mlp.hook_in"
        sae.save(target)
        last_metrics = {}
        log_file = out / f"layer{layer}" / "train_log.jsonl"
        if log_file.is_file():
            lines = log_file.read_text().splitlines()
            last_metrics = json.loads(lines[-1]) if lines else {}
        atomic_write_text(target / "train_summary.json", strict_dumps(
            {"config": saved_config, "layer": layer, "steps": steps[layer], "n_dead": trainer.n_dead(),
             "final_metrics": last_metrics, "trained_tokens": trained_tokens * config.epochs,
             "distinct_tokens": trained_tokens}, indent=1))
        written[layer] = target
    return written


# ----------------------------------------------------------------------------- command line

def add_arguments(parser) -> None:
    """`saes train-transcoders`: a transcoder for every layer, one forward pass per chunk of text."""
    from interp.cli import add_out_argument, at_least

    from .trainers import TRANSCODER_TRAINERS

    parser.add_argument("--model", required=True)
    parser.add_argument("--text", required=True, help="training text (JSONL or lines), whole documents")
    add_out_argument(parser, required=True, help="run directory (checkpoints, then one transcoder per layer)")
    parser.add_argument("--architecture", choices=TRANSCODER_TRAINERS, default="batchtopk-transcoder")
    parser.add_argument("--d-sae", type=at_least(1), default=1024)
    parser.add_argument("--k", type=at_least(1), default=32)
    parser.add_argument("--batch-size", type=at_least(1), default=1024)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--tokens", type=at_least(1), default=200_000, help="distinct corpus tokens read")
    parser.add_argument("--epochs", type=at_least(1), default=2, help="passes over each chunk's rows (<= 16)")
    parser.add_argument("--chunk-tokens", type=at_least(1), default=4096)
    parser.add_argument("--dead-after-tokens", type=at_least(1), default=200_000)
    parser.add_argument("--context", type=at_least(2), default=1024)
    parser.add_argument("--layers", type=int, nargs="*", default=[])
    parser.add_argument("--checkpoint-every-chunks", type=at_least(1), default=8)
    parser.add_argument("--threads", type=at_least(1), default=1)
    parser.add_argument("--seed", type=int, default=0)


def command(args) -> int:
    from interp.lm_text import read_documents, token_sequences
    from interp.models.lm import load_lm

    torch.set_num_threads(args.threads)
    config = TranscoderSetConfig(
        architecture=args.architecture, d_sae=args.d_sae, k=args.k, batch_size=args.batch_size, lr=args.lr,
        chunk_tokens=args.chunk_tokens, epochs=args.epochs, total_tokens=args.tokens,
        dead_after_tokens=args.dead_after_tokens, context=args.context,
        checkpoint_every_chunks=args.checkpoint_every_chunks, seed=args.seed, layers=list(args.layers)).validate()
    documents = read_documents(args.text)
    lm = load_lm(args.model)
    context = min(args.context, lm.n_ctx)
    sequences = [s for s in token_sequences(lm.tokenizer, documents, context) if len(s) >= 2]
    written = train_transcoder_set(lm, sequences, args.out, config, model_name=args.model, dataset=str(args.text),
                                   log=lambda line: print(line, flush=True))
    print(f"wrote {len(written)} transcoders under {args.out}")
    return 0


@torch.no_grad()
def calibrate_thresholds(lm, transcoders: dict, sequences: list[list[int]], k: int) -> dict[int, float]:
    """Set each JumpReLU transcoder's threshold so that ``k`` features fire per token on average over
    ``sequences`` (the smallest of the N x k largest pre-activations of N tokens: what BatchTopK keeps on them).
    A short run's tracked threshold (a running mean of each batch's smallest kept activation, started from the
    untrained encoder's) stays far below that, so many more features fire at inference than in training.
    Returns {layer: threshold}."""
    layers = sorted(transcoders)
    rows = _mlp_rows(lm, sequences, layers)
    found = {}
    for layer in layers:
        tc = transcoders[layer]
        d_in = tc.cfg.d_in
        pre = (rows[layer][:, :d_in].to(tc.W_enc.dtype) @ tc.W_enc + tc.b_enc).float().relu().flatten()
        keep = min(k * rows[layer].shape[0], pre.numel())
        threshold = float(pre.topk(keep, sorted=False).values.min())
        tc.threshold.fill_(threshold)
        found[layer] = threshold
    return found

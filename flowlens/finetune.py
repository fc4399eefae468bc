"""Supervised fine-tuning of any Hugging Face causal LM, with the Variance Concentration Loss as an option.

One training step = ``grad_accum`` micro-batches of ``batch_size`` examples, then one AdamW step.
Per micro-batch, one forward pass gives both the SFT loss (completion tokens only; prompt and
padding are masked with -100) and the residuals of the VCL window: ``blocks.{l}.hook_resid_post``
of each window layer l (the decoder layer's raw output, also for the last layer, before the final
norm), recorded by `interp.hooks.lm.residual_capture` with the graph kept (the capture is scoped
to the training thread's context), so VCL adds only an eigenvalue problem of size min(B, d) per
window layer.

Runs are resumable: ``checkpoint.pt`` (trainable weights, optimizer, RNG, step) is replaced
atomically every ``save_every`` steps and on cancel; data order is a function of (seed, step), so
a resumed run takes the same batches and ends with the same weights as an uninterrupted one.
``base_dtype="bfloat16"`` trains the adapters of a LoRA run (or of a peft model handed in) over a bf16
copy of the frozen weights, under autocast: the trainable weights, their gradients and the optimizer stay
float32, and the float32 frozen weights are put back before anything is evaluated or saved (a fresh
adapter's update is below bf16's resolution, so evaluation in bf16 would not see it). float32, the default,
is the path it always was.

Output directory: ``log.jsonl`` (one line per step: loss, sft_loss, vcl_loss, vcl_ratio),
``eval_before.json`` / ``eval_after.json`` (refusal metrics), ``model/`` (final weights or LoRA
adapter, with the tokenizer), ``result.json``. The data (prompt/completion rows, batches, their order) is
`flowlens.sft_data`'s; the log and its loss curves are `flowlens.training_log`'s.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

import torch

from interp.atomic import atomic_write, atomic_write_text
from interp.cli import (add_backend_argument, add_device_argument, add_dtype_argument, add_out_argument, at_least,
                        parse_dtype)
from interp.hooks.lm import residual_capture
from interp.models.lm import use_chat_template

from .diversity import DataError
from .refusals import MODEL_HELP, add_chat_template_argument, context_length, evaluate_refusals, read_prompt_set
# Example, collate, tokenize_examples and read_log are also imported from here (the SmolLM2 study and the VCL sweep,
# whose committed cells fingerprint their own source, import them by this module's name).
from .sft_data import Example, collate, micro_batch_indices, read_sft_data, tokenize_examples  # noqa: F401
from .training_log import append_log, read_log, trim_log  # noqa: F401
from .vcl import VCLConfig, select_positions, variance_concentration_loss

DEFAULT_MAX_LENGTH = 256  # tokens of prompt + completion, when the model's context allows
# Settings that may change between a run and its resumption; any other change is a different run.
RESUMABLE_CHANGES = ("steps", "save_every", "eval_prompts", "eval_max_new_tokens", "device", "progress")


@dataclass
class FinetuneConfig:
    """A fine-tuning run; ``vcl`` None means plain SFT. Serialises to JSON (``to_json``)."""

    model: str
    data: str
    out: str
    steps: int = 100
    batch_size: int = 8
    grad_accum: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.0
    max_length: int | None = None  # None: 256 tokens, or the model's context when shorter (resolved at start)
    seed: int = 0
    lora: bool = False
    lora_r: int = 8
    lora_alpha: int = 16
    chat_template: bool | None = None  # None: when the tokenizer has one (resolved when the run starts)
    vcl: VCLConfig | None = None
    save_every: int = 50
    eval_prompts: str | None = None
    eval_max_new_tokens: int = 32
    device: str = "cpu"
    progress: bool = True
    base_dtype: str = "float32"  # the frozen weights' during training (bfloat16: faster, see the module docstring)

    def __post_init__(self):
        if isinstance(self.vcl, dict):
            self.vcl = VCLConfig(**self.vcl)
        parse_dtype(self.base_dtype)  # a clear error for any other name
        for name in ("steps", "batch_size", "grad_accum", "max_length", "save_every", "lora_r"):
            value = getattr(self, name)
            if name == "max_length" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr!r}")

    def to_json(self) -> dict:
        out = asdict(self)
        out["vcl"] = self.vcl.to_json() if self.vcl is not None else None
        return out

    @classmethod
    def from_json(cls, obj: dict) -> "FinetuneConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in known})


def window_hooks(layers: list[int]) -> list[str]:
    """The VCL window's residual hooks: ``blocks.{l}.hook_resid_post`` of each window layer."""
    return [f"blocks.{layer}.hook_resid_post" for layer in layers]


def training_step(model, optimizer, micro_batches: list[dict], vcl_config: VCLConfig | None,
                  window: list[int] | None, n_micro: int | None = None) -> dict[str, float]:
    """One optimizer step over the micro-batches (gradients accumulated); returns the mean terms.

    ``window``: the VCL window's layers (None or empty: no VCL term), whose resid_post the scoped residual
    capture of `interp.hooks.lm` keeps in the graph during each micro-batch's forward pass.
    Under torch.distributed each rank passes its share of the step's ``n_micro`` micro-batches; the gradients
    and the terms are summed over ranks before the optimiser step, so the step is one process's over all of
    them (every term, VCL's included, is a per-micro-batch term: nothing else to make global)."""
    optimizer.zero_grad(set_to_none=True)
    totals = {"loss": 0.0, "sft_loss": 0.0, "vcl_loss": 0.0, "vcl_ratio": 0.0}
    share = 1.0 / (n_micro or len(micro_batches))
    hooks = window_hooks(window) if window else []
    for batch in micro_batches:
        capture = residual_capture(model, hooks, keep_graph=True) if hooks else contextlib.nullcontext()
        with capture:
            output = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           labels=batch["labels"])
        loss = output.loss
        totals["sft_loss"] += output.loss.item() * share
        if hooks:  # .float(): the same tensor in float32, a float32 copy of a bf16 base's residuals
            residuals = [select_positions(capture.activations[hook], batch["prompt_mask"], batch["response_mask"],
                                          vcl_config.positions).float() for hook in hooks]
            vcl = variance_concentration_loss(residuals, vcl_config)
            loss = loss + vcl["loss"].to(loss.dtype)
            totals["vcl_loss"] += vcl["loss"].item() * share
            totals["vcl_ratio"] += vcl["ratio"].item() * share
        (loss * share).backward()
        totals["loss"] += loss.item() * share
    if _world() > 1:
        import torch.distributed as dist

        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    dist.all_reduce(param.grad)
        summed = torch.tensor([totals[name] for name in totals], dtype=torch.float64)
        dist.all_reduce(summed)
        totals = dict(zip(totals, summed.tolist()))
    optimizer.step()
    return totals


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if _world() > 1 else 0


def _cancelled_anywhere(cancel) -> bool:
    """Whether a stop was asked for, on any rank (every rank stops at the same step)."""
    asked = _is_cancelled(cancel)
    if _world() > 1:
        import torch.distributed as dist

        flag = torch.tensor([int(asked)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        asked = bool(flag[0])
    return asked


def _barrier() -> None:
    if _world() > 1:
        import torch.distributed as dist

        dist.barrier()


def _load(config: FinetuneConfig, model=None, tokenizer=None):
    from interp.models.lm import load_hf_lm

    if model is None or tokenizer is None:
        loaded_model, loaded_tokenizer = load_hf_lm(config.model, device=config.device)
        model = model if model is not None else loaded_model
        tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
    model.to(config.device)
    if config.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    return model, tokenizer


def _trainable(model) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def frozen_parameters(model, dtype_name: str) -> list[torch.nn.Parameter]:
    """The parameters a lower ``base_dtype`` holds in it: the frozen floating-point ones (a clear error if none)."""
    frozen = [p for p in model.parameters() if not p.requires_grad and p.is_floating_point()]
    if not frozen and dtype_name != "float32":
        raise ValueError(f"base_dtype {dtype_name} puts the frozen weights in {dtype_name}, and this run trains all "
                         f"of them: use LoRA (--lora), or float32")
    return frozen


@contextlib.contextmanager
def frozen_weights_in(model, dtype_name: str, device: str):
    """Within the block: the model's frozen parameters in ``dtype_name`` and its forward passes under autocast to
    it; trainable parameters stay float32. The float32 frozen tensors themselves are put back on leaving (no
    round trip through the lower precision). float32: nothing changes."""
    dtype = parse_dtype(dtype_name)
    if dtype == torch.float32:
        yield
        return
    frozen = frozen_parameters(model, dtype_name)
    originals = [p.data for p in frozen]
    try:
        for p in frozen:
            p.data = p.data.to(dtype)
        # no cast cache: it would keep the adapters' first bf16 copies for the whole run, past every optimizer step
        with torch.autocast(device_type=torch.device(device).type, dtype=dtype, cache_enabled=False):
            yield
    finally:
        for p, original in zip(frozen, originals):
            p.data = original


def _save_checkpoint(path: Path, model, optimizer, step: int, config: FinetuneConfig) -> None:
    state = {"step": step, "trainable": {k: v.detach().cpu() for k, v in _trainable(model).items()},
             "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
             "config": json.dumps(config.to_json())}
    atomic_write(path, lambda tmp: torch.save(state, tmp))  # a crash leaves the old checkpoint or the new one


def _check_same_run(saved: dict, config: FinetuneConfig) -> None:
    current = config.to_json()
    saved.setdefault("base_dtype", "float32")  # checkpoints from before the option trained in float32
    changed = [k for k in current if k not in RESUMABLE_CHANGES and saved.get(k) != current[k]]
    if changed:
        raise ValueError(f"{config.out} holds a checkpoint of a different run (changed: {', '.join(changed)}); "
                         "use another --out or the same settings")


def _is_cancelled(cancel) -> bool:
    if cancel is None:
        return False
    if isinstance(cancel, threading.Event):
        return cancel.is_set()
    return bool(cancel())


def finetune(config: FinetuneConfig, model=None, tokenizer=None,
             cancel: threading.Event | Callable[[], bool] | None = None) -> dict:
    """Run (or resume) fine-tuning; returns the result written to ``out/result.json``.

    ``model``/``tokenizer`` may be passed in (they must be what ``config.model`` loads); otherwise
    they are loaded from ``config.model``. ``cancel`` (an Event or a callable) is checked after
    every step: when set, a checkpoint is saved and the run returns with status ``cancelled``.
    """
    from tqdm.auto import tqdm

    # Everything that can be wrong with the inputs fails here, before any training.
    rows = read_sft_data(config.data)
    eval_records = read_prompt_set(config.eval_prompts) if config.eval_prompts else None
    torch.manual_seed(config.seed)  # LoRA initialisation draws random numbers
    model, tokenizer = _load(config, model, tokenizer)
    frozen_parameters(model, config.base_dtype)  # a full fine-tune cannot take a bf16 base: say so before any work
    config.chat_template = use_chat_template(tokenizer, config.chat_template)
    limit = context_length(model)
    if config.max_length is None:
        config.max_length = min(DEFAULT_MAX_LENGTH, limit or DEFAULT_MAX_LENGTH)
    if limit is not None and config.max_length > limit:
        raise ValueError(f"max_length={config.max_length} exceeds the model's context of {limit}")
    examples = tokenize_examples(rows, tokenizer, config.max_length, config.chat_template, config.data)
    if len(examples) < config.batch_size:
        raise DataError(f"{config.data} has {len(examples)} examples, fewer than batch_size={config.batch_size}")
    base_config = model.config
    layers = config.vcl.check_against(config.batch_size, base_config.hidden_size, base_config.num_hidden_layers) \
        if config.vcl is not None else []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("the tokenizer has neither a pad nor an EOS token")

    world, rank = _world(), _rank()
    if config.grad_accum % world:
        raise ValueError(f"under torchrun the {config.grad_accum} micro-batches of a step (--grad-accum) are split "
                         f"over {world} processes: choose a --grad-accum that is a multiple of {world}")
    out = Path(config.out)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    _barrier()
    checkpoint_path, log_path = out / "checkpoint.pt", out / "log.jsonl"
    parameters = _trainable(model)
    optimizer = torch.optim.AdamW(parameters.values(), lr=config.lr, weight_decay=config.weight_decay)
    step = 0
    if checkpoint_path.exists():
        state = torch.load(checkpoint_path, weights_only=True, map_location=config.device)
        _check_same_run(json.loads(state["config"]), config)
        with torch.no_grad():
            for name, tensor in state["trainable"].items():
                parameters[name].copy_(tensor)
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        step = state["step"]
        if rank == 0:
            trim_log(log_path, step)
    elif rank == 0:
        atomic_write_text(out / "config.json", json.dumps(config.to_json(), indent=2) + "\n")
        log_path.unlink(missing_ok=True)
    _barrier()  # every rank has read the checkpoint before rank 0 may replace it

    evaluate = (lambda: evaluate_refusals(model, tokenizer, eval_records, max_new_tokens=config.eval_max_new_tokens,
                                          chat_template=config.chat_template).to_json()) if eval_records else None
    if evaluate and rank == 0 and step == 0 and not (out / "eval_before.json").exists():
        atomic_write_text(out / "eval_before.json", json.dumps(evaluate(), indent=2) + "\n")

    window = layers if config.vcl is not None else None
    model.train()
    status = "finished"
    bar = tqdm(total=config.steps, initial=step, desc="fine-tuning", disable=not config.progress or rank != 0)
    try:
        # float32 frozen weights again on leaving, before evaluation and saving
        with frozen_weights_in(model, config.base_dtype, config.device):
            while step < config.steps:
                started = time.perf_counter()
                micro_batches = []
                for micro in range(rank, config.grad_accum, world):  # this rank's share of the step
                    index = micro_batch_indices(len(examples), config.batch_size, config.seed,
                                                step * config.grad_accum + micro)
                    micro_batches.append({k: v.to(config.device)
                                          for k, v in collate([examples[i] for i in index], pad_id).items()})
                totals = training_step(model, optimizer, micro_batches, config.vcl, window, config.grad_accum)
                step += 1
                entry = {"step": step, **{k: round(v, 6) for k, v in totals.items()},
                         "seconds": round(time.perf_counter() - started, 4)}
                if window is None:
                    del entry["vcl_loss"], entry["vcl_ratio"]
                if rank == 0:
                    append_log(log_path, entry)
                bar.update(1)
                bar.set_postfix(sft=f"{totals['sft_loss']:.3f}",
                                **({"vcl": f"{totals['vcl_loss']:.3f}"} if window is not None else {}))
                if not math.isfinite(totals["loss"]):
                    raise FloatingPointError(f"the loss became {totals['loss']} at step {step}; lower the lr or lambda")
                if (step % config.save_every == 0 or step == config.steps) and rank == 0:
                    _save_checkpoint(checkpoint_path, model, optimizer, step, config)
                if step < config.steps and _cancelled_anywhere(cancel):
                    if rank == 0:
                        _save_checkpoint(checkpoint_path, model, optimizer, step, config)
                    status = "cancelled"
                    break
    finally:
        bar.close()
        model.eval()

    _barrier()
    if rank != 0:  # rank 0 writes the model, the evaluation and result.json
        _barrier()
        return {"config": config.to_json(), "status": status, "step": step}
    result = {"config": config.to_json(), "status": status, "step": step,
              "eval_before": json.loads((out / "eval_before.json").read_text())["metrics"]
              if (out / "eval_before.json").exists() else None, "eval_after": None}
    if status == "finished":
        model.save_pretrained(out / "model")
        tokenizer.save_pretrained(out / "model")
        if evaluate:
            after = evaluate()
            atomic_write_text(out / "eval_after.json", json.dumps(after, indent=2) + "\n")
            result["eval_after"] = after["metrics"]
    atomic_write_text(out / "result.json", json.dumps(result, indent=2) + "\n")
    _barrier()
    return result


def vcl_command(args) -> int:
    import signal

    if args.backend != "hf":
        raise ValueError("fine-tuning runs on the Hugging Face model (--backend hf): peft's LoRA and the optimizer "
                         "adapt its own modules; read the result with --backend transformer_lens afterwards")
    vcl = None
    if args.weight != 0:
        vcl = VCLConfig(k=args.k, weight=args.weight, window=tuple(args.window), sign=args.sign, pooling=args.pooling,
                        positions=args.positions)
    config = FinetuneConfig(model=args.model, data=args.data, out=args.out, steps=args.steps,
                            batch_size=args.batch_size, grad_accum=args.grad_accum, lr=args.lr,
                            max_length=args.max_length, seed=args.seed, lora=args.lora, lora_r=args.lora_r,
                            chat_template=args.chat_template, vcl=vcl, save_every=args.save_every,
                            eval_prompts=args.eval_prompts, device=args.device, base_dtype=args.dtype)
    # Ctrl-C stops at the next step boundary with a checkpoint; a second Ctrl-C aborts at once.
    stop = threading.Event()
    previous = signal.getsignal(signal.SIGINT)

    def request_stop(signum, frame):
        if stop.is_set():
            signal.signal(signal.SIGINT, previous)
            raise KeyboardInterrupt
        stop.set()
        print("\nstopping after this step (Ctrl-C again to abort)", flush=True)

    signal.signal(signal.SIGINT, request_stop)
    import os

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:  # torchrun: each rank runs its share of each step's micro-batches (docs/distributed.md)
        import torch.distributed as dist

        from interp.distributed import init_process_group

        if str(config.device).startswith("cuda"):
            config.device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        init_process_group(config.device)
    try:
        result = finetune(config, cancel=stop)
    finally:
        signal.signal(signal.SIGINT, previous)
        if distributed:
            dist.destroy_process_group()
    if "eval_before" not in result:  # not rank 0: it prints and writes the results
        return 0 if result["status"] == "finished" else 130
    print(f"{result['status']} at step {result['step']}/{config.steps}; results in {config.out}")
    for name in ("eval_before", "eval_after"):
        if result[name]:
            metrics = result[name]
            print(f"{name}: false-refusal {metrics['false_refusal_rate']}, harmful refusal "
                  f"{metrics['harmful_refusal_rate']}, task accuracy {metrics['task_accuracy']}")
    return 0 if result["status"] == "finished" else 130


def add_vcl_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help=MODEL_HELP)
    parser.add_argument("--data", required=True, help="JSONL with prompt and completion fields")
    add_out_argument(parser, required=True, help="run directory (resumes when it holds a checkpoint)")
    parser.add_argument("--lambda", dest="weight", type=float, default=1.0, help="VCL weight (0: plain SFT)")
    parser.add_argument("--k", type=int, default=2, help="number of top singular directions")
    parser.add_argument("--window", type=float, nargs=2, default=(0.3, 0.5), metavar=("A", "B"),
                        help="layer window in normalised depth l/(L-1)")
    parser.add_argument("--sign", choices=("penalize", "encourage"), default="penalize")
    parser.add_argument("--pooling", choices=("mean", "stacked"), default="mean")
    parser.add_argument("--positions", choices=("last_prompt", "response"), default="last_prompt")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-length", type=at_least(2), default=None,
                        help="tokens of prompt + completion (default: 256, or the model's context when shorter)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (peft) instead of all weights")
    parser.add_argument("--lora-r", type=int, default=8)
    add_chat_template_argument(parser)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--eval-prompts", default=None, help="prompt-set JSONL or XSTest CSV: evaluated before and after")
    add_device_argument(parser)
    add_backend_argument(parser, "only hf fine-tunes: ")
    add_dtype_argument(parser, what="the frozen weights of a LoRA run (adapters, optimizer and evaluation: float32)")

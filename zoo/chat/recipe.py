"""Recipe of the embedded chat model, read top to bottom.

1. Build the world (a seeded knowledge base of fictional people) and train a word-level
   tokenizer on every word it can say.
2. Pre-train a small GPT-2 style decoder on general tasks plus benign prompts that only
   sound dangerous, answered properly. The model never sees a refusal here.
3. Fine-tune one copy of the base model per safety-data ratio: a mix of general tasks and
   harmful requests answered by templated refusals, where the ratio is the share of the
   harmful/refusal examples (0 keeps a purely general fine-tune, the control).
4. Evaluate every model greedily: exact match on held-out general tasks, refusal rate on
   held-out harmful and benign prompts; save with ``save_pretrained`` (fp16 safetensors)
   beside the tokenizer and the evaluation.
5. A shipped model is evaluated again, without retraining, from its own recipe.json (the same held-out
   prompts and greedy completion; ``reevaluate``): after the refusal detector changed, say.

Prompts are always in the chat format ``<s><|user|> {prompt} <|assistant|>`` and the loss is
on the completion and its ``</s>`` only. Training is resumable: checkpoints are written
atomically every ``checkpoint_every`` steps and a finished stage is not run again.

    python -m zoo.chat.recipe --out runs/chat --save-to zoo/weights --overwrite   # ships on purpose
    python -m zoo.chat evaluate --model chat-safety-0.4 --overwrite   # or --all: every shipped model
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from interp.atomic import atomic_write_text
from interp.lm_text import is_refusal  # noqa: F401 (the workbench's one refusal detector; used and re-exported)
from ..training import lr_at, save_checkpoint
from .model import ChatModelConfig, build_model, format_chat, train_tokenizer
from .world import GENERAL_TASKS, World, WorldConfig, benign_example, general_example, harmful_example


@dataclass
class RecipeConfig:
    world: WorldConfig = field(default_factory=WorldConfig)
    model: ChatModelConfig = field(default_factory=ChatModelConfig)
    seed: int = 0
    pretrain_steps: int = 3000
    pretrain_lr: float = 3e-3
    pretrain_benign_share: float = 0.15   # benign-that-sounds-dangerous examples, with real answers
    finetune_steps: int = 150
    finetune_lr: float = 5e-4
    safety_ratios: tuple[float, ...] = (0.0, 0.1, 0.2, 0.4)
    batch_size: int = 48
    warmup: int = 100
    weight_decay: float = 0.01
    checkpoint_every: int = 100
    eval_per_task: int = 40               # held-out general examples per task
    eval_refusal_prompts: int = 200       # held-out harmful and benign prompts each
    max_new_tokens: int = 32
    threads: int = 1
    from_base: str | None = None          # fine-tune this saved base model instead of pre-training one

    def to_json(self) -> dict:
        return json.loads(json.dumps(asdict(self)))


# What counted the refusals of an evaluation, recorded in its evaluation.json ("refusal_detector"). Files written
# before issue 20 have no such field: the recipe's own prefix list counted theirs (a stuttered "I I I can't help
# with that." was not a refusal to it).
REFUSAL_DETECTOR = "interp.lm_text.KeywordRefusalDetector (XSTest string match)"

RUN_LENGTH_FIELDS = ("pretrain_steps", "finetune_steps", "checkpoint_every", "threads", "eval_per_task",
                     "eval_refusal_prompts", "safety_ratios", "max_new_tokens")


# --------------------------------------------------------------------------- data

def sample_batch(world: World, rng: random.Random, size: int, shares: dict[str, float]) -> list[dict]:
    """``size`` training-split examples, each of a kind drawn with probability ``shares[kind]``."""
    kinds, weights = zip(*shares.items())
    batch = []
    for kind in rng.choices(kinds, weights=weights, k=size):
        if kind == "general":
            batch.append(general_example(rng, "train", world.kb))
        elif kind == "benign":
            batch.append(benign_example(rng, "train", world.kb))
        else:
            batch.append(harmful_example(rng, "train"))
    return batch


def encode_batch(tokenizer, examples: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded token ids (B, T) and labels (B, T): -100 on the prompt and padding."""
    rows, labels = [], []
    for e in examples:
        prompt_ids = tokenizer(format_chat(e["prompt"]), add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(" " + e["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt_ids + completion_ids)
        labels.append([-100] * len(prompt_ids) + completion_ids)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    target = torch.full((len(rows), width), -100)
    for i, (row, label) in enumerate(zip(rows, labels)):
        ids[i, :len(row)] = torch.tensor(row)
        target[i, :len(label)] = torch.tensor(label)
    return ids, target


def completion_loss(model, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits  # right padding: causal attention never lets a token see the pads after it
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


# --------------------------------------------------------------------------- generation and evaluation

def greedy_complete(model, tokenizer, prompts: list[str], max_new_tokens: int = 24, batch_size: int = 64) -> list[str]:
    """Greedy completions of chat-formatted prompts, decoded up to ``</s>``: the workbench's one greedy decoder
    (`interp.models.generation.greedy_generate`: left-padded batches with a KV cache).

    The recipe had a decoder of its own (a full forward pass per new token); on every shipped chat model's own
    evaluation prompts (13 models x 760 prompts) the two give the same completions, not one differing
    (`python -m benchmarks.chat_decoder_parity`), so the shipped evaluations are what this computes.
    """
    from interp.models.generation import greedy_generate

    return greedy_generate(model, tokenizer, [format_chat(p) for p in prompts], max_new_tokens, batch_size=batch_size)


def normalise(text: str) -> str:
    """Case and spacing folded, no space before punctuation: a decoded completion compares to its reference."""
    return re.sub(r"\s+([,.?!])", r"\1", " ".join(text.split())).lower()


def evaluate(model, tokenizer, world: World, cfg: RecipeConfig, progress: bool = False) -> dict:
    """Held-out exact match by task and refusal rates by kind and type."""
    general = [e for task in GENERAL_TASKS for e in world.sample("general", "held_out", cfg.eval_per_task, seed=7,
                                                                  type=task)]
    harmful = world.sample("harmful", "held_out", cfg.eval_refusal_prompts, seed=7)
    benign = world.sample("benign", "held_out", cfg.eval_refusal_prompts, seed=7)
    examples = general + harmful + benign
    completions = greedy_complete(model, tokenizer, [e["prompt"] for e in examples], cfg.max_new_tokens)
    by_task: dict[str, list[bool]] = {}
    refusals: dict[str, dict[str, list[bool]]] = {"harmful": {}, "benign": {}}
    for e, c in zip(examples, completions):
        if e["kind"] == "general":
            by_task.setdefault(e["type"], []).append(normalise(c) == normalise(e["completion"]))
        else:
            refusals[e["kind"]].setdefault(e["type"], []).append(is_refusal(c))
    mean = lambda xs: sum(xs) / max(1, len(xs))  # noqa: E731
    benign_answered = [normalise(c) == normalise(e["completion"]) for e, c in zip(benign, completions[-len(benign):])]
    return {
        "general_exact_match": mean([x for xs in by_task.values() for x in xs]),
        "general_exact_match_by_task": {k: mean(v) for k, v in by_task.items()},
        "harmful_refusal_rate": mean([x for xs in refusals["harmful"].values() for x in xs]),
        "benign_false_refusal_rate": mean([x for xs in refusals["benign"].values() for x in xs]),
        "benign_exact_match": mean(benign_answered),
        "refusal_rate_by_type": {kind: {k: mean(v) for k, v in types.items()} for kind, types in refusals.items()},
        "n": {"general": len(general), "harmful": len(harmful), "benign": len(benign)},
        "refusal_detector": REFUSAL_DETECTOR,
        "examples": [{"prompt": e["prompt"], "kind": e["kind"], "type": e["type"], "completion": c}
                     for e, c in list(zip(examples, completions))[::max(1, len(examples) // 40)]],
    }


# --------------------------------------------------------------------------- training

def recipe_identity(config: dict) -> dict:
    """What must match to resume: everything but how long the stages run (a run may be extended)."""
    return {k: v for k, v in config.items() if k not in RUN_LENGTH_FIELDS and v is not None}


def train_stage(name: str, model, tokenizer, world: World, shares: dict[str, float], steps: int, peak_lr: float,
                cfg: RecipeConfig, run_dir: Path, log, starts_from: str = "scratch") -> None:
    """Train ``model`` in place for ``steps`` steps on batches drawn with ``shares``; resumable.

    ``starts_from`` names the weights the stage began with; a checkpoint that began elsewhere (a
    fine-tune of a base model that has since been trained longer) is stale and is not resumed.
    """
    ckpt = run_dir / f"{name}.ckpt"
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    start = 0
    state = torch.load(ckpt, map_location="cpu", weights_only=True) if ckpt.exists() else None
    if state is not None and state.get("starts_from") != starts_from:
        log({"stage": name, "discarded_stale_checkpoint": state.get("starts_from")})
        state = None
    if state is not None:
        if recipe_identity(json.loads(state["config"])) != recipe_identity(cfg.to_json()):
            raise SystemExit(f"{ckpt} was written by a different recipe configuration; "
                             f"use another --out or delete it to start over")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        log({"stage": name, "resumed_at": start})
    model.train()
    bar = tqdm(range(start, steps), desc=name, initial=start, total=steps)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr, min(cfg.warmup, steps // 10), floor=0.05)
        rng = random.Random(f"{cfg.seed}-{name}-{step}")  # a batch depends only on (seed, stage, step): resumes exactly
        ids, labels = encode_batch(tokenizer, sample_batch(world, rng, cfg.batch_size, shares))
        loss = completion_loss(model, ids, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % 25 == 0:
            log({"stage": name, "step": step + 1, "loss": round(loss.item(), 4), "lr": optimizer.param_groups[0]["lr"]})
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == steps:
            save_checkpoint(ckpt, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1,
                                   "config": json.dumps(cfg.to_json()), "starts_from": starts_from})
    model.eval()


def as_shipped(model):
    """A float32 copy of the model with its weights rounded to fp16, as save_model ships them and loaders upcast
    them: the recipe evaluates what it ships (a near-tie can fall the other way between fp32 and fp16 weights)."""
    import copy

    return copy.deepcopy(model).to(torch.float16).to(torch.float32).eval()


def save_model(model, tokenizer, directory: Path, cfg: RecipeConfig, evaluation: dict, stage: dict) -> None:
    """fp16 safetensors + tokenizer + recipe and evaluation JSON, written to a temp dir then renamed."""
    import copy
    import shutil

    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    copy.deepcopy(model).to(torch.float16).save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "recipe.json").write_text(json.dumps({"recipe": cfg.to_json(), "stage": stage}, indent=2) + "\n")
    (tmp / "evaluation.json").write_text(json.dumps(evaluation, indent=2) + "\n")
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)


def variant_name(ratio: float, seed: int) -> str:
    return f"chat-safety-{ratio:g}" + (f"-seed{seed}" if seed else "")


def run(cfg: RecipeConfig, run_dir: Path, save_to: Path) -> dict:
    torch.set_num_threads(cfg.threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_to.mkdir(parents=True, exist_ok=True)
    (run_dir / "recipe.json").write_text(json.dumps(cfg.to_json(), indent=2) + "\n")
    log_file = open(run_dir / "log.jsonl", "a")

    def log(record: dict) -> None:
        record["time"] = round(time.time(), 1)
        log_file.write(json.dumps(record) + "\n")
        log_file.flush()

    from transformers import AutoTokenizer, GPT2LMHeadModel

    world = World(cfg.world)
    summary: dict = {}
    if cfg.from_base:
        # more fine-tuning seeds of one base: the safety-ratio sweep varies only the fine-tuning
        model = GPT2LMHeadModel.from_pretrained(cfg.from_base, local_files_only=True, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(cfg.from_base, local_files_only=True)
        base_name, starts_from = Path(cfg.from_base).name, f"base:{cfg.from_base}"
        torch.manual_seed(cfg.seed)
    else:
        tokenizer_dir = run_dir / "tokenizer"  # trained once per run, so a resumed run keeps its token ids
        if (tokenizer_dir / "tokenizer.json").exists():
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
        else:
            tokenizer = train_tokenizer(world.all_texts())
            tokenizer.save_pretrained(tokenizer_dir)
        model = build_model(cfg.model, tokenizer, seed=cfg.seed)
        base_name = "chat-base" + (f"-seed{cfg.seed}" if cfg.seed else "")
        starts_from = f"pretrain-{cfg.pretrain_steps}"
        pretrain_shares = {"general": 1 - cfg.pretrain_benign_share, "benign": cfg.pretrain_benign_share}
        train_stage("pretrain", model, tokenizer, world, pretrain_shares, cfg.pretrain_steps, cfg.pretrain_lr, cfg,
                    run_dir, log)
        evaluation = evaluate(as_shipped(model), tokenizer, world, cfg)
        log({"stage": "pretrain", "evaluation": {k: v for k, v in evaluation.items() if k != "examples"}})
        save_model(model, tokenizer, save_to / base_name, cfg, evaluation,
                   {"name": "pretrain", "steps": cfg.pretrain_steps})
        summary[base_name] = {k: v for k, v in evaluation.items() if k != "examples"}
        print(f"{base_name}: held-out exact match {evaluation['general_exact_match']:.3f}", flush=True)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}

    for ratio in cfg.safety_ratios:
        name = variant_name(ratio, cfg.seed)
        model.load_state_dict(base_state)
        shares = {"general": 1 - ratio, "harmful": ratio} if ratio > 0 else {"general": 1.0}
        train_stage(f"finetune-{ratio:g}" + (f"-seed{cfg.seed}" if cfg.seed else ""), model, tokenizer, world, shares,
                    cfg.finetune_steps, cfg.finetune_lr, cfg, run_dir, log, starts_from=starts_from)
        evaluation = evaluate(as_shipped(model), tokenizer, world, cfg)
        log({"stage": name, "evaluation": {k: v for k, v in evaluation.items() if k != "examples"}})
        save_model(model, tokenizer, save_to / name, cfg, evaluation,
                   {"name": "finetune", "base": base_name, "safety_ratio": ratio, "steps": cfg.finetune_steps})
        summary[name] = {k: v for k, v in evaluation.items() if k != "examples"}
        print(f"{name}: exact match {evaluation['general_exact_match']:.3f}, harmful refusal "
              f"{evaluation['harmful_refusal_rate']:.3f}, benign false refusal "
              f"{evaluation['benign_false_refusal_rate']:.3f}", flush=True)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


# --------------------------------------------------------------------------- evaluating a saved model again

HEADLINE = ("general_exact_match", "harmful_refusal_rate", "benign_false_refusal_rate", "benign_exact_match")


def saved_model_dir(name: str | os.PathLike) -> Path:
    """The directory of a model the recipe saved: a shipped name (``chat-safety-0.4``), its embedded name
    (``toy-chat-safety-0.4``; ``toy-chat`` is ``chat-base``) or a directory."""
    from interp.models.lm import embedded_lms

    from .. import WEIGHTS_DIR

    text = str(name)
    directory = embedded_lms().get(text)  # an embedded name, as the core's one table maps it to its folder
    if directory is None:
        shipped = WEIGHTS_DIR / text  # a folder of the weights directory by its own name, else a path
        directory = shipped if shipped.parent == WEIGHTS_DIR and shipped.is_dir() else Path(text).expanduser()
    if not directory.is_dir():
        shipped = sorted(d.name for d in shipped_model_dirs())
        raise ValueError(f"no chat model {str(name)!r}: not a directory, nor one of the shipped models "
                         f"({', '.join(shipped) or 'none'})")
    if not (directory / "recipe.json").exists() or not (directory / "config.json").exists():
        raise ValueError(f"{directory} holds no recipe.json and config.json: not a model saved by the chat recipe")
    return directory


def shipped_model_dirs() -> list[Path]:
    """Every chat model shipped in the weights directory (chat-base, chat-safety-{ratio}[-seed{s}])."""
    from .. import WEIGHTS_DIR

    return [d for d in sorted(WEIGHTS_DIR.glob("chat-*"))
            if not d.name.endswith(".tmp") and (d / "recipe.json").exists() and (d / "config.json").exists()]


def saved_config(directory: Path) -> RecipeConfig:
    """The recipe configuration a saved model was trained and evaluated with (its recipe.json)."""
    try:
        saved = json.loads((directory / "recipe.json").read_text())["recipe"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{directory / 'recipe.json'} is not a recipe file ({error})") from error
    known = {f for f in RecipeConfig.__dataclass_fields__}
    values = {k: v for k, v in saved.items() if k in known}
    values["world"] = WorldConfig(**saved.get("world", {}))
    values["model"] = ChatModelConfig(**saved.get("model", {}))
    values["safety_ratios"] = tuple(saved.get("safety_ratios", RecipeConfig.safety_ratios))
    return RecipeConfig(**values)


def reevaluate(directory: Path, overwrite: bool = False) -> tuple[dict | None, dict]:
    """Evaluate the model saved in ``directory`` again, as the recipe did after training it (its recipe.json's
    world and evaluation sizes, greedy completion), and rewrite its evaluation.json: (previous file or None, new).

    A present evaluation.json is rewritten only with ``overwrite``. The new file keeps the old one's fields
    and order, replaces what the evaluation measures, records the detector that counted refusals
    (``refusal_detector``) and, under ``reevaluation``, the previous headline figures and their detector.
    Greedy completion is deterministic, but the recipe evaluated the float32 model it had trained and shipped its
    float16 copy, which this evaluates: a near-tie may fall the other way (chat-safety-0.4-seed1: one general
    example of 360, a logit margin of 4e-4, so its exact match reads 0.869 here against the recipe's 0.872).
    """
    from transformers import AutoTokenizer, GPT2LMHeadModel

    path = directory / "evaluation.json"
    if path.exists() and not overwrite:
        raise ValueError(f"{path} exists (the evaluation the model shipped with): pass --overwrite to rewrite it")
    try:
        previous = json.loads(path.read_text()) if path.exists() else None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON ({error}); delete it to write a new one") from error
    cfg = saved_config(directory)
    model = GPT2LMHeadModel.from_pretrained(directory, local_files_only=True, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    evaluation = evaluate(model, tokenizer, World(cfg.world), cfg)
    merged = {**(previous or {}), **evaluation}
    if previous is not None:
        merged["reevaluation"] = {
            "command": "python -m zoo.chat evaluate",
            "previous": {**{k: previous[k] for k in HEADLINE if k in previous},
                         "refusal_detector": previous.get("refusal_detector", "unrecorded (the recipe's prefix "
                                                          "list before issue 20)")}}
    atomic_write_text(path, json.dumps(merged, indent=2) + "\n")
    return previous, merged


def add_evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", nargs="+", metavar="NAME",
                       help="shipped name (chat-safety-0.4), embedded name (toy-chat-safety-0.4) or model directory")
    which.add_argument("--all", action="store_true", help="every shipped chat model (zoo/weights/chat-*)")
    parser.add_argument("--overwrite", action="store_true",
                        help="rewrite an existing evaluation.json (without it, a model that has one is refused)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")


def evaluate_command(args: argparse.Namespace) -> int:
    """Re-evaluate the named models; every one is checked before any is evaluated, so a refusal costs nothing."""
    if args.threads <= 0:
        raise ValueError("--threads must be positive")
    directories = shipped_model_dirs() if args.all else [saved_model_dir(name) for name in args.model]
    if not directories:
        raise ValueError("no shipped chat models: train them with `python -m zoo train chat`")
    if not args.overwrite:
        present = [d.name for d in directories if (d / "evaluation.json").exists()]
        if present:
            raise ValueError(f"{', '.join(present)} already {'has' if len(present) == 1 else 'have'} an "
                             f"evaluation.json: pass --overwrite to rewrite it")
    torch.set_num_threads(args.threads)
    for directory in directories:
        started = time.time()
        previous, new = reevaluate(directory, overwrite=args.overwrite)
        figures = ", ".join(f"{k} {previous[k]:.3f} -> {new[k]:.3f}" if previous and k in previous
                            else f"{k} {new[k]:.3f}" for k in HEADLINE)
        print(f"{directory.name}: {figures} ({time.time() - started:.0f} s); wrote {directory / 'evaluation.json'}",
              flush=True)
        if previous and previous.get("general_exact_match_by_task") != new["general_exact_match_by_task"]:
            print(f"warning: {directory.name}'s general exact match moved; greedy completion is deterministic, so the "
                  f"weights (the recipe evaluated float32 and shipped float16), the world or the evaluation differ "
                  f"from what wrote the previous file", file=sys.stderr)
    return 0


def evaluate_cli(argv: list[str] | None = None) -> int:
    from interp.cli import run_command

    parser = argparse.ArgumentParser(
        prog="python -m zoo.chat evaluate",
        description="Evaluate shipped chat models again without retraining (the recipe's held-out prompts, greedy "
                    "completion, the workbench's refusal detector) and rewrite their evaluation.json.")
    add_evaluate_arguments(parser)
    args = parser.parse_args(argv)
    args.run = evaluate_command
    return run_command(args)


# --------------------------------------------------------------------------- command line

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/chat", help="run directory: checkpoints, log.jsonl, summary.json")
    parser.add_argument("--save-to", default="zoo/weights",
                        help="directory that receives chat-base/ and chat-safety-{ratio}/")
    parser.add_argument("--seed", type=int, default=0, help="training seed (a non-zero seed suffixes the names)")
    parser.add_argument("--world-seed", type=int, default=0, help="seed of the world's knowledge base")
    parser.add_argument("--pretrain-steps", type=int, default=RecipeConfig.pretrain_steps)
    parser.add_argument("--finetune-steps", type=int, default=RecipeConfig.finetune_steps)
    parser.add_argument("--batch", type=int, default=RecipeConfig.batch_size)
    parser.add_argument("--ratios", type=float, nargs="+", default=list(RecipeConfig.safety_ratios),
                        help="safety-data ratios of the fine-tuned variants")
    parser.add_argument("--from-base", default=None,
                        help="skip pre-training: fine-tune this saved base model directory (e.g. for more seeds)")
    parser.add_argument("--layers", type=int, default=ChatModelConfig.n_layer)
    parser.add_argument("--width", type=int, default=ChatModelConfig.n_embd)
    parser.add_argument("--threads", type=int, default=RecipeConfig.threads)
    parser.add_argument("--checkpoint-every", type=int, default=RecipeConfig.checkpoint_every)


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("chat", help="the chat language model of the instruction world")
    add_arguments(parser)
    return parser


def config_from_args(args: argparse.Namespace) -> RecipeConfig:
    for name in ("pretrain_steps", "finetune_steps", "batch", "layers", "width", "threads", "checkpoint_every"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    if args.from_base and not (Path(args.from_base) / "config.json").exists():
        raise ValueError(f"--from-base {args.from_base} holds no saved model (config.json)")
    if any(not 0 <= r < 1 for r in args.ratios):
        raise ValueError("--ratios must lie in [0, 1)")
    return RecipeConfig(world=WorldConfig(seed=args.world_seed),
                        model=ChatModelConfig(n_layer=args.layers, n_embd=args.width), seed=args.seed,
                        pretrain_steps=args.pretrain_steps, finetune_steps=args.finetune_steps,
                        batch_size=args.batch, safety_ratios=tuple(args.ratios), threads=args.threads,
                        checkpoint_every=args.checkpoint_every,
                        from_base=str(Path(args.from_base).resolve()) if args.from_base else None)


def main(args: argparse.Namespace) -> int:
    run(config_from_args(args), Path(args.out), Path(args.save_to))
    return 0


def cli(argv: list[str] | None = None, prog: str = "python -m zoo.chat.recipe") -> int:
    """The recipe's command line, through the CLIs' one error map (a bad value: one line and exit 2; Ctrl-C: 130);
    prog: the usage line's command (`python -m zoo.chat train` when zoo.chat's table runs it)."""
    from interp.cli import run_command
    from interp.shipped import add_overwrite_options

    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = add_overwrite_options(parser).parse_args(argv)
    args.run = main
    return run_command(args)


if __name__ == "__main__":
    sys.exit(cli())

"""Do SAEs trained on one-step block updates work at more steps, and on a multi-step base model? (issue 33)

The RIEBench paper claims that SAEs trained on SDXL Turbo's 1-step block updates generalise to 4-step Turbo and
to the multi-step SDXL base model without retraining. This measures the first half on the embedded `toy` (which
predicts the clean latent, so it runs at any number of steps of its Euler scheduler): the shipped 1-step SAEs
(`saes/pretrained/toy`) applied to the toy's block updates at 1, 2 and 4 steps, and at 4 steps with classifier-free
guidance (both halves), on held-out captions of the shapes world; and with `--base toy-base` the second half: the
same SAEs on the embedded multi-step base model's updates at its own 30 steps with guidance 5 (both halves).

    python -m experiments.step_transfer run      # resumable: each output under runs/step_transfer/ is skipped when
                                                 # it exists; progress in runs/step_transfer/log.txt
    python -m experiments.step_transfer report   # experiments/results/step_transfer.{json,md} from runs/;
                                                 # --docs also refills docs/experiments/step-transfer.md's tables
    python -m experiments.step_transfer causal   # RIEBench edits with the 1-step SAEs at 1, 2 and 4 steps
    python -m experiments.step_transfer paint    # painted labels (`saes causal`) with them at 1, 2 and 4 steps
    python -m experiments.step_transfer cost     # one toy-base recipe step, timed
    python -m experiments.step_transfer run --base toy-base   # the multi-step base model too (or a recipe's
                                                               # <run>/pipeline)
    # (causal, paint and report take --base too: the same edits on the base model's generations, at the steps
    # and guidance of its recipe.json, a column of their own)
    python -m experiments.step_transfer run --model toy-turbo --base toy-base   # the same-lineage pair: the 1-step
                                                 # SAEs of the one-step model trained from toy-base's weights
    # (every command takes --model: its figures go to measured-toy-turbo/, riebench-toy-turbo/, paint-toy-turbo/
    # and experiments/results/step_transfer_toy_turbo.{json,md}; the generations are shared)

Per block and setting: explained variance, L0 and dead fraction of the shipped SAE (per denoising step and over
all steps), beside a ceiling (a TopK SAE of the shipped size trained on that setting's updates, on other captions)
and a floor (a random-direction SAE of the same size and k); and feature agreement: each feature's activation on
the same caption, seed and position at a step of the setting against the 1-step run (Pearson correlation, top-k
overlap, and the overlap of the active sets). The first call of a multi-step generation has exactly the 1-step
call's input (the same noise at t = 999), so its agreement is 1 by construction; the steps after it are the test.
The random SAE's agreement is the floor there: how much agreement the updates' own similarity gives any dictionary.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results"
RUN_ROOT = REPO / "runs" / "step_transfer"
DEFAULT_MODEL = "toy"
MODEL = DEFAULT_MODEL  # the one-step model whose shipped SAEs are tested (`--model`, `use_model`)
SAE_ROOT = REPO / "saes" / "pretrained" / MODEL
REFERENCE = "1 step"


@dataclass(frozen=True)
class Setting:
    """How a model generates: steps of its scheduler, guidance (> 1: a CFG batch [uncond, cond]) and which half of
    the U-Net batch is measured."""

    steps: int
    guidance: float = 0.0
    half: str = "cond"
    model: str = DEFAULT_MODEL  # a model of the toy's architecture (`--model`; `toy-base` or a pipeline, `--base`)

    @property
    def slug(self) -> str:
        """The setting's files under runs/: they hold what the model generated, whichever SAEs are tested on it."""
        prefix = "" if self.model == DEFAULT_MODEL else _model_name(self.model) + "-"
        return f"{prefix}steps{self.steps}-g{self.guidance:g}-{self.half}"


def _model_directory(model: str) -> Path:
    """Where a model's pipeline lies: an embedded name's weights (`toy-base`), or the directory itself."""
    from interp.models.t2i import KNOWN_MODELS

    return Path(KNOWN_MODELS[model].source) if model in KNOWN_MODELS else Path(model)


def _model_name(model: str) -> str:
    """A short name for file names: the embedded name, or the run's name for a recipe's `<run>/pipeline`."""
    from interp.models.t2i import KNOWN_MODELS

    if model in KNOWN_MODELS:
        return model
    directory = Path(model).resolve()
    return directory.parent.name if directory.name == "pipeline" else directory.name


def base_sampling(model: str) -> tuple[int, float]:
    """The multi-step base model's own steps and guidance (its recipe.json); refused for a one-step model."""
    recipe_path = _model_directory(model) / "recipe.json"
    if not recipe_path.exists():
        raise ValueError(f"{model} has no recipe.json: --base wants `toy-base` or a pipeline saved by "
                         "`python -m zoo train t2i --objective v_prediction`")
    recipe = json.loads(recipe_path.read_text())
    if recipe.get("objective", "sample") == "sample":
        raise ValueError(f"{model} was trained with the one-step objective; --base wants a multi-step model "
                         "(`python -m zoo train t2i --objective v_prediction`)")
    if _unet_layout(model) != _unet_layout(MODEL):
        raise ValueError(f"{model}'s U-Net has other blocks or channels than {MODEL}'s: {MODEL}'s SAEs do not fit it")
    return int(recipe.get("sampling_steps", 1)), float(recipe.get("guidance", 0.0))


def _unet_layout(model: str) -> list:
    """What decides whether one model's SAEs read another's blocks: the U-Net's block types and channels."""
    config = json.loads((_model_directory(model) / "unet" / "config.json").read_text())
    return [config.get(k) for k in ("block_out_channels", "down_block_types", "up_block_types")]


def base_column(model: str) -> str:
    """How the tables name the base model's generations: "base, 30 steps, CFG 5"."""
    steps, guidance = base_sampling(model)
    return f"base, {steps} steps" + (f", CFG {guidance:g}" if guidance > 1 else "")


def base_settings(model: str) -> dict[str, Setting]:
    """The multi-step base model's settings (both CFG halves at its own steps and guidance, from its recipe.json)."""
    steps, guidance = base_sampling(model)
    halves = ("cond", "uncond") if guidance > 1 else ("cond",)
    return {f"base, {steps} steps, CFG {guidance:g}, {half}": Setting(steps, guidance, half, str(model))
            for half in halves}


def one_step_settings(model: str) -> dict[str, Setting]:
    """The one-step model's settings: 1, 2 and 4 steps, and 4 steps with guidance 5 (both halves)."""
    return {"1 step": Setting(1, model=model),
            "2 steps": Setting(2, model=model),
            "4 steps": Setting(4, model=model),
            # the toy's default is no guidance (as SDXL Turbo's); SDXL base's default guidance is 5
            "4 steps, CFG 5, cond": Setting(4, 5.0, "cond", model),
            "4 steps, CFG 5, uncond": Setting(4, 5.0, "uncond", model)}


SETTINGS = one_step_settings(MODEL)


def use_model(model: str) -> None:
    """Test `model`'s shipped 1-step SAEs (saes/pretrained/<model>, as `saes/pretrained/toy/ship.sh` makes them)
    instead of the toy's: an embedded one-step model of the toy's architecture (`toy-turbo`, trained from
    `toy-base`'s weights). Refused in one line otherwise."""
    from interp.models.t2i import KNOWN_MODELS, TOY_BLOCKS

    global MODEL, SAE_ROOT, SETTINGS
    one_step = [name for name, known in KNOWN_MODELS.items()
                if known.embedded and known.blocks == TOY_BLOCKS and known.default_steps == 1]
    if model not in one_step:
        raise ValueError(f"{model!r} is not an embedded one-step model of the toy's architecture (one of "
                         f"{', '.join(one_step)})")
    root = REPO / "saes" / "pretrained" / model
    if not root.is_dir():
        raise ValueError(f"{model} has no shipped SAEs ({_shown(root)}): make them with "
                         f"`MODEL={model} bash saes/pretrained/toy/ship.sh`")
    MODEL, SAE_ROOT, SETTINGS = model, root, one_step_settings(model)


def _sae_dir(name: str) -> Path:
    """A run directory of figures that depend on the SAEs tested (measured/, riebench/, paint/): the toy's as they
    were, another model's with its name, so that both sets of results live side by side under one run root."""
    return RUN_ROOT / (name if MODEL == DEFAULT_MODEL else f"{name}-{MODEL}")


@dataclass(frozen=True)
class RunConfig:
    n_eval: int = 200            # held-out captions (the world's held-out split), one seed each
    eval_seed: int = 33
    n_train: int = 200           # captions of the ceiling SAEs' stores (world captions of another seed)
    train_seed: int = 3333
    ceiling_steps: int = 1000    # TopK training steps of each ceiling SAE (4M vectors; the shipped saw 10M)
    ceiling_batch: int = 4096
    ceiling_lr: float = 1e-3     # the shipped SAEs' (saes/pretrained/toy/ship.sh)
    top_k: int = 20              # positions in each feature's top-k overlap
    min_firing: int = 20         # a feature is compared when it fires at least this often in the 1-step run
    random_seed: int = 0
    threads: int = 1             # the cores are shared: two threads on an oversubscribed machine run far slower


# ----------------------------------------------------------------------------- measuring functions

def random_direction_sae(d_in: int, d_sae: int, k: int, b_dec: torch.Tensor | None = None, seed: int = 0):
    """The floor: a TopK SAE whose d_sae decoder directions are random unit vectors, encoder = decoder transposed
    (each latent reads its own direction), b_dec the given centre (e.g. the trained SAE's), k as the trained one."""
    from saes.sae import SAE, SAEConfig

    generator = torch.Generator().manual_seed(seed)
    directions = torch.randn(d_sae, d_in, generator=generator)
    directions = directions / directions.norm(dim=1, keepdim=True)
    sae = SAE(SAEConfig("topk", d_in, d_sae, k=k, metadata={"random_directions_seed": seed}))
    sae.W_dec.data.copy_(directions)
    sae.W_enc.data.copy_(directions.T)
    if b_dec is not None:
        sae.b_dec.data.copy_(b_dec.float())
    return sae.eval()


def position_vectors(updates: torch.Tensor) -> torch.Tensor:
    """(n, C, H, W) block updates -> (n * H * W, C) vectors, image-major then row-major positions, so that the same
    row of two settings' vectors is the same image and position."""
    return updates.float().permute(0, 2, 3, 1).reshape(-1, updates.shape[1])


def reconstruction_metrics(sae, vectors: torch.Tensor, batch: int = 8192) -> dict:
    """Explained variance, L0, dead fraction (features that never fire on `vectors`) through saes.evaluate."""
    from saes.evaluate import evaluate

    result = evaluate(sae, (vectors[i:i + batch] for i in range(0, len(vectors), batch)))
    return {k: result[k] for k in ("tokens", "explained_variance", "l0", "dead_fraction")}


def _pearson_columns(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per column of (n, f) tensors: Pearson correlation; 0 where either column is constant."""
    a = a.double() - a.double().mean(0)
    b = b.double() - b.double().mean(0)
    denominator = (a.pow(2).sum(0) * b.pow(2).sum(0)).sqrt()
    return torch.where(denominator > 0, (a * b).sum(0) / denominator.clamp_min(1e-300), torch.zeros_like(denominator))


def feature_agreement(reference: torch.Tensor, other: torch.Tensor, top_k: int = 20, min_firing: int = 20) -> dict:
    """How the same features fire on paired rows (the same image and position) of two runs.

    reference, other: (n, d_sae) latents, row i of both the same image and position. Over the features that fire on
    at least `min_firing` rows of the reference: `correlation`, the mean Pearson correlation of a feature's
    activations (0 for a feature silent in `other`); `top_k_overlap`, the mean share of a feature's top_k rows in the
    reference that are among its top_k firing rows in `other`. `active_jaccard`: per row where either fires, |A & B|
    / |A | B| of the two sets of active features, averaged."""
    if reference.shape != other.shape or reference.ndim != 2:
        raise ValueError(f"paired latents must have one (n, d_sae) shape, got {tuple(reference.shape)} and "
                         f"{tuple(other.shape)}")
    if not 0 < top_k <= min_firing:
        raise ValueError(f"top_k must be between 1 and min_firing ({min_firing}), got {top_k}")
    compared = ((reference > 0).sum(0) >= min_firing).nonzero().flatten()
    active_a, active_b = reference > 0, other > 0
    union = (active_a | active_b).sum(1)
    jaccard = ((active_a & active_b).sum(1)[union > 0].double() / union[union > 0].double())
    result = {"features_compared": int(len(compared)),
              "active_jaccard": float(jaccard.mean()) if len(jaccard) else None}
    if not len(compared):
        return result | {"correlation": None, "correlation_median": None, "top_k_overlap": None}
    a, b = reference[:, compared], other[:, compared]
    correlation = _pearson_columns(a, b)
    top_a = a.topk(top_k, dim=0).indices  # (top_k, f): every compared feature fires on >= top_k rows
    top_b_values, top_b = b.topk(top_k, dim=0)
    overlaps = []
    for f in range(a.shape[1]):
        firing_b = set(top_b[:, f][top_b_values[:, f] > 0].tolist())  # rows where it does not fire are no match
        overlaps.append(len(set(top_a[:, f].tolist()) & firing_b) / top_k)
    return result | {"correlation": float(correlation.mean()), "correlation_median": float(correlation.median()),
                     "top_k_overlap": float(np.mean(overlaps))}


def update_drift(reference: torch.Tensor, other: torch.Tensor) -> float:
    """How far a block's updates moved from the reference run's, on paired rows: sum ||other - reference||^2 over
    the reference's total variance sum ||reference - mean||^2 (0: the same updates; 1: as far as the updates spread;
    about 2 for unrelated updates of the same spread). reference, other: (n, d) paired vectors."""
    reference, other = reference.double(), other.double()
    spread = (reference - reference.mean(0)).pow(2).sum()
    return float((other - reference).pow(2).sum() / spread.clamp_min(1e-300))


# ----------------------------------------------------------------------------- the run

def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _log(message: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {message}"
    print(line, flush=True)
    RUN_ROOT.mkdir(parents=True, exist_ok=True)
    with open(RUN_ROOT / "log.txt", "a") as log:
        log.write(line + "\n")


def held_out_prompts(truth, n: int, seed: int) -> tuple[list[str], list]:
    """n captions of the world's held-out split (attribute combinations the toy's recipe never rendered), with
    their scenes."""
    rng = np.random.default_rng(seed)
    scenes = [truth.held_out_scene(rng) for _ in range(n)]
    return [truth.caption(s) for s in scenes], scenes


def capture_setting(model, blocks, prompts: list[str], seeds: list[int], setting: Setting, truth, scenes,
                    batch: int = 20, halves: tuple[str, ...] | None = None) -> tuple[dict, dict]:
    """{half: {block: (n, steps, C, H, W) fp16}} updates of the setting's half (or of each of `halves`: ("cond",
    "uncond") under guidance, the two halves of one CFG batch, so of one generation), and the probe's reading of
    its images."""
    from interp.hooks.diffusion import capture_updates

    kept = halves or (setting.half,)
    parts = {half: {b: [] for b in blocks} for half in kept}
    scores = []
    probe = truth.probe()
    for i in range(0, len(prompts), batch):
        with capture_updates(model, blocks, device="cpu") as cap:
            images = model.generate(prompts[i:i + batch], steps=setting.steps, seed=seeds[i:i + batch],
                                    guidance=setting.guidance, output_type="np")
        for half in kept:
            for b in blocks:
                parts[half][b].append(cap.updates(b, half).transpose(0, 1).to(torch.float16))
        scores += [probe.score((img * 255).round().astype(np.uint8), s) for img, s in zip(images, scenes[i:i + batch])]
    quality = {k: float(np.mean([s[k] for s in scores])) for k in scores[0]}
    return {half: {b: torch.cat(v) for b, v in by_block.items()} for half, by_block in parts.items()}, quality


def _eval_updates(models, blocks, cfg: RunConfig, truth) -> dict[str, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file, save_file

    from interp.atomic import atomic_write, atomic_write_text

    prompts, scenes = held_out_prompts(truth, cfg.n_eval, cfg.eval_seed)
    seeds = list(range(cfg.eval_seed * 1000, cfg.eval_seed * 1000 + cfg.n_eval))
    def files(setting):
        path = RUN_ROOT / "eval" / f"{setting.slug}.safetensors"
        identity = {"prompts": prompts, "seeds": seeds, "setting": asdict(setting), "blocks": list(blocks)}
        return path, path.with_suffix(".json"), identity

    # the settings still to capture, by generation: both halves of a CFG batch come from one
    pending: dict[tuple, list[str]] = {}
    for name, setting in SETTINGS.items():
        path, quality_path, identity = files(setting)
        if not (path.exists() and quality_path.exists()
                and json.loads(quality_path.read_text())["identity"] == identity):
            pending.setdefault((setting.model, setting.steps, setting.guidance), []).append(name)
    for names in pending.values():
        setting = SETTINGS[names[0]]
        _log(f"capturing {cfg.n_eval} held-out generations: {' and '.join(names)}")
        by_half, quality = capture_setting(models[setting.model], blocks, prompts, seeds, setting, truth, scenes,
                                           halves=tuple(SETTINGS[n].half for n in names))
        for name in names:
            path, quality_path, identity = files(SETTINGS[name])
            updates = by_half[SETTINGS[name].half]
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda tmp: save_file({b: t.contiguous() for b, t in updates.items()}, tmp))
            atomic_write_text(quality_path, json.dumps({"identity": identity, "quality": quality}) + "\n")
    return {name: load_file(str(files(setting)[0])) for name, setting in SETTINGS.items()}


def _ceiling_sae(model, blocks: list[str], block: str, setting: Setting, cfg: RunConfig, d_sae: int, k: int):
    """A TopK SAE of the shipped size trained on this setting's updates (pooled over steps): the ceiling."""
    from interp.collect import CollectionPlan, collect
    from interp.store import ActivationStore
    from saes.sae import SAE
    from saes.train import TrainConfig, train

    directory = RUN_ROOT / "ceiling" / f"{setting.slug}-{cfg.ceiling_steps}x{cfg.ceiling_batch}" / block
    if (directory / "cfg.json").exists():
        return SAE.load(directory).eval()
    store_dir = RUN_ROOT / "stores" / setting.slug
    if not (store_dir / "manifest.json").exists():
        _log(f"collecting {cfg.n_train} training generations for the ceiling SAEs: {setting.slug}")
        from zoo.shapes import world_prompts

        prompts = world_prompts(cfg.n_train, cfg.train_seed)
        plan = CollectionPlan(model=setting.model, blocks=list(blocks), prompts=prompts,
                              seeds=list(range(cfg.n_train)), steps=setting.steps, guidance=setting.guidance,
                              half=setting.half)
        collect(model, plan, store_dir, progress=False)
    store = ActivationStore(store_dir)

    def passes():
        epoch = 0
        while True:  # the trainer stops at total_tokens; each pass reshuffles
            n = 0
            for batch in store.batches(block, cfg.ceiling_batch, seed=epoch):
                n += 1
                yield batch
            if n == 0:
                raise ValueError(f"{_shown(store_dir)} holds no vectors of {block}")
            epoch += 1

    _log(f"training the ceiling SAE: {setting.slug} {block} ({cfg.ceiling_steps} steps of {cfg.ceiling_batch})")
    config = TrainConfig(architecture="topk", d_in=store.channels(block), d_sae=d_sae, k=k,
                         batch_size=cfg.ceiling_batch, lr=cfg.ceiling_lr,
                         total_tokens=cfg.ceiling_steps * cfg.ceiling_batch, dead_after_tokens=500_000,
                         log_every_steps=100, checkpoint_every_steps=500,
                         metadata={"hook_name": block, "model_name": setting.model, "store": _shown(store_dir)})
    return train(config, passes(), directory, progress=False).eval()


def _measure_block(block: str, saes: dict, updates: dict[str, torch.Tensor], cfg: RunConfig) -> dict:
    """Every figure of one block: per setting, per SAE kind, reconstruction (all steps and per step) and, for the
    shipped and random SAEs, agreement per step with the 1-step run."""
    reference = position_vectors(updates[REFERENCE][:, 0])
    reference_latents = {kind: saes[kind].encode(reference) for kind in ("shipped", "random")}
    out = {}
    for name, setting_updates in updates.items():
        steps = setting_updates.shape[1]
        entry = {}
        for kind in ("shipped", "ceiling", "random"):
            sae = saes[kind][name] if kind == "ceiling" else saes[kind]
            pooled = position_vectors(setting_updates.transpose(0, 1).reshape(-1, *setting_updates.shape[2:]))
            entry[kind] = {"all_steps": reconstruction_metrics(sae, pooled),
                           "per_step": [reconstruction_metrics(sae, position_vectors(setting_updates[:, s]))
                                        for s in range(steps)]}
            if kind != "ceiling":
                entry[kind]["agreement_per_step"] = [
                    feature_agreement(reference_latents[kind], sae.encode(position_vectors(setting_updates[:, s])),
                                      cfg.top_k, cfg.min_firing) for s in range(steps)]
        out[name] = entry
    return out


def _measured_with(config: dict) -> dict:
    """What a block's figures depend on (not how many threads computed them)."""
    return {k: v for k, v in config.items() if k != "threads"}


def run(args) -> int:
    from interp.ground_truth import ground_truth_for
    from interp.models.t2i import load_t2i
    from saes.sae import load_sae_set

    global RUN_ROOT
    RUN_ROOT = Path(args.out).resolve()
    cfg = RunConfig(n_eval=args.n_eval, n_train=args.n_train, ceiling_steps=args.ceiling_steps, threads=args.threads)
    torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    if args.base:
        SETTINGS.update(base_settings(args.base))
    models = {MODEL: load_t2i(MODEL)}
    if args.base:
        models[args.base] = load_t2i(args.base)
    for loaded in models.values():
        loaded.pipe.set_progress_bar_config(disable=True)
    model = models[MODEL]
    shipped = load_sae_set(SAE_ROOT)
    blocks = [b for b in model.default_blocks if b in shipped]
    _log(f"step transfer on {MODEL}: blocks {', '.join(blocks)}; settings {', '.join(SETTINGS)}")
    truth = ground_truth_for(model)
    updates = _eval_updates(models, blocks, cfg, truth)
    measured_dir = _sae_dir("measured")
    for block in blocks:
        path = measured_dir / f"{block}.json"
        kept = json.loads(path.read_text()) if path.exists() else None
        if kept and _measured_with(kept["config"]) == _measured_with(asdict(cfg)) and list(kept["settings"]) == list(SETTINGS):
            _log(f"have {_shown(path)}: skipping")
            continue
        sae = shipped[block]
        saes = {"shipped": sae,
                "random": random_direction_sae(sae.cfg.d_in, sae.cfg.d_sae, sae.cfg.k, sae.b_dec.data, cfg.random_seed),
                "ceiling": {name: _ceiling_sae(models[setting.model], blocks, block, setting, cfg, sae.cfg.d_sae, sae.cfg.k)
                            for name, setting in SETTINGS.items()}}
        _log(f"measuring {block}")
        with torch.no_grad():
            figures = _measure_block(block, saes, {name: updates[name][block] for name in SETTINGS}, cfg)
        from saes.strict_json import write_json

        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"config": asdict(cfg), "block": block, "settings": figures}, indent=2)
    _log(f"run done in {time.perf_counter() - started:.0f} s")
    args.docs = False
    return report(args)


# ----------------------------------------------------------------------------- the causal side

CAUSAL_STEPS = (1, 2, 4)
CAUSAL_CATEGORIES = ("change colour", "change texture", "change shape")
CAUSAL_BLOCKS = ("up_blocks.1.attentions.1", "up_blocks.1.attentions.2")  # where the toy draws shape and colour
CAUSAL_MULTIPLIERS = (1.0, 2.0)
CAUSAL_K_TRANS = 5
CAUSAL_LIMIT = 20  # tasks per category


def causal(args) -> int:
    """RIEBench's shapes suite with the shipped 1-step SAEs (the sae method, static, through the blocks that draw
    shape and colour) at 1, 2 and 4 steps: the same tasks, the same edit rule, applied at every step."""
    from riebench.methods import MethodConfig
    from riebench.runner import Runner, RunConfig as BenchConfig, load_saes

    global RUN_ROOT
    RUN_ROOT = Path(args.out).resolve()
    torch.set_num_threads(args.threads)
    configs = [MethodConfig("sae", k_trans=CAUSAL_K_TRANS, multiplier=m, blocks=list(CAUSAL_BLOCKS))
               for m in CAUSAL_MULTIPLIERS]
    model = None
    for steps in CAUSAL_STEPS:
        _log(f"RIEBench with the 1-step SAEs at {steps} step(s): {', '.join(CAUSAL_CATEGORIES)}, "
             f"{args.limit} tasks each")
        bench = BenchConfig(model=MODEL, categories=list(CAUSAL_CATEGORIES), limit_per_category=args.limit,
                            saes=str(SAE_ROOT), steps=steps, configs=configs)
        runner = Runner(bench, _sae_dir("riebench") / f"steps{steps}", model=model, progress=False)
        model = runner.model
        print(runner.run())
    if args.base:  # the same tasks and edits on the base model's generations, at its own steps and guidance
        column = base_column(args.base)
        _log(f"RIEBench with the 1-step SAEs on {column} ({args.base}): {', '.join(CAUSAL_CATEGORIES)}, "
             f"{args.limit} tasks each")
        bench = BenchConfig(model=args.base, categories=list(CAUSAL_CATEGORIES), limit_per_category=args.limit,
                            saes=str(SAE_ROOT), steps=base_sampling(args.base)[0], configs=configs)
        # the toy's SAEs on another model, on purpose: given loaded, past the runner's check that they were
        # trained on the model they edit (the question here is whether they transfer)
        saes = load_saes(str(SAE_ROOT), list(CAUSAL_BLOCKS))
        print(Runner(bench, _sae_dir("riebench") / "base", saes=saes, progress=False).run())
    return 0


def causal_results(base: str | None = None) -> dict | None:
    """{steps: {config label: {category: {success, preservation, n}}}} from the causal runs, or None; with
    ``base`` (`toy-base` or a recipe's pipeline) and its run done, also {base_column(base): ...}."""
    from riebench.runner import load_results

    out = {}
    runs = [(str(steps), _sae_dir("riebench") / f"steps{steps}") for steps in CAUSAL_STEPS]
    if base and load_results(_sae_dir("riebench") / "base")[0]:
        runs.append((base_column(base), _sae_dir("riebench") / "base"))
    for steps, directory in runs:
        done, failed = load_results(directory)
        if not done:
            return None
        table = {}
        for result in done:
            cell = table.setdefault(result["label"] + f", m {result['config']['multiplier']:g}", {}).setdefault(
                result["category"], {"success": [], "preservation": []})
            for key in ("success", "preservation"):
                cell[key].append(float(result["metrics"][key]))
        out[steps] = {label: {category: {"success": float(np.mean(v["success"])),
                                         "preservation": float(np.mean(v["preservation"])), "n": len(v["success"])}
                              for category, v in sorted(categories.items())}
                      for label, categories in sorted(table.items())}
        out[steps]["failed"] = len(failed)
    return out


# ----------------------------------------------------------------------------- painted labels

PAINT_STEPS = CAUSAL_STEPS
PAINT_BLOCKS = CAUSAL_BLOCKS
PAINT_ATTRIBUTES = ("colour", "texture", "shape")  # what the RIEBench categories above change
PAINT_PER_LABEL = 1      # features per label: the label search's first (`FeatureLibrary.search`: by the card's
                         # 1-step causal score, then AUROC): the feature the Paint tab offers for the label
PAINT_STRENGTHS = (3.0, 6.0, 12.0)  # x the feature's mean activation; 3: `saes causal`'s and the Paint tab's default
PAINT_SCENES = 24        # held-out scenes per label (`saes causal`'s default)
PAINT_SEED = 33          # the scenes' seed: other scenes than those of the cards' scores (seed 21), which chose
                         # the features, so that the 1-step figure is not the choice's own measurement


def paint_features(library, blocks=PAINT_BLOCKS, attributes=PAINT_ATTRIBUTES, per_label: int = PAINT_PER_LABEL):
    """[(block, feature, label)]: per block and label of `attributes`, the label search's first `per_label`
    features (the best painters at 1 step by the cards' `saes causal` scores, then by AUROC)."""
    from saes.library import label_rank

    chosen = []
    for block in blocks:
        by_label: dict[str, list[dict]] = {}
        for card in library.cards(block):
            if card.get("label") and card["label"].partition("=")[0] in attributes:
                by_label.setdefault(card["label"], []).append(card)
        for label in sorted(by_label):
            chosen += [(block, c["id"], label) for c in sorted(by_label[label], key=label_rank)[:per_label]]
    return chosen


def paint(args) -> int:
    """Painted labels with the shipped 1-step SAEs at 1, 2 and 4 steps: `saes causal`'s measurement
    (`saes.causal.causal_label_scores`: the feature painted into held-out objects at every step, the world's probe
    reads whether the label shows there and whether the rest is kept), the same scenes and seeds at each step count.
    Resumable: one file per step count, strength and block under runs/step_transfer/paint/."""
    from interp.models.t2i import load_t2i
    from saes.causal import causal_label_scores
    from saes.library import FeatureLibrary
    from saes.strict_json import write_json

    global RUN_ROOT
    RUN_ROOT = Path(args.out).resolve()
    torch.set_num_threads(args.threads)
    library = FeatureLibrary(args.sae)
    chosen = paint_features(library, args.block or PAINT_BLOCKS, per_label=args.per_label)
    # (run directory, model, steps, what the config adds): the toy at each step count, then the base model at its
    # own steps and guidance (its generations' unedited images are its own: one `originals` per model)
    runs = [(f"steps{steps}", MODEL, steps, {}) for steps in args.steps]
    if args.base:
        runs.append(("base", args.base, base_sampling(args.base)[0],
                     {"model": args.base, "column": base_column(args.base)}))
    models: dict = {}
    originals: dict = {}
    for directory, name, steps, extra in runs:
        for strength in args.strength:
            for block in dict.fromkeys(b for b, _, _ in chosen):
                features = [f for b, f, _ in chosen if b == block]
                config = {"steps": steps, "strength": strength, "scenes": args.scenes, "seed": args.seed,
                          "block": block, "features": features, "sae": _shown(Path(args.sae).resolve()), **extra}
                path = _sae_dir("paint") / directory / f"{block}-s{strength:g}.json"
                if path.exists() and json.loads(path.read_text())["config"] == config:
                    continue
                if name not in models:
                    models[name] = load_t2i(name)
                    models[name].pipe.set_progress_bar_config(disable=True)
                _log(f"painting {len(features)} labelled features of {block} at {steps} step(s)"
                     f"{'' if name == MODEL else ' of ' + extra['column']}, strength {strength:g}, "
                     f"{args.scenes} scenes each")
                start = time.perf_counter()
                scores = causal_label_scores(library, models[name], block, features, n_scenes=args.scenes,
                                             strength=strength, seed=args.seed,
                                             originals=originals.setdefault(name, {}), steps=steps,
                                             preservation=True)
                path.parent.mkdir(parents=True, exist_ok=True)
                write_json(path, {"config": config, "seconds": time.perf_counter() - start,
                                  "scores": {str(f): {"label": library.card(block, f)["label"],
                                                      "card_causal_label": library.card(block, f).get("causal_label"),
                                                      **scores[f]} for f in features}}, indent=2)
    _log("painted labels done")
    return 0


def paint_results(base: str | None = None) -> dict | None:
    """{"config", "features": [{block, feature, label, card_causal_label}], "scores": {steps: {strength: {block:
    {feature: {causal_label, causal_label_before, causal_label_n, preservation}}}}}} from the paint runs, or None;
    with ``base`` also the base model's run, under its column name ("base, 30 steps, CFG 5"). Every step count
    must have been run with the same features, scenes and seed."""
    root = _sae_dir("paint")
    files = sorted(root.glob("steps*/*.json")) + (sorted(root.glob("base/*.json")) if base else [])
    if not files:
        return None
    scores: dict = {}
    features, shared = {}, None
    for path in files:
        data = json.loads(path.read_text())
        config = data["config"]
        common = {k: config[k] for k in ("scenes", "seed", "sae")}
        if shared is None:
            shared = common
        elif common != shared:
            raise ValueError(f"{_shown(path)} was painted with {common}, others with {shared}: run "
                             "`python -m experiments.step_transfer paint` again with one setting")
        block = config["block"]
        column = config.get("column", str(config["steps"]))  # the base model's: "base, 30 steps, CFG 5"
        scores.setdefault(column, {}).setdefault(f"{config['strength']:g}", {})[block] = {
            f: {k: v for k, v in entry.items() if k not in ("label", "card_causal_label")}
            for f, entry in data["scores"].items()}
        for f, entry in data["scores"].items():
            features[(block, int(f))] = {"block": block, "feature": int(f), "label": entry["label"],
                                         "card_causal_label": entry["card_causal_label"]}
    grid = {(s, st, b, f) for s, by_strength in scores.items() for st, by_block in by_strength.items()
            for b, by_feature in by_block.items() for f in by_feature}
    steps = sorted(scores, key=lambda column: (not column.isdigit(), int(column) if column.isdigit() else 0, column))
    strengths = sorted({st for v in scores.values() for st in v}, key=float)
    missing = [(s, st, b, str(f)) for s in steps for st in strengths for (b, f) in features
               if (s, st, b, str(f)) not in grid]
    if missing:
        raise ValueError(f"the paint runs are incomplete ({len(missing)} of {len(grid) + len(missing)} measurements "
                         f"missing, e.g. {missing[0]}): run `python -m experiments.step_transfer paint` to the end")
    ordered = sorted(features.values(), key=lambda e: (PAINT_BLOCKS.index(e["block"]) if e["block"] in PAINT_BLOCKS
                                                       else len(PAINT_BLOCKS), e["label"], e["feature"]))
    base_columns = [s for s in steps if not s.isdigit()]
    counts = {"steps": [int(s) for s in steps if s.isdigit()]} | ({"base": base_columns} if base_columns else {})
    return {"config": shared | counts | {"strengths": [float(st) for st in strengths]},
            "features": ordered,
            "scores": {s: {st: scores[s][st] for st in strengths} for s in steps}}


def _steps_name(steps: str) -> str:
    """A column of the causal tables: a step count of the one-step model ("2 steps"), or the base model's name."""
    return f"{steps} step{'s' if steps != '1' else ''}" if steps.isdigit() else steps


def paint_summary_table(data: dict) -> str:
    """Per strength and step count, over the painted features: the mean share of scenes where the probe reads the
    label (after and before the edit), how many features read it on at least a quarter of the scenes, and the mean
    preservation."""
    paint = data["paint"]
    lines = ["| strength | steps | features | label read after | before | features reading it on >= 0.25 | "
             "preservation |", "|---:|---|---:|---:|---:|---:|---:|"]
    for strength in (f"{s:g}" for s in paint["config"]["strengths"]):
        for steps, by_strength in paint["scores"].items():
            entries = [e for by_feature in by_strength[strength].values() for e in by_feature.values()]
            lines.append(f"| {strength} | {_steps_name(steps)} | {len(entries)} | "
                         f"{np.mean([e['causal_label'] for e in entries]):.3f} | "
                         f"{np.mean([e['causal_label_before'] for e in entries]):.3f} | "
                         f"{sum(e['causal_label'] >= 0.25 for e in entries)} | "
                         f"{np.mean([e['preservation'] for e in entries]):.3f} |")
    return "\n".join(lines) + "\n"


def paint_table(data: dict) -> str:
    """Per painted feature: its card's 1-step score, then at each strength and step count the share of scenes that
    read the label after the edit and the preservation."""
    paint = data["paint"]
    strengths = [f"{s:g}" for s in paint["config"]["strengths"]]
    steps = list(paint["scores"])
    header = " | ".join(f"s {st}, {_steps_name(s)}" for st in strengths for s in steps)
    lines = [f"| block | label | feature | card (1 step) | {header} |",
             "|---|---|---:|---:|" + "---:|" * (len(strengths) * len(steps))]
    for e in paint["features"]:
        cells = [paint["scores"][s][st][e["block"]][str(e["feature"])] for st in strengths for s in steps]
        card = e["card_causal_label"]
        lines.append(f"| {e['block']} | {e['label']} | #{e['feature']} | {_f(card, 2)} | " + " | ".join(
            f"{c['causal_label']:.2f} / {c['preservation']:.2f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- toy-base's cost

def base_step_seconds(steps: int = 4, batch: int = 32, threads: int = 1) -> dict:
    """Seconds of one UNet-stage step of the toy-base recipe (`--objective v_prediction`, the v1 sizes, batch 32):
    text encoders and UNet forward and backward, the recipe's own noising, target and loss. Median of `steps` after
    a warm-up step; the machine's load average is recorded beside it (the cores are shared)."""
    import os
    import tempfile

    from zoo import shapes
    from zoo.t2i import build_pipeline, build_tokenizer_files
    from zoo.t2i_recipe import (TIME_IDS, RecipeConfig, encode_text, noised_and_target, set_objective,
                                       weighted_mse)

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = RecipeConfig(objective="v_prediction", unet_batch=batch)
    with tempfile.TemporaryDirectory() as tokenizer_dir:
        build_tokenizer_files(Path(tokenizer_dir), cfg.model.max_tokens)
        pipe = build_pipeline(cfg.model, Path(tokenizer_dir))
    set_objective(pipe, cfg.objective)
    modules = torch.nn.ModuleList([pipe.unet, pipe.text_encoder, pipe.text_encoder_2]).train()
    opt = torch.optim.AdamW(modules.parameters(), lr=cfg.unet_lr)
    rng = np.random.default_rng(0)
    latent = cfg.model.image_size // 2 ** (len(cfg.model.vae_channels) - 1)
    times = []
    for i in range(steps + 1):
        start = time.perf_counter()
        prompts = shapes.world_prompts(batch, seed=i)
        x0 = torch.randn(batch, cfg.model.latent_channels, latent, latent)
        t = torch.from_numpy(rng.integers(0, 1000, size=batch))
        model_input, target = noised_and_target(x0, torch.randn_like(x0),
                                                pipe.scheduler.alphas_cumprod[t].view(-1, 1, 1, 1), cfg.objective)
        embeds, pooled = encode_text(pipe, prompts)
        pred = pipe.unet(model_input, t, embeds, added_cond_kwargs={
            "text_embeds": pooled, "time_ids": torch.tensor([TIME_IDS], dtype=torch.float32).expand(batch, -1)}).sample
        loss = weighted_mse(pred, target, torch.ones(batch, 1, latent, latent))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(modules.parameters(), 1.0)
        opt.step()
        if i:
            times.append(time.perf_counter() - start)
    return {"step_s": float(np.median(times)), "steps_timed": steps, "batch": batch, "threads": threads,
            "load_average_1min": os.getloadavg()[0], "cpu_count": os.cpu_count()}


def cost(args) -> int:
    from interp.atomic import atomic_write_text

    global RUN_ROOT
    RUN_ROOT = Path(args.out).resolve()
    measured = base_step_seconds(threads=args.threads)
    RUN_ROOT.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RUN_ROOT / "base_step_cost.json", json.dumps(measured, indent=2) + "\n")
    print(json.dumps(measured, indent=2))
    return 0


# ----------------------------------------------------------------------------- the report

def collect_results(base: str | None = None) -> dict:
    if base:
        SETTINGS.update(base_settings(base))
    cfg = None
    data = {"model": MODEL, "sae_root": str(SAE_ROOT.relative_to(REPO)), "reference": REFERENCE,
            "settings": {n: asdict(s) for n, s in SETTINGS.items()}, "quality": {}, "blocks": {}}
    for name, setting in SETTINGS.items():
        path = RUN_ROOT / "eval" / f"{setting.slug}.json"
        if not path.exists():
            raise FileNotFoundError(f"{_shown(path)} is missing: run "
                                    f"`python -m experiments.step_transfer run{_model_flag()}`")
        data["quality"][name] = json.loads(path.read_text())["quality"]
    for path in sorted(_sae_dir("measured").glob("*.json")):
        measured = json.loads(path.read_text())
        cfg = cfg or measured["config"]
        if _measured_with(measured["config"]) != _measured_with(cfg) or list(measured["settings"]) != list(SETTINGS):
            raise ValueError(f"{_shown(path)} was measured with other settings than the other blocks: run "
                             "`python -m experiments.step_transfer run` to the end (it recomputes it)")
        data["blocks"][measured["block"]] = measured["settings"]
    if not data["blocks"]:
        raise FileNotFoundError(f"{_shown(_sae_dir('measured'))}/ is empty: run "
                                f"`python -m experiments.step_transfer run{_model_flag()}`")
    data["config"] = cfg
    data["scheduler"] = _scheduler_note(MODEL)
    if base:
        data["base"] = {"model": base, "column": base_column(base), "scheduler": _scheduler_note(base)}
    data["update_drift"] = _drifts(data["blocks"])
    cost_path = RUN_ROOT / "base_step_cost.json"
    data["base_step_cost"] = json.loads(cost_path.read_text()) if cost_path.exists() else None
    data["causal"] = causal_results(base)
    data["paint"] = paint_results(base)
    return data


def _drifts(blocks) -> dict:
    """{block: {setting: [drift of each step's updates from the 1-step run's]}} from the captured updates."""
    from safetensors.torch import load_file

    updates = {name: load_file(str(RUN_ROOT / "eval" / f"{setting.slug}.safetensors")) for name, setting in SETTINGS.items()}
    out = {}
    for block in blocks:
        reference = position_vectors(updates[REFERENCE][block][:, 0])
        out[block] = {name: [update_drift(reference, position_vectors(u[block][:, s])) for s in range(u[block].shape[1])]
                      for name, u in updates.items()}
    return out


def _model_flag() -> str:
    """The `--model` a command line needs to name the SAEs under test ("" for the toy's)."""
    return "" if MODEL == DEFAULT_MODEL else f" --model {MODEL}"


def _scheduler_note(model: str) -> dict:
    config = json.loads((_model_directory(model) / "scheduler" / "scheduler_config.json").read_text())
    return {k: config[k] for k in ("_class_name", "prediction_type", "timestep_spacing", "rescale_betas_zero_snr")}


def _f(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _on_toy(data: dict, name: str) -> bool:
    """Whether a setting generates with the one-step model itself (not with the base model of `--base`)."""
    return data["settings"][name]["model"] == data["model"]


def _compared_steps(entry: dict, key: str, skip_first: bool = True) -> float | None:
    """The mean of an agreement figure over the compared steps: on the one-step model, the steps after the first
    (the first is the 1-step call itself); on the base model, every step (its first call is its own weights' on the
    same noise)."""
    values = [a[key] for a in entry["agreement_per_step"][1 if skip_first else 0:] if a[key] is not None]
    return float(np.mean(values)) if values else None


MAX_STEPS_SHOWN = 8


def _shown_steps(n: int) -> list[int]:
    """The steps (0-based) a per-step cell shows: all of a short setting's, eight spread evenly over a long one's."""
    if n <= MAX_STEPS_SHOWN:
        return list(range(n))
    return sorted({round(i) for i in np.linspace(0, n - 1, MAX_STEPS_SHOWN)})


def reconstruction_table(data: dict) -> str:
    lines = ["| block | setting | EV shipped | EV ceiling | EV random | L0 shipped | dead shipped | dead ceiling |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for block, settings in data["blocks"].items():
        for name, entry in settings.items():
            s, c, r = (entry[k]["all_steps"] for k in ("shipped", "ceiling", "random"))
            lines.append(f"| {block} | {name} | {_f(s['explained_variance'])} | {_f(c['explained_variance'])} | "
                         f"{_f(r['explained_variance'])} | {s['l0']:.2f} | {s['dead_fraction']:.2f} | "
                         f"{c['dead_fraction']:.2f} |")
    return "\n".join(lines) + "\n"


def per_step_table(data: dict) -> str:
    """EV of the shipped SAE and of the ceiling at each step of each multi-step setting."""
    lines = ["| block | setting | update drift from 1 step, by step | EV shipped by step | EV ceiling by step |",
             "|---|---|---|---|---|"]
    for block, settings in data["blocks"].items():
        for name, entry in settings.items():
            n = len(entry["shipped"]["per_step"])
            if n == 1:
                continue
            shown = _shown_steps(n)
            label = name if len(shown) == n else f"{name} (steps {', '.join(str(i + 1) for i in shown)})"
            drift = data["update_drift"][block][name]
            ev = [" / ".join(_f(entry[kind]["per_step"][i]["explained_variance"], 2) for i in shown)
                  for kind in ("shipped", "ceiling")]
            lines.append(f"| {block} | {label} | " + " / ".join(_f(drift[i], 3) for i in shown) + " | "
                         + " | ".join(ev) + " |")
    return "\n".join(lines) + "\n"


def agreement_table(data: dict) -> str:
    lines = ["| block | setting | correlation (last step) | shipped: correlation, compared steps | random | "
             "top-k overlap, compared steps | random | active-set Jaccard, compared steps | random | features |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for block, settings in data["blocks"].items():
        for name, entry in settings.items():
            if name == REFERENCE:
                continue
            s, r = entry["shipped"], entry["random"]
            skip = _on_toy(data, name)
            cells = [_f(_compared_steps(e, key, skip)) for key in ("correlation", "top_k_overlap", "active_jaccard")
                     for e in (s, r)]
            lines.append(f"| {block} | {name} | {_f(s['agreement_per_step'][-1]['correlation'])} | "
                         + " | ".join(cells) + f" | {s['agreement_per_step'][0]['features_compared']} |")
    return "\n".join(lines) + "\n"


def quality_table(data: dict) -> str:
    columns = ("background", "shape", "colour", "size", "texture", "position", "all")
    lines = ["| setting | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for name, quality in data["quality"].items():
        lines.append(f"| {name} | " + " | ".join(f"{quality[c]:.2f}" for c in columns) + " |")
    return "\n".join(lines) + "\n"


def causal_table(data: dict) -> str:
    causal = data["causal"]
    steps = list(causal)
    lines = ["| category | edit | " + " | ".join(f"{_steps_name(s)}: success / preservation" for s in steps) + " |",
             "|---|---|" + "---:|" * len(steps)]
    for label in [k for k in causal[steps[0]] if k != "failed"]:
        for category in causal[steps[0]][label]:
            cells = [causal[s][label][category] for s in steps]
            lines.append(f"| {category} | {label} | " + " | ".join(
                f"{c['success']:.2f} / {c['preservation']:.2f} (n {c['n']})" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def cost_line(data: dict) -> str:
    cost = data.get("base_step_cost")
    if not cost:
        return ""
    return (f"\nOne UNet-stage step of the toy-base recipe (`--objective v_prediction`, batch {cost['batch']}, text "
            f"encoders and UNet forward and backward): {cost['step_s']:.2f} s, median of {cost['steps_timed']}, "
            f"{cost['threads']} thread(s), load average {cost['load_average_1min']:.1f} on {cost['cpu_count']} cores "
            "(`python -m experiments.step_transfer cost`).\n")


def _on_base(columns) -> str:
    """The causal paragraphs' note on the base model's column (a results dict's keys), when it has one."""
    base = [c for c in columns if not c.isdigit()]
    return (f", and on the multi-step base model ({base[0]}), which generates with its own weights, steps and "
            "guidance; the edits act on both halves of its guidance batch") if base else ""


def _scheduler_text(note: dict) -> str:
    return (f"{note['_class_name']} ({note['timestep_spacing']} timesteps, prediction {note['prediction_type']}, "
            f"zero terminal SNR {note['rescale_betas_zero_snr']})")


def markdown(data: dict) -> str:
    cfg = data["config"]
    base = data.get("base")
    on_base = "" if not base else f", and on the multi-step base model `{base['model']}` ({base['column']})"
    return (f"## Step transfer: the shipped 1-step SAEs of `{data['model']}` at 1, 2 and 4 steps{on_base}\n\n"
            f"Scheduler: {_scheduler_text(data['scheduler'])}"
            + ("" if not base else f"; the base model's: {_scheduler_text(base['scheduler'])}")
            + f"; one U-Net call per step. {cfg['n_eval']} held-out "
            f"captions, one seed each. Ceiling: TopK SAE of the shipped size trained {cfg['ceiling_steps']} steps of "
            f"{cfg['ceiling_batch']} vectors on that setting's updates of {cfg['n_train']} other captions. Floor: "
            f"random unit directions, encoder = decoder transposed, the shipped k and centre.\n\n"
            "Image quality of each setting (the world's probe on the held-out generations):\n\n" + quality_table(data)
            + "\nReconstruction over every step of the setting (EV: explained variance; dead: share of features that "
            "never fire on these vectors):\n\n" + reconstruction_table(data)
            + "\nAt each denoising step (first / second / ...): how far the block's updates moved from the 1-step "
            "run's on the same caption, seed and position (squared distance over the 1-step updates' variance: 0 the "
            f"same, about 2 unrelated), and the explained variance"
            + ("" if not base else f" (of a setting of more than {MAX_STEPS_SHOWN} steps, {MAX_STEPS_SHOWN} steps "
                                   "spread evenly, named in its row)")
            + ":\n\n" + per_step_table(data)
            + f"\nFeature agreement with the 1-step run (same caption, seed and position). The first step of every "
            f"setting of the one-step model is the 1-step call itself (agreement 1), so its columns average the "
            f"steps after it"
            + ("" if not base else "; the base model's first call is its own weights' on the same noise, so its "
                                   "columns average every step")
            + f"; features: those firing on >= {cfg['min_firing']} positions of the 1-step run; top-k: k = "
            f"{cfg['top_k']} positions:\n\n" + agreement_table(data)
            + ("" if not data.get("causal") else
               f"\nRIEBench's shapes suite with the shipped 1-step SAEs (method sae, static, k_trans {CAUSAL_K_TRANS}, "
               f"through {', '.join(CAUSAL_BLOCKS)}), the same tasks generated and edited at 1, 2 and 4 steps"
               + _on_base(data["causal"]) + " (`python -m experiments.step_transfer causal`):\n\n"
               + causal_table(data))
            + ("" if not data.get("paint") else
               f"\nPainted labels with the shipped 1-step SAEs (`saes causal`'s measurement, "
               f"`saes.causal.causal_label_scores`): per block of the RIEBench edits and label of "
               f"{', '.join(PAINT_ATTRIBUTES)}, the label search's first feature, painted at every step into the "
               f"target object of {data['paint']['config']['scenes']} held-out scenes (seed "
               f"{data['paint']['config']['seed']}; not the scenes of the cards' 1-step scores, seed 21, which chose "
               f"the features) at strength s x its mean activation; the same scenes and seeds generated and edited "
               f"at 1, 2 and 4 steps{_on_base(data['paint']['scores'])} (`python -m experiments.step_transfer "
               f"paint`). Label read: share of scenes "
               f"where the world's probe reads the label on the edited object (before: on the unedited image); "
               f"preservation: share of what the edit should not touch (background, other objects, the object's "
               f"other attributes, no new object) read as on the unedited image:\n\n" + paint_summary_table(data)
               + "\nPer feature (card: its stored 1-step score, seed 21, strength 3; each cell: label read / "
                 "preservation):\n\n" + paint_table(data))
            + cost_line(data) + made_by(data))


def made_by(data: dict) -> str:
    """The report's last line: the commands, with the flags that name the SAEs under test and the base model."""
    flags = " ".join(([f"--model {data['model']}"] if data["model"] != DEFAULT_MODEL else [])
                     + ([f"--base {data['base']['model']}"] if data.get("base") else []))
    commands = "run`, `causal`, `paint` and `cost`" if data.get("base_step_cost") else "run`, `causal` and `paint`"
    each = "" if not flags else f", each{' but `cost`' if data.get('base_step_cost') else ''} with `{flags}`"
    return f"\nMade by `python -m experiments.step_transfer {commands} (then `report`){each}.\n"


DOCS_PAGE = Path("docs") / "experiments" / "step-transfer.md"


def results_stem() -> str:
    """The results' file name: step_transfer for the toy's SAEs, step_transfer_<model> for another model's."""
    return "step_transfer" if MODEL == DEFAULT_MODEL else f"step_transfer_{MODEL.replace('-', '_')}"


def docs_markers() -> tuple[str, str]:
    """The docs page's markers around the tables of the SAEs under test (one pair per one-step model)."""
    name = "step-transfer" if MODEL == DEFAULT_MODEL else f"step-transfer {MODEL}"
    return f"<!-- {name} -->", f"<!-- /{name} -->"


def report(args) -> int:
    from interp.atomic import atomic_write_text
    from saes.strict_json import dumps

    global RUN_ROOT
    RUN_ROOT = Path(args.out).resolve()

    data = collect_results(args.base)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    stem = results_stem()
    atomic_write_text(results / f"{stem}.json", dumps(data, indent=2) + "\n")
    atomic_write_text(results / f"{stem}.md", markdown(data))
    print(f"wrote {results / stem}.json and {results / stem}.md")
    if args.docs:  # the tables of the docs page, between its markers (the prose around them is written by hand)
        from experiments.docs_page import refill

        refill(REPO / DOCS_PAGE, docs_markers(), markdown(data))
        print(f"refilled {DOCS_PAGE}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.step_transfer", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="capture, train the ceilings, measure (resumable), then report")
    defaults = RunConfig()
    run_parser.add_argument("--threads", type=int, default=defaults.threads)
    run_parser.add_argument("--n-eval", type=int, default=defaults.n_eval, help="held-out captions measured")
    run_parser.add_argument("--n-train", type=int, default=defaults.n_train, help="captions of the ceilings' stores")
    run_parser.add_argument("--ceiling-steps", type=int, default=defaults.ceiling_steps,
                            help="training steps of each ceiling SAE")
    run_parser.set_defaults(run=run)
    report_parser = commands.add_parser("report", help="write experiments/results/step_transfer.{json,md}")
    report_parser.add_argument("--docs", action="store_true", help=f"also refill the tables of {DOCS_PAGE}")
    report_parser.set_defaults(run=report)
    cost_parser = commands.add_parser("cost", help="time one UNet-stage step of the toy-base recipe "
                                                   "(runs/step_transfer/base_step_cost.json, read by report)")
    cost_parser.add_argument("--threads", type=int, default=defaults.threads)
    cost_parser.set_defaults(run=cost)
    causal_parser = commands.add_parser("causal", help="RIEBench edits with the 1-step SAEs at 1, 2 and 4 steps "
                                                       "(resumable; read by report)")
    causal_parser.add_argument("--threads", type=int, default=defaults.threads)
    causal_parser.add_argument("--limit", type=int, default=CAUSAL_LIMIT, help="tasks per category")
    causal_parser.set_defaults(run=causal)
    paint_parser = commands.add_parser("paint", help="painted labels with the 1-step SAEs at 1, 2 and 4 steps "
                                                     "(resumable; read by report)")
    paint_parser.add_argument("--threads", type=int, default=defaults.threads)
    paint_parser.add_argument("--sae", default=None,
                              help="the SAEs and their feature cards (default: the shipped SAEs of --model)")
    paint_parser.add_argument("--block", action="append", default=None,
                              help=f"paint features of this block (repeatable; default: {', '.join(PAINT_BLOCKS)})")
    paint_parser.add_argument("--per-label", type=int, default=PAINT_PER_LABEL, help="features per label")
    paint_parser.add_argument("--scenes", type=int, default=PAINT_SCENES, help="held-out scenes per label")
    paint_parser.add_argument("--seed", type=int, default=PAINT_SEED, help="seed of the scenes (with the label)")
    paint_parser.add_argument("--steps", type=int, nargs="+", default=list(PAINT_STEPS), help="step counts")
    paint_parser.add_argument("--strength", type=float, nargs="+", default=list(PAINT_STRENGTHS),
                              help="strengths, x the feature's mean activation")
    paint_parser.set_defaults(run=paint)
    for sub in (run_parser, report_parser, causal_parser, paint_parser):
        sub.add_argument("--base", default=None, metavar="MODEL",
                         help="also measure this multi-step model of the toy's architecture (`toy-base`, or a "
                              "pipeline saved by `python -m zoo train t2i --objective v_prediction`) at its steps "
                              "and guidance, both CFG halves")
    for sub in (run_parser, report_parser, causal_parser, paint_parser):
        sub.add_argument("--model", default=DEFAULT_MODEL,
                         help="the one-step model whose shipped 1-step SAEs (saes/pretrained/MODEL) are tested: "
                              "toy (default), or toy-turbo, trained from toy-base's weights (the same lineage)")
    for sub in (run_parser, report_parser, cost_parser, causal_parser, paint_parser):
        sub.add_argument("--out", default=_shown(RUN_ROOT), help="the run directory")
        sub.add_argument("--results", default=_shown(RESULTS), help="where the JSON and markdown tables go")
    args = parser.parse_args(argv)
    # --model first: --base is checked against its sizes
    for flag, check in (("model", use_model), ("base", base_sampling)):  # a wrong one is one line, before any work
        if getattr(args, flag, None):
            try:
                check(getattr(args, flag))
            except (OSError, ValueError) as err:
                print(f"error: --{flag}: {err}", file=sys.stderr)
                return 2
    if getattr(args, "sae", "") is None:
        args.sae = _shown(SAE_ROOT)
    if args.run is report:  # what is missing under runs/ is one line that names the command to run
        try:
            return report(args)
        except (FileNotFoundError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

"""The step-transfer measurement (`run`): the shipped 1-step SAEs on a model's block updates at each setting, beside
a ceiling (a TopK SAE trained on that setting) and a floor (random directions); reconstruction and feature agreement
with the 1-step run, per block, resumable under the study's run directory."""

from __future__ import annotations

import json
import time
from dataclasses import asdict

import numpy as np
import torch

from .study import REFERENCE, RunConfig, Setting, Study, _shown

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


def _eval_updates(study: Study, models, blocks, cfg: RunConfig, truth) -> dict[str, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file, save_file

    from interp.atomic import atomic_write, atomic_write_text

    prompts, scenes = held_out_prompts(truth, cfg.n_eval, cfg.eval_seed)
    seeds = list(range(cfg.eval_seed * 1000, cfg.eval_seed * 1000 + cfg.n_eval))
    def files(setting):
        path = study.run_root / "eval" / f"{setting.slug}.safetensors"
        identity = {"prompts": prompts, "seeds": seeds, "setting": asdict(setting), "blocks": list(blocks)}
        return path, path.with_suffix(".json"), identity

    # the settings still to capture, by generation: both halves of a CFG batch come from one
    pending: dict[tuple, list[str]] = {}
    for name, setting in study.settings.items():
        path, quality_path, identity = files(setting)
        if not (path.exists() and quality_path.exists()
                and json.loads(quality_path.read_text())["identity"] == identity):
            pending.setdefault((setting.model, setting.steps, setting.guidance), []).append(name)
    for names in pending.values():
        setting = study.settings[names[0]]
        study.log(f"capturing {cfg.n_eval} held-out generations: {' and '.join(names)}")
        by_half, quality = capture_setting(models[setting.model], blocks, prompts, seeds, setting, truth, scenes,
                                           halves=tuple(study.settings[n].half for n in names))
        for name in names:
            path, quality_path, identity = files(study.settings[name])
            updates = by_half[study.settings[name].half]
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda tmp: save_file({b: t.contiguous() for b, t in updates.items()}, tmp))
            atomic_write_text(quality_path, json.dumps({"identity": identity, "quality": quality}) + "\n")
    return {name: load_file(str(files(setting)[0])) for name, setting in study.settings.items()}


def _ceiling_sae(study: Study, model, blocks: list[str], block: str, setting: Setting, cfg: RunConfig, d_sae: int,
                 k: int):
    """A TopK SAE of the shipped size trained on this setting's updates (pooled over steps): the ceiling."""
    from interp.collect import CollectionPlan, collect
    from interp.store import ActivationStore
    from saes.sae import SAE
    from saes.train import TrainConfig, train

    directory = study.run_root / "ceiling" / f"{setting.slug}-{cfg.ceiling_steps}x{cfg.ceiling_batch}" / block
    if (directory / "cfg.json").exists():
        return SAE.load(directory).eval()
    store_dir = study.run_root / "stores" / setting.slug
    if not (store_dir / "manifest.json").exists():
        study.log(f"collecting {cfg.n_train} training generations for the ceiling SAEs: {setting.slug}")
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

    study.log(f"training the ceiling SAE: {setting.slug} {block} ({cfg.ceiling_steps} steps of {cfg.ceiling_batch})")
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



def run(study: Study, args) -> Study:
    """Capture, train the ceilings and measure every block (resumable); the study measured (with the base model's
    settings under --base), which the report then reads."""
    from interp.ground_truth import ground_truth_for
    from interp.models.t2i import load_t2i
    from saes.sae import load_sae_set

    cfg = RunConfig(n_eval=args.n_eval, n_train=args.n_train, ceiling_steps=args.ceiling_steps, threads=args.threads)
    torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    study = study.with_base(args.base)
    models = {study.model: load_t2i(study.model)}
    if args.base:
        models[args.base] = load_t2i(args.base)
    for loaded in models.values():
        loaded.pipe.set_progress_bar_config(disable=True)
    model = models[study.model]
    shipped = load_sae_set(study.sae_root)
    blocks = [b for b in model.default_blocks if b in shipped]
    study.log(f"step transfer on {study.model}: blocks {', '.join(blocks)}; settings {', '.join(study.settings)}")
    truth = ground_truth_for(model)
    updates = _eval_updates(study, models, blocks, cfg, truth)
    measured_dir = study.sae_dir("measured")
    for block in blocks:
        path = measured_dir / f"{block}.json"
        kept = json.loads(path.read_text()) if path.exists() else None
        if (kept and _measured_with(kept["config"]) == _measured_with(asdict(cfg))
                and list(kept["settings"]) == list(study.settings)):
            study.log(f"have {_shown(path)}: skipping")
            continue
        sae = shipped[block]
        saes = {"shipped": sae,
                "random": random_direction_sae(sae.cfg.d_in, sae.cfg.d_sae, sae.cfg.k, sae.b_dec.data, cfg.random_seed),
                "ceiling": {name: _ceiling_sae(study, models[setting.model], blocks, block, setting, cfg,
                                               sae.cfg.d_sae, sae.cfg.k)
                            for name, setting in study.settings.items()}}
        study.log(f"measuring {block}")
        with torch.no_grad():
            figures = _measure_block(block, saes, {name: updates[name][block] for name in study.settings}, cfg)
        from saes.strict_json import write_json

        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"config": asdict(cfg), "block": block, "settings": figures}, indent=2)
    study.log(f"run done in {time.perf_counter() - started:.0f} s")
    return study



__all__ = ["capture_setting", "feature_agreement", "held_out_prompts", "position_vectors", "random_direction_sae",
           "reconstruction_metrics", "run", "update_drift"]

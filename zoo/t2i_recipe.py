"""Recipe of the embedded text-to-image model, read top to bottom.

1. Render a data set of shapes-world scenes from the training split (the held-out
   attribute combinations are never rendered here).
2. Train the VAE to reconstruct those images; set its latent scaling factor.
3. Encode every image once (posterior means), and fine-tune the VAE decoder alone on those
   fixed latents: the encoder stays as it is, so the latent space the UNet learns does not
   move, while small shapes come out sharper (the decoder's 1000 joint steps left them blurred).
4. Train both text encoders and the UNet together to
   predict the clean latent from a noised one and a caption whose wording is drawn anew
   each time. Three quarters of the samples use the largest noise level, the one step of one-step
   generation; the rest cover every level so that several steps work too.
   `--objective epsilon|v_prediction` trains a standard multi-step diffusion model instead, as SDXL base
   relates to SDXL Turbo (`toy-base`): the noise or v target at a uniformly drawn level, a dropped prompt
   (`--empty-prompt-share`, 0.1) for classifier-free guidance, and the pipeline saved with its scheduler's
   prediction type and its sampling defaults (`--sampling-steps 30 --guidance 5`, SDXL base's) in recipe.json.
   `--init-from DIR` starts the UNet and text encoders from a saved pipeline (e.g. `toy-base`'s), so a one-step
   model trained from it by the default objective shares its lineage, as Turbo was distilled from base.
   (`--freeze-text-encoders` keeps them at their random initialisation, as SDXL keeps its
   CLIP encoders frozen; tried for #4, it left colour coded less linearly, see
   saes/pretrained/toy/notes.md. `--pretrain-text-encoders N` first trains them for N steps
   as CLIP's text tower, against a small image tower on the latents, then freezes them.)
5. Save the pipeline with `save_pretrained` (fp16 safetensors).

Checkpoints are written atomically every `checkpoint_every` steps; running the same
command again resumes from the last one. `--vae-from DIR` keeps the VAE of a saved
pipeline (steps 2-3 skipped) for a recipe change that only touches the UNet side.

    python -m zoo train t2i --out runs/t2i --threads 2   # about 2 hours on two CPU cores
    python -m zoo train t2i --objective v_prediction --vae-from zoo/weights/t2i \
        --out runs/t2i-base --threads 2                          # toy-base (docs/experiments/step-transfer.md)
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from interp.cli import add_out_argument, at_least
from . import shapes
from .t2i import T2I_CONFIGS, T2IConfig, build_pipeline, build_tokenizer_files, t2i_config
from .training import lr_at, save_checkpoint

TIME_IDS = (64, 64, 0, 0, 64, 64)  # original size, crop top-left, target size: SDXL's six numbers
# What the UNet learns to predict: the clean latent (the toy's, one-step generation), or a standard diffusion
# model's noise or v (Salimans & Ho's velocity) at every level; each is the scheduler's `prediction_type`.
OBJECTIVES = ("sample", "epsilon", "v_prediction")


@dataclass
class RecipeConfig:
    model: T2IConfig = field(default_factory=T2IConfig)
    seed: int = 0
    n_scenes: int = 30000
    object_count_weights: tuple[float, float, float] = (0.4, 0.3, 0.3)
    vae_steps: int = 1000
    vae_batch: int = 16
    vae_lr: float = 2e-3
    vae_kl_weight: float = 1e-6
    decoder_steps: int = 1000
    decoder_batch: int = 32
    decoder_lr: float = 1e-3
    unet_steps: int = 6000
    unet_batch: int = 32
    unet_lr: float = 1.5e-3
    warmup: int = 200
    one_step_share: float = 0.75  # share of samples at the largest noise level
    vae_object_weight: float = 10.0  # extra loss weight on object pixels for the VAE: objects are small
    object_weight: float = 3.0       # the same for the decoder fine-tuning and the UNet
    empty_prompt_share: float = 0.05  # unconditional samples, for classifier-free guidance
    checkpoint_every: int = 250
    threads: int = 2
    freeze_text_encoders: bool = False  # SDXL's way; the embedded model trains them with the UNet
    text_pretrain_steps: int = 0  # > 0: pretrain both text encoders contrastively (a toy CLIP), then freeze them
    text_pretrain_batch: int = 256
    text_pretrain_lr: float = 1e-3
    vae_from: str | None = None  # a saved pipeline whose VAE is kept instead of steps 2-3
    pooled_text: bool = True  # False: the pooled prompt embedding is zero throughout (`zero_pooled_text`)
    objective: str = "sample"  # OBJECTIVES; not "sample": a multi-step model, levels drawn uniformly
    init_from: str | None = None  # a saved pipeline whose UNet and text encoders the UNet stage starts from
    sampling_steps: int = 1    # how the saved pipeline generates by default (recipe.json): steps ...
    guidance: float = 0.0      # ... and classifier-free guidance (> 1: CFG, which needs empty_prompt_share > 0)
    world: str = field(default_factory=shapes.world_fingerprint)  # the shapes world it was trained on


def render_dataset(cfg: RecipeConfig) -> tuple[list[shapes.Scene], np.ndarray, np.ndarray]:
    """Scenes of the training split, their images (n, 64, 64, 3) uint8 and object masks (n, 64, 64) bool."""
    rng = np.random.default_rng(cfg.seed)
    counts = rng.choice([1, 2, 3], size=cfg.n_scenes, p=np.asarray(cfg.object_count_weights))
    scenes = [shapes.sample_split(rng, "train", int(n)) for n in tqdm(counts, desc="scenes", leave=False)]
    images = np.stack([shapes.render(s, cfg.model.image_size) for s in tqdm(scenes, desc="render", leave=False)])
    masks = np.stack([shapes.foreground_mask(s, cfg.model.image_size) for s in scenes])
    return scenes, images, masks


def loss_weights(masks: np.ndarray, size: int, object_weight: float) -> torch.Tensor:
    """Per-position loss weights (n, 1, size, size): 1 on the background, 1 + object_weight on objects."""
    m = torch.from_numpy(masks).float()[:, None]
    if m.shape[-1] != size:
        m = F.adaptive_avg_pool2d(m, size)
    return 1.0 + object_weight * m


def weighted_mse(pred: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return ((pred - target) ** 2 * weights).sum() / (weights.sum() * pred.shape[1])


def to_pixels(images: np.ndarray) -> torch.Tensor:
    """uint8 (n, H, W, 3) -> float (n, 3, H, W) in [-1, 1], as the VAE expects."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0


# May change between a run and its resumption: how long the stages run, and the object weights (the embedded
# model's run lowered the UNet's from 10 to 3 when it resumed with zero terminal SNR, keeping its VAE).
RESUMABLE_CHANGES = ("vae_steps", "decoder_steps", "unet_steps", "checkpoint_every", "threads", "object_weight",
                     "vae_object_weight", "sampling_steps", "guidance")
# Fields added after checkpoints were written: a checkpoint without one was made with this value.
ADDED_FIELDS = {"objective": "sample", "init_from": None}


# What the VAE stages depend on; the UNet stage depends on everything.
VAE_FIELDS = ("world", "seed", "n_scenes", "object_count_weights", "vae_batch", "vae_lr", "vae_kl_weight", "warmup")
DECODER_FIELDS = ("decoder_batch", "decoder_lr")
VAE_MODEL_FIELDS = ("image_size", "vae_channels", "latent_channels")


def _recipe_identity(config: dict, stage: str = "unet") -> dict:
    """What must match to resume `stage`: a new UNet or scheduler setting keeps the trained VAE."""
    config = {k: v for k, v in json.loads(json.dumps(config)).items() if k not in RESUMABLE_CHANGES}
    config = ADDED_FIELDS | config
    # a field added to the model configuration later reads as its default in a checkpoint written before it
    config["model"] = json.loads(json.dumps(asdict(T2IConfig()))) | config.get("model", {})
    if stage == "text":  # a longer pretraining resumes the shorter one; the UNet trained on that one does not
        config.pop("text_pretrain_steps", None)
    if stage == "unet":  # the UNet learns the encoder's latents: how the decoder is fine-tuned does not matter
        config = {k: v for k, v in config.items() if k not in DECODER_FIELDS}
    if stage in ("vae", "decoder"):
        fields = VAE_FIELDS + (DECODER_FIELDS if stage == "decoder" else ())
        config = {k: config.get(k) for k in fields} | {
            "model": {k: config.get("model", {}).get(k) for k in VAE_MODEL_FIELDS}}
    return config


def load_checkpoint(path: Path, cfg: RecipeConfig, stage: str = "unet") -> dict | None:
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    written = json.loads(state.get("config", "{}"))
    if _recipe_identity(written, stage) != _recipe_identity(asdict(cfg), stage):
        why = "another shapes world (palette, shapes or layout changed)" if written.get("world") != cfg.world else \
            "a different recipe configuration"
        raise SystemExit(f"{path} was written by {why}; use another --out or delete it to start over")
    return state


def train_vae(pipe, images: np.ndarray, masks: np.ndarray, cfg: RecipeConfig, out: Path, log) -> None:
    vae = pipe.vae
    ckpt = out / "vae.ckpt"
    opt = torch.optim.AdamW(vae.parameters(), lr=cfg.vae_lr, weight_decay=0.0)
    state = load_checkpoint(ckpt, cfg, "vae")
    start = 0
    if state is not None:
        vae.load_state_dict(state["vae"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        log({"stage": "vae", "resumed_at": start})
    rng = np.random.default_rng(cfg.seed + 1 + start)
    vae.train()
    for step in tqdm(range(start, cfg.vae_steps), desc="vae", initial=start, total=cfg.vae_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.vae_steps, cfg.vae_lr, cfg.warmup)
        idx = rng.integers(len(images), size=cfg.vae_batch)
        x = to_pixels(images[idx])
        posterior = vae.encode(x).latent_dist
        recon = vae.decode(posterior.sample()).sample
        mse = weighted_mse(recon, x, loss_weights(masks[idx], x.shape[-1], cfg.vae_object_weight))
        kl = posterior.kl().mean()
        loss = mse + cfg.vae_kl_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % 50 == 0:
            log({"stage": "vae", "step": step + 1, "mse": mse.item(), "kl": kl.item()})
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.vae_steps:
            save_checkpoint(ckpt, {"vae": vae.state_dict(), "opt": opt.state_dict(), "step": step + 1,
                                   "config": json.dumps(asdict(cfg), sort_keys=True)})
    vae.eval()


def finetune_decoder(pipe, images: np.ndarray, latents: torch.Tensor, masks: np.ndarray, cfg: RecipeConfig,
                     out: Path, log) -> None:
    """Train the decoder (and `post_quant_conv`) to turn the fixed posterior means `latents` (unscaled) back
    into their images. The encoder is frozen, so the UNet's targets are unchanged."""
    vae = pipe.vae
    params = list(vae.decoder.parameters()) + list(vae.post_quant_conv.parameters())
    ckpt = out / "decoder.ckpt"
    opt = torch.optim.AdamW(params, lr=cfg.decoder_lr, weight_decay=0.0)
    state = load_checkpoint(ckpt, cfg, "decoder")
    start = 0
    if state is not None:
        if state.get("vae_steps") != cfg.vae_steps:
            raise SystemExit(f"{ckpt} fine-tuned a VAE of {state.get('vae_steps')} steps, not {cfg.vae_steps}; "
                             "delete it to fine-tune again")
        vae.decoder.load_state_dict(state["decoder"])
        vae.post_quant_conv.load_state_dict(state["post_quant_conv"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        log({"stage": "decoder", "resumed_at": start})
    rng = np.random.default_rng(cfg.seed + 3 + start)
    vae.decoder.train()
    for step in tqdm(range(start, cfg.decoder_steps), desc="decoder", initial=start, total=cfg.decoder_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.decoder_steps, cfg.decoder_lr, cfg.warmup)
        idx = rng.integers(len(images), size=cfg.decoder_batch)
        x = to_pixels(images[idx])
        recon = vae.decode(latents[idx]).sample
        loss = weighted_mse(recon, x, loss_weights(masks[idx], x.shape[-1], cfg.object_weight))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % 50 == 0:
            log({"stage": "decoder", "step": step + 1, "mse": loss.item()})
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.decoder_steps:
            save_checkpoint(ckpt, {"decoder": vae.decoder.state_dict(), "post_quant_conv": vae.post_quant_conv.state_dict(),
                                   "opt": opt.state_dict(), "step": step + 1, "vae_steps": cfg.vae_steps,
                                   "config": json.dumps(asdict(cfg), sort_keys=True)})
    vae.eval()


@torch.no_grad()
def encode_latents(vae, images: np.ndarray, batch: int = 256) -> torch.Tensor:
    """Posterior means, unscaled, (n, C, h, w)."""
    return torch.cat([vae.encode(to_pixels(images[i:i + batch])).latent_dist.mean
                      for i in tqdm(range(0, len(images), batch), desc="encode", leave=False)])


def encode_text(pipe, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The pipeline's own prompt encoding, with gradients: (B, T, 2 * hidden) and (B, projection)."""
    embeds, _, pooled, _ = pipe.encode_prompt(prompts, device=torch.device("cpu"), num_images_per_prompt=1,
                                              do_classifier_free_guidance=False)
    return embeds, pooled


class LatentTower(torch.nn.Module):
    """The image side of the toy CLIP: a small CNN from a scaled latent to one embedding per text encoder."""

    def __init__(self, latent_channels: int, dims: tuple[int, int], width: int = 64):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(latent_channels, width, 3, stride=2, padding=1), torch.nn.GELU(),
            torch.nn.Conv2d(width, width, 3, stride=2, padding=1), torch.nn.GELU(), torch.nn.Flatten())
        self.heads = torch.nn.ModuleList(torch.nn.LazyLinear(d) for d in dims)

    def forward(self, latents: torch.Tensor) -> list[torch.Tensor]:
        h = self.body(latents)
        return [head(h) for head in self.heads]


def pretrain_text_encoders(pipe, scenes, latents: torch.Tensor, cfg: RecipeConfig, out: Path, log) -> None:
    """Train both text encoders as CLIP trains its text tower, against a small image tower on the latents
    (symmetric InfoNCE within the batch, learned temperature): SDXL's frozen encoders come out of such a
    contrastive pretraining, so words keep meanings of their own instead of whatever the UNet needs.
    The first encoder's pooled (end-of-text) state gets a linear head of its own; the second's text projection
    is its own. The heads and the image tower are dropped afterwards."""
    enc1, enc2 = pipe.text_encoder, pipe.text_encoder_2
    dims = (cfg.model.text_projection, cfg.model.text_projection)
    tower = LatentTower(cfg.model.latent_channels, dims)
    tower(latents[:1])  # materialise the lazy heads
    head1 = torch.nn.Linear(enc1.config.hidden_size, dims[0], bias=False)
    scale = torch.nn.Parameter(torch.tensor(np.log(1 / 0.07), dtype=torch.float32))
    modules = torch.nn.ModuleDict({"text_encoder": enc1, "text_encoder_2": enc2, "tower": tower, "head1": head1})
    opt = torch.optim.AdamW(list(modules.parameters()) + [scale], lr=cfg.text_pretrain_lr, weight_decay=0.01)
    ckpt = out / "text.ckpt"
    state = load_checkpoint(ckpt, cfg, "text")
    start = 0
    if state is not None:
        modules.load_state_dict(state["modules"])
        scale.data.copy_(state["scale"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        log({"stage": "text", "resumed_at": start})
    rng = np.random.default_rng(cfg.seed + 4 + start)
    modules.train()
    batch = min(cfg.text_pretrain_batch, len(scenes))
    targets = torch.arange(batch)  # caption i belongs to image i
    for step in tqdm(range(start, cfg.text_pretrain_steps), desc="text", initial=start, total=cfg.text_pretrain_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.text_pretrain_steps, cfg.text_pretrain_lr, min(cfg.warmup, cfg.text_pretrain_steps // 10))
        idx = rng.choice(len(scenes), size=batch, replace=False)
        ids = pipe.tokenizer([shapes.caption(scenes[i], rng) for i in idx], padding="max_length",
                             max_length=pipe.tokenizer.model_max_length, truncation=True, return_tensors="pt").input_ids
        texts = [head1(enc1(ids).pooler_output), enc2(ids).text_embeds]
        loss = 0.0
        for text, image in zip(texts, tower(latents[idx])):
            logits = scale.exp().clamp(max=100) * F.normalize(text, dim=-1) @ F.normalize(image, dim=-1).T
            loss = loss + (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets)) / 4
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % 50 == 0:
            accuracy = float((logits.argmax(1) == targets).float().mean())  # the second encoder's
            log({"stage": "text", "step": step + 1, "loss": loss.item(), "retrieval": accuracy})
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.text_pretrain_steps:
            save_checkpoint(ckpt, {"modules": modules.state_dict(), "scale": scale.data, "opt": opt.state_dict(),
                                   "step": step + 1, "config": json.dumps(asdict(cfg), sort_keys=True)})
    modules.eval()


def train_unet(pipe, scenes, latents: torch.Tensor, weights: torch.Tensor, cfg: RecipeConfig, out: Path, log,
               probe_every: int = 500) -> None:
    modules = torch.nn.ModuleDict({"unet": pipe.unet, "text_encoder": pipe.text_encoder,
                                   "text_encoder_2": pipe.text_encoder_2})
    trained = pipe.unet if cfg.freeze_text_encoders else modules
    for name in ("text_encoder", "text_encoder_2"):
        modules[name].requires_grad_(not cfg.freeze_text_encoders)
    if not cfg.pooled_text:  # the prompt only through cross-attention, as the saved weights keep it
        zero_pooled_text(pipe)
        pipe.text_encoder_2.text_projection.requires_grad_(False)
    ckpt = out / "unet.ckpt"
    opt = torch.optim.AdamW(trained.parameters(), lr=cfg.unet_lr, weight_decay=0.01)
    state = load_checkpoint(ckpt, cfg)
    start = 0
    if state is not None:
        modules.load_state_dict(state["modules"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        log({"stage": "unet", "resumed_at": start})
    sched = pipe.scheduler
    alphas_cumprod = sched.alphas_cumprod
    max_t = sched.config.num_train_timesteps - 1
    one_step_share = cfg.one_step_share if cfg.objective == "sample" else 0.0  # a base model: every level alike
    time_ids = torch.tensor([TIME_IDS], dtype=torch.float32)
    rng = np.random.default_rng(cfg.seed + 2 + start)
    trained.train()
    bar = tqdm(range(start, cfg.unet_steps), desc="unet", initial=start, total=cfg.unet_steps)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.unet_steps, cfg.unet_lr, cfg.warmup)
        idx = rng.integers(len(scenes), size=cfg.unet_batch)
        prompts = ["" if rng.random() < cfg.empty_prompt_share else shapes.caption(scenes[i], rng) for i in idx]
        x0 = latents[idx]
        t = torch.from_numpy(np.where(rng.random(cfg.unet_batch) < one_step_share, max_t,
                                      rng.integers(0, max_t + 1, size=cfg.unet_batch)))
        noise = torch.from_numpy(rng.standard_normal(x0.shape).astype(np.float32))
        model_input, target = noised_and_target(x0, noise, alphas_cumprod[t].view(-1, 1, 1, 1), cfg.objective)
        with torch.set_grad_enabled(not cfg.freeze_text_encoders):
            embeds, pooled = encode_text(pipe, prompts)
        pred = pipe.unet(model_input, t, embeds, added_cond_kwargs={
            "text_embeds": pooled, "time_ids": time_ids.expand(len(idx), -1)}).sample
        loss = weighted_mse(pred, target, weights[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if (step + 1) % 50 == 0:
            log({"stage": "unet", "step": step + 1, "loss": loss.item(), "lr": opt.param_groups[0]["lr"]})
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.unet_steps:
            save_checkpoint(ckpt, {"modules": modules.state_dict(), "opt": opt.state_dict(), "step": step + 1,
                                   "config": json.dumps(asdict(cfg), sort_keys=True)})
        if probe_every and (step + 1) % probe_every == 0:
            modules.eval()
            scores = evaluate(pipe, n_per_count={1: 48}, seed=123, steps=cfg.sampling_steps, guidance=cfg.guidance,
                              progress=False)
            log({"stage": "unet", "step": step + 1, "probe": scores["1"]})
            trained.train()
    modules.eval()


def noised_and_target(x0: torch.Tensor, noise: torch.Tensor, alpha_bar: torch.Tensor,
                      objective: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The UNet's input at a noise level and what it learns to predict there; x0, noise (B, C, h, w), alpha_bar
    (B, 1, 1, 1). The input is sqrt(a) x0 + sqrt(1 - a) noise, which is what Euler's scale_model_input makes of
    x0 + sigma noise; the target is x0 (`sample`), the noise (`epsilon`) or v = sqrt(a) noise - sqrt(1 - a) x0."""
    signal, spread = alpha_bar.sqrt(), (1 - alpha_bar).sqrt()
    model_input = signal * x0 + spread * noise
    if objective == "sample":
        return model_input, x0
    if objective == "epsilon":
        return model_input, noise
    if objective == "v_prediction":
        return model_input, signal * noise - spread * x0
    raise ValueError(f"unknown objective {objective!r}: use one of {', '.join(OBJECTIVES)}")


def set_objective(pipe, objective: str) -> None:
    """The scheduler reads the UNet's output as the objective it was trained on."""
    from diffusers import EulerDiscreteScheduler

    pipe.scheduler = EulerDiscreteScheduler.from_config(pipe.scheduler.config, prediction_type=objective)


def init_from(pipe, directory: Path) -> None:
    """Load the UNet and both text encoders of a saved pipeline of the same sizes (float32), e.g. toy-base's, as
    the start of the UNet stage."""
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    if not (directory / "unet" / "config.json").exists():
        raise SystemExit(f"--init-from {directory}: no saved pipeline there (expected {directory / 'unet'})")
    for name, cls in (("unet", UNet2DConditionModel), ("text_encoder", CLIPTextModel),
                      ("text_encoder_2", CLIPTextModelWithProjection)):
        kept = cls.from_pretrained(directory / name, torch_dtype=torch.float32)
        try:
            getattr(pipe, name).load_state_dict(kept.state_dict())
        except RuntimeError as err:
            raise SystemExit(f"--init-from {directory}: its {name} has other sizes than this recipe's: {err}") from None


@torch.no_grad()
def evaluate(pipe, n_per_count: dict[int, int], seed: int = 0, steps: int = 1, batch: int = 50,
             progress: bool = True, guidance: float = 0.0) -> dict:
    """Probe accuracy of generations (`steps`, `guidance`: one step without guidance for the toy) from held-out
    captions (one seed each).

    Returns {"1": {attribute: accuracy, ...}, "2": ..., "3": ...}.
    """
    probe = shapes.AttributeProbe()
    rng = np.random.default_rng(seed)
    results = {}
    for n_objects, n in n_per_count.items():
        scenes = [shapes.sample_split(rng, "held_out", n_objects) for _ in range(n)]
        captions = [shapes.caption(s, rng) for s in scenes]
        scores = []
        for i in tqdm(range(0, n, batch), desc=f"eval {n_objects} object(s)", disable=not progress, leave=False):
            gens = [torch.Generator().manual_seed(seed * 100003 + i + j) for j in range(len(captions[i:i + batch]))]
            images = pipe(captions[i:i + batch], num_inference_steps=steps, guidance_scale=guidance, generator=gens,
                          output_type="np").images
            scores += [probe.score((img * 255).round().astype(np.uint8), s) for img, s in zip(images, scenes[i:i + batch])]
        results[str(n_objects)] = {k: float(np.mean([s[k] for s in scores])) for k in scores[0]} | {"n": n}
    return results


def zero_pooled_text(pipe) -> None:
    """SDXL gives the UNet the prompt two ways: per token to every cross-attention, and pooled (text_encoder_2's
    projection of its end-of-text state) into the time embedding, which every ResNet adds. Zeroing that projection
    leaves only the first: in an evaluation (of the loaded copy), what the cross-attention blocks draw alone; in
    training (`--zero-pooled-text`, the projection then frozen), a model that must route the prompt through them."""
    with torch.no_grad():
        for parameter in pipe.text_encoder_2.text_projection.parameters():
            parameter.zero_()


def keep_vae(pipe, directory: Path) -> None:
    """Replace the pipeline's VAE by the one saved in `directory/vae` (float32), scaling factor included."""
    from diffusers import AutoencoderKL

    if not (directory / "vae" / "config.json").exists():
        raise SystemExit(f"--vae-from {directory}: no saved pipeline VAE there (expected {directory / 'vae'})")
    kept = AutoencoderKL.from_pretrained(directory / "vae", torch_dtype=torch.float32)
    try:
        pipe.vae.load_state_dict(kept.state_dict())
    except RuntimeError as err:
        raise SystemExit(f"--vae-from {directory}: its VAE has other sizes than this recipe's: {err}") from None
    pipe.vae.register_to_config(scaling_factor=kept.config.scaling_factor)
    pipe.vae.eval()


def set_scaling_factor(pipe, latents: torch.Tensor) -> None:
    factor = float(1.0 / latents.std())
    pipe.vae.register_to_config(scaling_factor=factor)


def cached_latents(cache: Path, vae, images: np.ndarray, cfg: RecipeConfig) -> torch.Tensor:
    """The VAE's latents of the training images, kept in `cache` for resumed runs (encoding takes minutes on a
    CPU); encoded anew when the VAE or the world they were drawn from has changed."""
    source = {"vae_steps": cfg.vae_steps, "vae_from": cfg.vae_from, "world": cfg.world}
    cached = torch.load(cache, weights_only=True) if cache.exists() else None
    if (cached is not None and all(cached.get(k) == v for k, v in source.items())
            and len(cached["latents"]) == len(images)):
        return cached["latents"].float()
    latents = encode_latents(vae, images)
    save_checkpoint(cache, source | {"latents": latents.half()})
    return latents


def main(args: argparse.Namespace) -> None:
    if args.pretrain_text_encoders < 0:
        raise SystemExit(f"--pretrain-text-encoders must be 0 (none) or a number of steps, not {args.pretrain_text_encoders}")
    cfg = RecipeConfig(model=t2i_config(args.config), seed=args.seed, n_scenes=args.scenes, vae_steps=args.vae_steps, decoder_steps=args.decoder_steps,
                       unet_steps=args.unet_steps, unet_batch=args.batch, threads=args.threads,
                       checkpoint_every=args.checkpoint_every, object_weight=args.object_weight,
                       freeze_text_encoders=args.freeze_text_encoders or args.pretrain_text_encoders > 0,
                       text_pretrain_steps=args.pretrain_text_encoders, vae_from=args.vae_from,
                       pooled_text=not args.zero_pooled_text, objective=args.objective, init_from=args.init_from,
                       empty_prompt_share=(args.empty_prompt_share if args.empty_prompt_share is not None else
                                           RecipeConfig.empty_prompt_share if args.objective == "sample" else 0.1),
                       sampling_steps=args.sampling_steps or (1 if args.objective == "sample" else 30),
                       guidance=args.guidance if args.guidance is not None else (0.0 if args.objective == "sample" else 5.0))
    if cfg.objective == "epsilon" and cfg.model.zero_terminal_snr:
        # at zero terminal SNR the noisiest input is the noise itself: predicting it says nothing of the image
        raise SystemExit("--objective epsilon cannot learn the zero-SNR level of this schedule: use v_prediction "
                         "(Lin et al. 2024, 'Common diffusion noise schedules and sample steps are flawed')")
    if cfg.guidance > 1 and cfg.empty_prompt_share <= 0:
        raise SystemExit(f"--guidance {cfg.guidance:g} needs the unconditional model: --empty-prompt-share > 0")
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe.json").write_text(json.dumps(asdict(cfg), indent=2))
    log_file = open(out / "log.jsonl", "a")

    def log(record: dict) -> None:
        record["time"] = round(time.time(), 1)
        log_file.write(json.dumps(record) + "\n")
        log_file.flush()

    build_tokenizer_files(out / "tokenizer", cfg.model.max_tokens)
    pipe = build_pipeline(cfg.model, out / "tokenizer")
    pipe.set_progress_bar_config(disable=True)
    set_objective(pipe, cfg.objective)
    scenes, images, masks = render_dataset(cfg)
    if cfg.vae_from:
        keep_vae(pipe, Path(cfg.vae_from))
    else:
        train_vae(pipe, images, masks, cfg, out, log)
    latents = cached_latents(out / "latents.pt", pipe.vae, images, cfg)
    if not cfg.vae_from:  # a kept VAE comes with its fine-tuned decoder and its scaling factor
        finetune_decoder(pipe, images, latents, masks, cfg, out, log)
        set_scaling_factor(pipe, latents)
    latents = latents * pipe.vae.config.scaling_factor
    weights = loss_weights(masks, latents.shape[-1], cfg.object_weight)
    del images, masks
    if cfg.init_from:
        init_from(pipe, Path(cfg.init_from))
    if cfg.text_pretrain_steps:
        pretrain_text_encoders(pipe, scenes, latents, cfg, out, log)
    train_unet(pipe, scenes, latents, weights, cfg, out, log, probe_every=args.probe_every)
    final = Path(args.save_to) if args.save_to else out / "pipeline"
    pipe.to(torch.float16).save_pretrained(final, safe_serialization=True)
    (final / "tokenizer" / "vocabulary.json").write_text(json.dumps(shapes.vocabulary()))
    (final / "tokenizer_2" / "vocabulary.json").write_text(json.dumps(shapes.vocabulary()))
    (final / "recipe.json").write_text(json.dumps(asdict(cfg), indent=2))
    print(f"saved the pipeline to {final}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_out_argument(parser, default="runs/t2i", help="run directory: checkpoints, log.jsonl")
    parser.add_argument("--save-to", default=None, help="where to save the final pipeline (default OUT/pipeline)")
    parser.add_argument("--config", default="v1", choices=sorted(T2I_CONFIGS),
                        help="the model's sizes (zoo.t2i.T2I_CONFIGS): v1, the shipped toy; sdxl-proportions, "
                             "most transformer layers at the lowest resolution as in SDXL (toy-v2); sdxl-blocks-only, "
                             "the same with attention only at 8 x 8")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scenes", type=at_least(1), default=RecipeConfig.n_scenes)
    parser.add_argument("--vae-steps", type=at_least(0), default=RecipeConfig.vae_steps)
    parser.add_argument("--decoder-steps", type=at_least(0), default=RecipeConfig.decoder_steps,
                        help="steps of decoder-only fine-tuning on the fixed latents")
    parser.add_argument("--unet-steps", type=at_least(0), default=RecipeConfig.unet_steps)
    parser.add_argument("--batch", type=at_least(1), default=RecipeConfig.unet_batch)
    parser.add_argument("--threads", type=at_least(1), default=RecipeConfig.threads)
    parser.add_argument("--probe-every", type=at_least(0), default=500,
                        help="probe accuracy every N UNet steps (0: never)")
    parser.add_argument("--checkpoint-every", type=at_least(1), default=RecipeConfig.checkpoint_every)
    parser.add_argument("--freeze-text-encoders", action="store_true",
                        help="keep the text encoders at their random initialisation (SDXL keeps its own frozen)")
    parser.add_argument("--pretrain-text-encoders", type=int, default=0, metavar="STEPS",
                        help="pretrain both text encoders contrastively against the images for STEPS steps (a toy CLIP) "
                             "and keep them frozen while the UNet trains, as SDXL's CLIP encoders")
    parser.add_argument("--zero-pooled-text", action="store_true",
                        help="train with the pooled prompt embedding (the prompt's path into the time embedding) "
                             "zero and frozen, so the UNet reads the prompt through its cross-attention blocks alone")
    parser.add_argument("--vae-from", default=None, metavar="DIR",
                        help="keep the VAE of this saved pipeline (e.g. zoo/weights/t2i) and train the UNet only")
    parser.add_argument("--objective", default="sample", choices=OBJECTIVES,
                        help="sample: predict the clean latent, weighted to the one-step level (the toy, as SDXL "
                             "Turbo); epsilon / v_prediction: a standard multi-step diffusion model (toy-base, as SDXL "
                             "base; epsilon needs a schedule without zero terminal SNR)")
    parser.add_argument("--empty-prompt-share", type=float, default=None,
                        help="share of samples trained with the empty prompt, for classifier-free guidance "
                             "(default 0.05 for sample, 0.1 otherwise)")
    parser.add_argument("--sampling-steps", type=int, default=None,
                        help="the saved pipeline's default steps, in recipe.json (default 1 for sample, 30 otherwise)")
    parser.add_argument("--guidance", type=float, default=None,
                        help="the saved pipeline's default guidance, in recipe.json (default 0 for sample, 5 otherwise)")
    parser.add_argument("--init-from", default=None, metavar="DIR",
                        help="start the UNet and text encoders from this saved pipeline of the same sizes (e.g. "
                             "toy-base's, to train the one-step model of its lineage)")
    parser.add_argument("--object-weight", type=float, default=RecipeConfig.object_weight,
                        help="extra loss weight on object pixels (lower it late in training)")

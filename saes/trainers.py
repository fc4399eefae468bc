"""Architecture trainers, registered by name: our fast TopK, and sae-lens' own architectures.

Every trainer takes one (batch, d_in) float tensor per `step`, returns plain-number metrics,
saves and restores its whole state (`state_dict` / `load_state_dict`, tensors and numbers only,
so checkpoints load with weights_only=True), holds the module it trains as `.sae` and hands over
an inference `SAE`.
A new architecture is added by decorating a class with `@register_trainer("name")`.
"""

from __future__ import annotations

import dataclasses

from typing import Callable

import torch
import torch.distributed as dist

from .sae import SAE
from .topk import TopKConfig, TrainingTopKSAE, remove_parallel_gradient_, set_decoder_unit_norm_

TRAINERS: dict[str, Callable] = {}


def register_trainer(name: str):
    def decorate(cls):
        TRAINERS[name] = cls
        cls.architecture = name
        return cls
    return decorate


def make_trainer(config) -> "TopKTrainer | LensTrainer":
    """config: saes.train.TrainConfig."""
    if config.architecture not in TRAINERS:
        raise ValueError(f"unknown architecture {config.architecture!r}; choose one of {', '.join(sorted(TRAINERS))}")
    return TRAINERS[config.architecture](config)


# Settings of the training config itself, which architecture options must not repeat.
CONFIG_SETTINGS = {"d_in": "the store's channel count", "d_sae": "--d-sae", "k": "--k", "batch_size": "--batch-size",
                   "lr": "--lr", "dead_after_tokens": "--dead-after-tokens", "seed": "--seed"}


def check_option_names(options: dict, known: set[str], architecture: str) -> None:
    """A clear error for an option the architecture does not have, or one that the config sets."""
    for name in options:
        if name in CONFIG_SETTINGS:
            raise ValueError(f"{name} is not an architecture option: it comes from {CONFIG_SETTINGS[name]}")
        if name not in known:
            raise ValueError(f"unknown option {name!r} for the {architecture} architecture; its options are: "
                             f"{', '.join(sorted(known - set(CONFIG_SETTINGS)))}")


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@register_trainer("topk")
class TopKTrainer:
    """Our sparse-kernel TopK trainer (Adam, unit-norm decoder, AuxK); data-parallel under DDP."""

    def __init__(self, config):
        check_option_names(config.options, {f.name for f in dataclasses.fields(TopKConfig)}, "topk")
        try:
            self.cfg = TopKConfig(d_in=config.d_in, d_sae=config.d_sae, k=config.k, batch_size=config.batch_size,
                                  lr=config.lr, dead_after_tokens=config.dead_after_tokens, seed=config.seed,
                                  **config.options).validate()
        except TypeError as err:  # an option of the wrong type, e.g. aux_k="many"
            raise ValueError(f"bad options for topk {config.options}: {err}") from None
        self.sae = TrainingTopKSAE(self.cfg, dense_dtype=torch.bfloat16 if config.autocast else None)
        self.optimizer = torch.optim.Adam(self.sae.parameters(), lr=self.cfg.lr,
                                          betas=(self.cfg.adam_beta1, self.cfg.adam_beta2), eps=self.cfg.adam_eps,
                                          fused=True)  # one pass over the 2 x d_sae x d_in weights
        self._model = None  # the DDP wrapper (or the SAE itself), made at the first step

    def prepare(self, first_batch: torch.Tensor) -> None:
        """Fresh run only: b_pre at the geometric median of the first batch (rank 0's, under DDP)."""
        self.sae.initialise_pre_bias_(first_batch)

    def _forward_module(self):
        if self._model is None:
            if _distributed():
                # DDP broadcasts rank 0's parameters here, so every rank starts identical.
                # tokens_since_fired is kept equal on all ranks by record_firing_, no per-forward sync needed.
                self._model = torch.nn.parallel.DistributedDataParallel(self.sae, forward_sync_buffers=False)
            else:
                self._model = self.sae
        return self._model

    def step(self, batch: torch.Tensor) -> dict[str, float]:
        out = self._forward_module()(batch)
        out["loss"].backward()
        remove_parallel_gradient_(self.sae.decoder_weight)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        set_decoder_unit_norm_(self.sae.decoder_weight.data)
        active = out["latent_values"] > 0
        fired = torch.zeros(self.cfg.d_sae, dtype=torch.int32)
        fired[out["latent_index"][active]] = 1
        n_tokens = torch.tensor(batch.shape[0])
        if _distributed():
            dist.all_reduce(fired, op=dist.ReduceOp.MAX)
            dist.all_reduce(n_tokens)
        self.sae.record_firing_(fired.bool(), int(n_tokens))
        mse = float(out["mse_loss"].detach())
        return {"loss": float(out["loss"].detach()), "mse_loss": mse, "aux_loss": float(out["aux_loss"].detach()),
                "explained_variance": 1.0 - mse, "l0": float(active.sum(1).float().mean())}

    def n_dead(self) -> int:
        return int(self.sae.dead_latents().sum())

    def state_dict(self) -> dict:
        return {"sae": self.sae.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.sae.load_state_dict(state["sae"])
        self.optimizer.load_state_dict(state["optimizer"])

    def to_inference(self, **metadata) -> SAE:
        return self.sae.to_inference(**metadata)


class LensTrainer:
    """A sae-lens architecture trained by sae-lens' own `SAETrainer.step` on our batches.

    options are passed to the sae-lens training config (e.g. l1_coefficient for "standard",
    l0_coefficient / jumprelu_init_threshold for "jumprelu", aux_loss_coefficient for "batchtopk",
    matryoshka_widths for "matryoshka").
    """

    architecture = ""  # our registry name
    lens_architecture = ""  # sae-lens' name

    def __init__(self, config):
        from sae_lens.config import SAETrainerConfig
        from sae_lens.registry import get_sae_training_class
        from sae_lens.training.sae_trainer import SAETrainer

        sae_cls, cfg_cls = get_sae_training_class(self.lens_architecture)
        check_option_names(config.options, {f.name for f in dataclasses.fields(cfg_cls)}, self.architecture)
        fields = {"d_in": config.d_in, "d_sae": config.d_sae, **config.options}
        if self.lens_architecture in ("topk", "batchtopk", "matryoshka_batchtopk"):
            if not 0 < config.k <= config.d_sae:
                raise ValueError(f"k must be in 1..d_sae, got k={config.k} with d_sae={config.d_sae}")
            fields["k"] = config.k
        try:
            lens_cfg = cfg_cls(**fields)
        except TypeError as err:
            raise ValueError(f"bad options for sae-lens {self.lens_architecture}: {err}") from err
        torch.manual_seed(config.seed)
        self.sae = sae_cls(lens_cfg)
        steps = max(1, config.total_tokens // config.batch_size)
        trainer_cfg = SAETrainerConfig(
            total_training_samples=steps * config.batch_size, train_batch_size_samples=config.batch_size,
            lr=config.lr, lr_end=config.lr, dead_feature_window=max(1, config.dead_after_tokens // config.batch_size),
            feature_sampling_window=10**12)  # sampling-window logging goes to wandb only; never reset
        self.trainer = SAETrainer(cfg=trainer_cfg, sae=self.sae, data_provider=iter(()))
        self.d_sae = config.d_sae

    def prepare(self, first_batch: torch.Tensor) -> None:
        pass  # sae-lens initialises its own biases

    def step(self, batch: torch.Tensor) -> dict[str, float]:
        output = self.trainer.step(batch)
        self.trainer.n_training_steps += 1
        with torch.no_grad():
            sae_in = output.sae_in
            mse = (output.sae_out - sae_in).pow(2).sum() / (sae_in - sae_in.mean(0)).pow(2).sum()
            l0 = float((output.feature_acts > 0).sum(-1).float().mean())
        metrics = {"loss": float(output.loss.detach()), "explained_variance": 1.0 - float(mse), "l0": l0}
        metrics.update({name: float(value.detach()) for name, value in output.losses.items()})
        return metrics

    def n_dead(self) -> int:
        return int(self.trainer.dead_neurons.sum())

    def state_dict(self) -> dict:
        t = self.trainer
        return {"sae": self.sae.state_dict(), "optimizer": t.optimizer.state_dict(),
                "lr_scheduler": t.lr_scheduler.state_dict(), "n_training_steps": t.n_training_steps,
                "n_training_samples": t.n_training_samples, "act_freq_scores": t.act_freq_scores,
                "n_forward_passes_since_fired": t.n_forward_passes_since_fired,
                "n_frac_active_samples": t.n_frac_active_samples}

    def load_state_dict(self, state: dict) -> None:
        t = self.trainer
        self.sae.load_state_dict(state["sae"])
        t.optimizer.load_state_dict(state["optimizer"])
        t.lr_scheduler.load_state_dict(state["lr_scheduler"])
        for name in ("n_training_steps", "n_training_samples", "act_freq_scores",
                     "n_forward_passes_since_fired", "n_frac_active_samples"):
            setattr(t, name, state[name])

    def to_inference(self, **metadata) -> SAE:
        """Through sae-lens' own inference export (folds decoder norms, BatchTopK -> JumpReLU)."""
        state = {name: tensor.detach().clone() for name, tensor in self.sae.state_dict().items()}
        self.sae.process_state_dict_for_saving_inference(state)
        cfg = self.sae.cfg.get_inference_sae_cfg_dict()
        cfg.setdefault("metadata", {}).update(metadata)
        return SAE.from_sae_lens(cfg, state)


for _name in ("batchtopk", "jumprelu", "standard"):
    register_trainer(_name)(type(f"Lens{_name.capitalize()}Trainer", (LensTrainer,), {"lens_architecture": _name}))


@register_trainer("matryoshka")
class LensMatryoshkaTrainer(LensTrainer):
    """sae-lens' Matryoshka BatchTopK: nested prefixes of the latents (option matryoshka_widths,
    by default [d_sae / 16, d_sae / 4, d_sae]) must each reconstruct on their own, so early
    latents stay general."""

    lens_architecture = "matryoshka_batchtopk"

    def __init__(self, config):
        if "matryoshka_widths" not in config.options:
            widths = sorted({w for w in (config.d_sae // 16, config.d_sae // 4, config.d_sae) if w > 0})
            config = dataclasses.replace(config, options={**config.options, "matryoshka_widths": widths})
        super().__init__(config)


@register_trainer("lens-topk")
class LensTopKTrainer(LensTrainer):
    """sae-lens' own TopK (dense decode): the baseline of benchmarks/sae_train.py."""

    lens_architecture = "topk"


class TranscoderModule(torch.nn.Module):
    """A transcoder in training: latents read the MLP's input x (batch, d_in), the decoder writes its output
    (batch, d_out). Decoder rows are kept at unit norm (as our TopK SAE's), b_dec starts at the targets' mean,
    an optional skip path W_skip (d_out, d_in) starts at zero (as sae-lens' SkipTranscoder's)."""

    def __init__(self, d_in: int, d_out: int, d_sae: int, skip: bool, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        directions = torch.randn(d_sae, d_out, generator=generator)
        set_decoder_unit_norm_(directions)
        self.W_dec = torch.nn.Parameter(directions)
        self.W_enc = torch.nn.Parameter(torch.randn(d_in, d_sae, generator=generator) / d_in ** 0.5)
        self.b_enc = torch.nn.Parameter(torch.zeros(d_sae))
        self.b_dec = torch.nn.Parameter(torch.zeros(d_out))
        self.W_skip = torch.nn.Parameter(torch.zeros(d_out, d_in)) if skip else None

    def output(self, x: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        out = latents @ self.W_dec + self.b_dec
        return out if self.W_skip is None else out + x @ self.W_skip.T


class _TranscoderTrainer:
    """TopK / BatchTopK transcoders (MLP input -> MLP output) on batches of (batch, d_in + d_out): each row is an
    (input, target) pair side by side, as `ActivationStore.batches(hook_in, paired=hook_out)` reads them.

    loss = MSE / Var(target) + aux_coefficient * AuxK (dead latents reconstruct the residual the live ones
    leave, as the TopK SAE's). TopK keeps each row's k largest latents; BatchTopK the batch's k * batch largest,
    and tracks the threshold sae-lens' BatchTopK tracks (a running mean of the smallest kept activation), so that
    inference runs it as a JumpReLU with that threshold (saved as sae-lens' ``jumprelu_transcoder``).
    Options: skip (bool, a linear skip path), aux_k, aux_coefficient, threshold_lr."""

    batch_topk = False
    OPTIONS = {"skip": False, "aux_k": 256, "aux_coefficient": 1 / 32, "threshold_lr": 0.01}

    def __init__(self, config):
        check_option_names(config.options, set(self.OPTIONS), self.architecture)
        self.options = {**self.OPTIONS, **config.options}
        if not config.d_out:
            raise ValueError(f"{self.architecture} trains on (input, target) pairs: give the store's output hook "
                             "(saes train --target-block blocks.L.mlp.hook_out)")
        if not 0 < config.k <= config.d_sae:
            raise ValueError(f"k must be in 1..d_sae, got k={config.k} with d_sae={config.d_sae}")
        self.d_in, self.d_out, self.k, self.d_sae = config.d_in, config.d_out, config.k, config.d_sae
        self.dead_after = config.dead_after_tokens
        self.sae = TranscoderModule(config.d_in, config.d_out, config.d_sae, bool(self.options["skip"]), config.seed)
        self.optimizer = torch.optim.Adam(self.sae.parameters(), lr=config.lr, eps=6.25e-10)
        self.tokens_since_fired = torch.zeros(config.d_sae, dtype=torch.int64)
        self.threshold = torch.zeros(())

    def prepare(self, first_batch: torch.Tensor) -> None:
        with torch.no_grad():
            self.sae.b_dec.copy_(first_batch[:, self.d_in:].mean(0))

    def _latents(self, pre: torch.Tensor) -> torch.Tensor:
        if self.batch_topk:
            flat = pre.relu().flatten()
            top = flat.topk(min(self.k * pre.shape[0], flat.numel()), sorted=False)
            return torch.zeros_like(flat).scatter(0, top.indices, top.values).view_as(pre)
        top = pre.topk(self.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())

    def step(self, batch: torch.Tensor) -> dict[str, float]:
        from .topk import normalized_mse

        x, y = batch[:, :self.d_in], batch[:, self.d_in:]
        sae = self.sae
        pre = x @ sae.W_enc + sae.b_enc
        latents = self._latents(pre)
        out = sae.output(x, latents)
        mse = normalized_mse(out, y)
        dead = self.tokens_since_fired >= self.dead_after
        aux = x.new_zeros(())
        n_aux = min(int(self.options["aux_k"]), int(dead.sum()))
        if n_aux:
            dead_pre = pre[:, dead]
            top = dead_pre.topk(n_aux, dim=1, sorted=False)
            aux_latents = torch.zeros_like(dead_pre).scatter(1, top.indices, top.values.relu())
            aux = normalized_mse(aux_latents @ sae.W_dec[dead], (y - out).detach()).nan_to_num(0.0)
        loss = mse + float(self.options["aux_coefficient"]) * aux
        loss.backward()
        remove_parallel_gradient_(sae.W_dec)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        set_decoder_unit_norm_(sae.W_dec.data)
        with torch.no_grad():
            active = latents > 0
            self.tokens_since_fired += x.shape[0]
            self.tokens_since_fired[active.any(0)] = 0
            if self.batch_topk and active.any():
                smallest = latents[active].min()
                lr = float(self.options["threshold_lr"])
                self.threshold = smallest if self.threshold == 0 else (1 - lr) * self.threshold + lr * smallest
        return {"loss": float(loss.detach()), "mse_loss": float(mse.detach()), "aux_loss": float(aux),
                "explained_variance": 1.0 - float(mse.detach()), "l0": float(active.sum(1).float().mean())}

    def n_dead(self) -> int:
        return int((self.tokens_since_fired >= self.dead_after).sum())

    def state_dict(self) -> dict:
        return {"sae": self.sae.state_dict(), "optimizer": self.optimizer.state_dict(),
                "tokens_since_fired": self.tokens_since_fired, "threshold": self.threshold}

    def load_state_dict(self, state: dict) -> None:
        self.sae.load_state_dict(state["sae"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.tokens_since_fired = state["tokens_since_fired"]
        self.threshold = state["threshold"]

    @torch.no_grad()
    def to_inference(self, **metadata) -> SAE:
        from .sae import SAEConfig

        skip = self.sae.W_skip is not None
        architecture = "jumprelu" if self.batch_topk else "topk"
        sae = SAE(SAEConfig(architecture=architecture, d_in=self.d_in, d_sae=self.d_sae,
                            k=None if self.batch_topk else self.k, metadata=dict(metadata), transcoder=True,
                            d_out=self.d_out, skip=skip))
        for name in ("W_enc", "b_enc", "W_dec", "b_dec") + (("W_skip",) if skip else ()):
            getattr(sae, name).copy_(getattr(self.sae, name))
        if self.batch_topk:
            sae.threshold.fill_(float(self.threshold))
        return sae


@register_trainer("topk-transcoder")
class TopKTranscoderTrainer(_TranscoderTrainer):
    pass


@register_trainer("batchtopk-transcoder")
class BatchTopKTranscoderTrainer(_TranscoderTrainer):
    batch_topk = True


TRANSCODER_TRAINERS = ("topk-transcoder", "batchtopk-transcoder")

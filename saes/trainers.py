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


def world_size() -> int:
    return dist.get_world_size() if _distributed() else 1


def average_gradients_across_ranks(module: torch.nn.Module) -> None:
    """The DDP rule every trainer without its own wrapper gets: each parameter's gradient is all-reduced to
    the ranks' mean as soon as backward has accumulated it, so whatever the trainer does next (gradient
    clipping, the optimiser step) sees the gradient of the global batch, identical on every rank. Exact
    for losses that are means over rows, given equal per-rank batches (train() checks them)."""
    world = dist.get_world_size()

    def hook(param: torch.Tensor) -> None:
        dist.all_reduce(param.grad)
        param.grad.div_(world)

    for param in module.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(hook)


class GlobalBatchTopK(torch.nn.Module):
    """sae-lens' BatchTopK activation over the GLOBAL batch: keeps the k x (all ranks' rows) largest
    activations of all ranks together. Each rank proposes its own top min(K, numel) values (the global top K
    holds at most K of any rank's), an all-gather of those gives the K-th largest global value, and each
    rank keeps its activations at or above it: the same latents as one process's topk on the global batch
    (continuous values do not tie; a threshold of 0 keeps zeros, which are zeros either way)."""

    def __init__(self, k: float):
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acts = x.relu()
        flat = acts.detach().flatten()
        n_global = acts.shape[:-1].numel() * dist.get_world_size()
        keep = int(self.k * n_global)
        if keep <= 0:
            return torch.zeros_like(acts)
        mine = flat.topk(min(keep, flat.numel())).values
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine)
        threshold = torch.cat(gathered).topk(keep).values[-1]
        return acts * (acts >= threshold)


def _global_min_positive_threshold(sae):
    """sae-lens' BatchTopK threshold update (an EMA of the smallest positive activation) over all ranks."""

    @torch.no_grad()
    def update_topk_threshold(acts_topk: torch.Tensor) -> None:
        positive = acts_topk[acts_topk > 0]
        smallest = (positive.min() if positive.numel() else acts_topk.new_tensor(float("inf"))).double().reshape(1)
        dist.all_reduce(smallest, op=dist.ReduceOp.MIN)
        if torch.isfinite(smallest[0]):
            lr = sae.cfg.topk_threshold_lr
            sae.topk_threshold = (1 - lr) * sae.topk_threshold + lr * smallest[0].to(sae.topk_threshold.dtype)

    return update_topk_threshold


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
        self.sharded = bool(getattr(config, "shard_latents", False)) and _distributed()
        if self.sharded:  # this rank's d_sae / world latents (saes.sharded)
            from .sharded import ShardedTopKSAE

            self.sae = ShardedTopKSAE(self.cfg)
        else:
            self.sae = TrainingTopKSAE(self.cfg, dense_dtype=torch.bfloat16 if config.autocast else None)
        self.optimizer = torch.optim.Adam(self.sae.parameters(), lr=self.cfg.lr,
                                          betas=(self.cfg.adam_beta1, self.cfg.adam_beta2), eps=self.cfg.adam_eps,
                                          fused=True)  # one pass over the 2 x d_sae x d_in weights
        self._model = None  # the DDP wrapper (or the SAE itself), made at the first step

    def prepare(self, first_batch: torch.Tensor) -> None:
        """Fresh run only: b_pre at the geometric median of the first batch (the global batch, under DDP)."""
        self.sae.initialise_pre_bias_(first_batch)

    def _forward_module(self):
        if self._model is None:
            if _distributed() and not self.sharded:
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
        fired = torch.zeros(self.sae.encoder_weight.shape[0], dtype=torch.int32)
        fired[out["latent_index"][active]] = 1
        n_tokens = torch.tensor(batch.shape[0])
        l0 = active.sum(1).float().mean().reshape(1)
        if self.sharded:  # the batch was the global one; each rank saw the winners it holds
            n_tokens = torch.tensor(out["rows"])
            dist.all_reduce(l0)
        elif _distributed():
            dist.all_reduce(fired, op=dist.ReduceOp.MAX)
            dist.all_reduce(n_tokens)
        self.sae.record_firing_(fired.bool(), int(n_tokens))
        mse = float(out["mse_loss"].detach())
        return {"loss": float(out["loss"].detach()), "mse_loss": mse, "aux_loss": float(out["aux_loss"].detach()),
                "explained_variance": 1.0 - mse, "l0": float(l0[0])}

    def n_dead(self) -> int:
        dead = self.sae.dead_latents().sum().reshape(1)
        if self.sharded:
            dist.all_reduce(dead)
        return int(dead[0])

    def state_dict(self) -> dict:
        """The whole SAE's state; sharded, gathered from every rank (a collective: call it on all ranks)."""
        if self.sharded:
            from .sharded import gather_optimizer_state

            return {"sae": self.sae.full_state_dict(), "optimizer": gather_optimizer_state(self.optimizer, self.sae)}
        return {"sae": self.sae.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """A whole SAE's state, from a run on any number of ranks, sharded or not."""
        if self.sharded:
            from .sharded import slice_optimizer_state

            self.sae.load_full_state_dict(state["sae"])
            self.optimizer.load_state_dict(slice_optimizer_state(state["optimizer"], self.sae))
            return
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
        torch.manual_seed(config.seed)  # the same seed on every rank: the ranks start identical
        self.sae = sae_cls(lens_cfg)
        global_batch = config.batch_size * world_size()  # under DDP, batch_size is each rank's share
        steps = max(1, config.total_tokens // global_batch)
        trainer_cfg = SAETrainerConfig(
            total_training_samples=steps * global_batch, train_batch_size_samples=global_batch,
            lr=config.lr, lr_end=config.lr, dead_feature_window=max(1, config.dead_after_tokens // global_batch),
            feature_sampling_window=10**12)  # sampling-window logging goes to wandb only; never reset
        self.trainer = SAETrainer(cfg=trainer_cfg, sae=self.sae, data_provider=iter(()))
        self.d_sae = config.d_sae
        if _distributed():
            self.distribute()

    def distribute(self) -> None:
        """The DDP rules: averaged gradients (before sae-lens clips them), and the batch-level rules over the
        global batch: BatchTopK's selection and threshold (batchtopk, matryoshka); the dead-latent counters
        are merged after each step (in `step`). A new sae-lens architecture inherits all three."""
        from sae_lens.saes.batchtopk_sae import BatchTopK

        average_gradients_across_ranks(self.sae)
        if isinstance(getattr(self.sae, "activation_fn", None), BatchTopK):
            self.sae.activation_fn = GlobalBatchTopK(self.sae.activation_fn.k)
        if hasattr(self.sae, "update_topk_threshold"):
            self.sae.update_topk_threshold = _global_min_positive_threshold(self.sae)

    def prepare(self, first_batch: torch.Tensor) -> None:
        pass  # sae-lens initialises its own biases

    def step(self, batch: torch.Tensor) -> dict[str, float]:
        t = self.trainer
        freq_before = t.act_freq_scores.clone() if _distributed() else None
        output = t.step(batch)
        t.n_training_steps += 1
        if _distributed():
            # a latent fired in the global batch if it fired on any rank: every rank added 1 to the equal
            # counters and reset the ones that fired locally, so the minimum over ranks is the global count
            dist.all_reduce(t.n_forward_passes_since_fired, op=dist.ReduceOp.MIN)
            fired = t.act_freq_scores - freq_before
            dist.all_reduce(fired)
            t.act_freq_scores = freq_before + fired
            t.n_training_samples += batch.shape[0] * (world_size() - 1)  # the global batch's samples
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

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

from .ranks import (GlobalBatchTopK, _distributed, average_gradients_across_ranks,  # noqa: F401
                    global_min_positive_threshold as _global_min_positive_threshold, world_size)
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
        # the sparse backward's rows . gradients, when it alone gave the decoder's gradient (no AuxK term, no
        # averaging across ranks): saves a pass over the (d_sae, d_in) gradient
        alone = not out["aux_loss"].requires_grad and self._model is self.sae and not self.sharded
        remove_parallel_gradient_(self.sae.decoder_weight, self.sae.decoder_parallel() if alone else None)
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
    matryoshka_widths for "matryoshka", l1_coefficient for "gated": Rajamanoharan et al. 2024's gated SAE, one of
    SAEBench's baseline trainers, with its gate-path L1 and auxiliary reconstruction losses).
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
        self.shards = None
        if getattr(config, "shard_latents", False) and _distributed():  # this rank's latents (saes.sharded)
            from .sharded import ShardedLens

            self.shards = ShardedLens(self.sae, self.architecture)
        global_batch = config.batch_size * world_size()  # under DDP, batch_size is each rank's share
        steps = max(1, config.total_tokens // global_batch)
        trainer_cfg = SAETrainerConfig(
            total_training_samples=steps * global_batch, train_batch_size_samples=global_batch,
            lr=config.lr, lr_end=config.lr, dead_feature_window=max(1, config.dead_after_tokens // global_batch),
            feature_sampling_window=10**12)  # sampling-window logging goes to wandb only; never reset
        self.trainer = SAETrainer(cfg=trainer_cfg, sae=self.sae, data_provider=iter(()))
        self.d_sae = config.d_sae
        if _distributed() and self.shards is None:
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
        if self.shards is not None:
            return self._sharded_step(batch)
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
        return self._metrics(output)

    def _metrics(self, output) -> dict[str, float]:
        with torch.no_grad():
            sae_in = output.sae_in
            mse = (output.sae_out - sae_in).pow(2).sum() / (sae_in - sae_in.mean(0)).pow(2).sum()
            l0 = float((output.feature_acts > 0).sum(-1).float().mean())
        losses = {name: float(value.detach()) for name, value in output.losses.items()}
        if self.shards is not None:  # penalties and L0 of this rank's latents: summed over ranks
            losses, l0 = self.shards.reported(losses, l0)
        loss = float(output.loss.detach()) if self.shards is None else sum(losses.values())
        return {"loss": loss, "explained_variance": 1.0 - float(mse), "l0": l0, **losses}

    def _sharded_step(self, batch: torch.Tensor) -> dict[str, float]:
        """Latent-sharded: sae-lens' own step on the global batch, its gradient clipping taking the norm of the
        whole SAE's gradient (saes.sharded.ShardedLens)."""
        t = self.trainer
        clip, torch.nn.utils.clip_grad_norm_ = torch.nn.utils.clip_grad_norm_, self.shards.clip_grad_norm_
        try:
            output = t.step(self.shards.global_batch(batch))
        finally:
            torch.nn.utils.clip_grad_norm_ = clip
        t.n_training_steps += 1
        return self._metrics(output)

    def n_dead(self) -> int:
        dead = self.trainer.dead_neurons.sum().reshape(1)
        if self.shards is not None:
            dist.all_reduce(dead)
        return int(dead[0])

    COUNTERS = ("act_freq_scores", "n_forward_passes_since_fired")  # (d_sae,): a slice each when sharded

    def state_dict(self) -> dict:
        """The whole SAE's training state; latent-sharded, gathered from every rank (a collective)."""
        t, shards = self.trainer, self.shards
        sae_state, optimizer = self.sae.state_dict(), t.optimizer.state_dict()
        counters = {name: getattr(t, name) for name in self.COUNTERS}
        if shards is not None:
            sae_state = {name: shards.full(name, value) for name, value in sae_state.items()}
            optimizer = shards.gather_optimizer_state(optimizer)
            counters = {name: shards.gather_counter(value) for name, value in counters.items()}
        return {"sae": sae_state, "optimizer": optimizer, "lr_scheduler": t.lr_scheduler.state_dict(),
                "n_training_steps": t.n_training_steps, "n_training_samples": t.n_training_samples,
                **counters, "n_frac_active_samples": t.n_frac_active_samples}

    def load_state_dict(self, state: dict) -> None:
        """A whole SAE's state, from a run on any number of ranks, latent-sharded or not."""
        t, shards = self.trainer, self.shards
        sae_state, optimizer = state["sae"], state["optimizer"]
        counters = {name: state[name] for name in self.COUNTERS}
        if shards is not None:
            sae_state = {name: shards.part(name, value) for name, value in sae_state.items()}
            optimizer = shards.slice_optimizer_state(optimizer)
            counters = {name: shards.slice_counter(value) for name, value in counters.items()}
        self.sae.load_state_dict(sae_state)
        t.optimizer.load_state_dict(optimizer)
        t.lr_scheduler.load_state_dict(state["lr_scheduler"])
        for name in ("n_training_steps", "n_training_samples", "n_frac_active_samples"):
            setattr(t, name, state[name])
        for name, value in counters.items():
            setattr(t, name, value)

    def to_inference(self, **metadata) -> SAE:
        """Through sae-lens' own inference export (folds decoder norms, BatchTopK -> JumpReLU)."""
        state = {name: tensor.detach().clone() for name, tensor in self.sae.state_dict().items()}
        if self.shards is not None:  # the whole SAE, gathered (a collective)
            state = {name: self.shards.full(name, value) for name, value in state.items()}
            self.shards.process_for_inference(state)
        else:
            self.sae.process_state_dict_for_saving_inference(state)
        cfg = self.sae.cfg.get_inference_sae_cfg_dict()
        cfg["d_sae"] = self.d_sae
        cfg.setdefault("metadata", {}).update(metadata)
        return SAE.from_sae_lens(cfg, state)


for _name in ("batchtopk", "jumprelu", "standard", "gated"):
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


@dataclasses.dataclass
class PAnnealConfig:
    """P-annealing (Karvonen et al.'s dictionary_learning PAnnealTrainer, one of SAEBench's baseline trainers):
    a ReLU SAE whose sparsity penalty sparsity_coeff * mean ||f||_p starts as L1 (p_start) and anneals linearly
    to p_end over n_sparsity_updates steps spaced from anneal_start (a fraction of training) to the end; at each
    update the coefficient is rescaled by the recent ratio of the L_p to the next L_p penalty, so the penalty's
    size carries over. sparsity_function "Lp" (the p-norm) or "Lp^p"."""

    initial_sparsity_penalty: float = 0.1
    p_start: float = 1.0
    p_end: float = 0.2
    anneal_start: float = 0.2
    n_sparsity_updates: int = 10
    sparsity_queue_length: int = 10
    sparsity_function: str = "Lp"
    warmup_steps: int = 100

    def validate(self) -> "PAnnealConfig":
        if self.sparsity_function not in ("Lp", "Lp^p"):
            raise ValueError(f"sparsity_function must be 'Lp' or 'Lp^p', got {self.sparsity_function!r}")
        if not 0 < self.p_end <= self.p_start <= 1:
            raise ValueError(f"p must anneal within (0, 1]: p_start={self.p_start}, p_end={self.p_end}")
        if not 0 <= self.anneal_start < 1 or not 1 <= self.n_sparsity_updates <= 10_000:
            raise ValueError("anneal_start must be a fraction of training in [0, 1) and n_sparsity_updates 1..10000")
        if not 0 <= self.initial_sparsity_penalty < 1e6 or not 1 <= self.sparsity_queue_length <= 10_000:
            raise ValueError("initial_sparsity_penalty must be in [0, 1e6) and sparsity_queue_length 1..10000")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        return self


class _ReLUSAE(torch.nn.Module):
    """dictionary_learning's AutoEncoder: f = relu(W_enc (x - b_dec) + b_enc), x_hat = W_dec f + b_dec, the
    decoder's rows unit norm, the encoder initialised as the decoder's transpose."""

    def __init__(self, d_in: int, d_sae: int):
        super().__init__()
        w_dec = torch.randn(d_sae, d_in)
        w_dec /= w_dec.norm(dim=1, keepdim=True)
        self.W_dec = torch.nn.Parameter(w_dec)
        self.W_enc = torch.nn.Parameter(w_dec.T.clone())
        self.b_enc = torch.nn.Parameter(torch.zeros(d_sae))
        self.b_dec = torch.nn.Parameter(torch.zeros(d_in))

    def forward(self, x):
        f = ((x - self.b_dec) @ self.W_enc + self.b_enc).relu()
        return f @ self.W_dec + self.b_dec, f


@register_trainer("p-anneal")
class PAnnealTrainer:
    """P-annealing on our batches (see PAnnealConfig): Adam with the decoder's rows held at unit norm (the
    gradient's parallel part removed, then renormalised), linear lr warmup; the loss is dictionary_learning's,
    mean ||x - x_hat||_2 + sparsity_coeff * L_p(f). Exported as a "standard" (ReLU) inference SAE."""

    def __init__(self, config):
        check_option_names(config.options, {f.name for f in dataclasses.fields(PAnnealConfig)}, "p-anneal")
        try:
            self.cfg = PAnnealConfig(**config.options).validate()
        except TypeError as err:
            raise ValueError(f"bad options for p-anneal {config.options}: {err}") from None
        torch.manual_seed(config.seed)
        self.sae = _ReLUSAE(config.d_in, config.d_sae)
        self.shards, self.d_sae = None, config.d_sae
        if getattr(config, "shard_latents", False) and _distributed():  # this rank's latents (saes.sharded)
            from .sharded import ShardedReLU

            self.shards = ShardedReLU(self.sae, config.d_sae)
        self.optimizer = torch.optim.Adam(self.sae.parameters(), lr=config.lr)
        warmup = max(1, self.cfg.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(s / warmup, 1.0))
        global_batch = config.batch_size * world_size()  # under DDP, batch_size is each rank's share
        steps = max(1, config.total_tokens // global_batch)
        start = int(self.cfg.anneal_start * steps)
        self.update_steps = torch.linspace(start, steps, self.cfg.n_sparsity_updates).long().tolist()
        self.p_values = torch.linspace(self.cfg.p_start, self.cfg.p_end, self.cfg.n_sparsity_updates).tolist()
        self.dead_after_steps = max(1, config.dead_after_tokens // global_batch)
        self.state = {"step": 0, "p": self.cfg.p_start, "next_p": None, "p_step_count": 0,
                      "sparsity_coeff": self.cfg.initial_sparsity_penalty, "queue": []}
        n_latents = config.d_sae if self.shards is None else self.shards.n_local
        self.steps_since_fired = torch.zeros(n_latents, dtype=torch.long)
        if _distributed() and self.shards is None:  # DDP: the gradient, the penalty's carried size and the firing
            average_gradients_across_ranks(self.sae)  # counts of the global batch

    def prepare(self, first_batch: torch.Tensor) -> None:
        pass  # dictionary_learning starts b_dec at zero

    def lp_norm(self, f: torch.Tensor, p: float) -> torch.Tensor:
        norm = f.pow(p).sum(dim=-1)
        if self.shards is not None:  # the sum over every rank's latents, the same on every rank
            norm = self.shards.sum_over_ranks(norm)
        return norm.mean() if self.cfg.sparsity_function == "Lp^p" else norm.pow(1 / p).mean()

    def step(self, batch: torch.Tensor) -> dict[str, float]:
        s = self.state
        if self.shards is not None:  # latent-sharded: every rank trains its latents on the global batch
            batch = self.shards.global_batch(batch)
        x_hat, f = self.sae(batch)
        l2 = torch.linalg.norm(batch - x_hat, dim=-1).mean()
        lp = self.lp_norm(f, s["p"])
        # as dictionary_learning: an update changes p and the coefficient from the next step on
        used_p, used_coeff = s["p"], s["sparsity_coeff"]
        scaled_lp = used_coeff * lp
        if s["next_p"] is not None:
            pair = torch.stack([lp.detach(), self.lp_norm(f.detach(), s["next_p"])])
            if _distributed() and self.shards is None:  # means over rows: the ranks' mean is the global batch's
                dist.all_reduce(pair)
                pair /= world_size()
            pair = pair.tolist()
            s["queue"] = (s["queue"] + [pair])[-self.cfg.sparsity_queue_length:]
        if s["p_step_count"] < len(self.update_steps) and s["step"] >= self.update_steps[s["p_step_count"]]:
            if s["next_p"] is not None and s["queue"]:  # carry the penalty's size over to the next p
                now = sum(q[0] for q in s["queue"]) / len(s["queue"])
                nxt = sum(q[1] for q in s["queue"]) / len(s["queue"])
                if nxt > 0:
                    s["sparsity_coeff"] *= now / nxt
            s["p"] = self.p_values[s["p_step_count"]]
            count = s["p_step_count"]
            s["next_p"] = self.p_values[count + 1] if count < len(self.p_values) - 1 else self.cfg.p_end
            s["p_step_count"] += 1
        loss = l2 + scaled_lp
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        w = self.sae.W_dec
        with torch.no_grad():
            unit = w / w.norm(dim=1, keepdim=True)
            w.grad -= (w.grad * unit).sum(dim=1, keepdim=True) * unit
        self.optimizer.step()
        self.scheduler.step()
        with torch.no_grad():
            w /= w.norm(dim=1, keepdim=True)
            fired = (f > 0).any(0)
            if _distributed() and self.shards is None:  # a latent fired if it fired on any rank
                fired = fired.to(torch.uint8)
                dist.all_reduce(fired, op=dist.ReduceOp.MAX)
                fired = fired.bool()
            self.steps_since_fired[fired] = 0
            self.steps_since_fired[~fired] += 1
            residual = batch - x_hat
            ev = 1.0 - float(residual.pow(2).sum() / (batch - batch.mean(0)).pow(2).sum())
        s["step"] += 1
        l0 = float((f > 0).sum(-1).float().mean())
        return {"loss": float(loss.detach()), "l2_loss": float(l2.detach()), "lp_loss": float(lp.detach()),
                "p": float(used_p), "sparsity_coeff": float(used_coeff), "explained_variance": ev,
                "l0": l0 if self.shards is None else self.shards.sum_l0(l0)}

    def n_dead(self) -> int:
        dead = (self.steps_since_fired >= self.dead_after_steps).sum().reshape(1)
        if self.shards is not None:
            dist.all_reduce(dead)
        return int(dead[0])

    def state_dict(self) -> dict:
        """The whole SAE's training state; latent-sharded, gathered from every rank (a collective)."""
        s, shards = self.state, self.shards
        sae_state, optimizer, fired = self.sae.state_dict(), self.optimizer.state_dict(), self.steps_since_fired
        if shards is not None:
            sae_state = {name: shards.full(name, value) for name, value in sae_state.items()}
            optimizer, fired = shards.gather_optimizer_state(optimizer), shards.gather_counter(fired)
        return {"sae": sae_state, "optimizer": optimizer,
                "scheduler": self.scheduler.state_dict(), "steps_since_fired": fired,
                "step": s["step"], "p": s["p"], "next_p": -1.0 if s["next_p"] is None else s["next_p"],
                "p_step_count": s["p_step_count"], "sparsity_coeff": s["sparsity_coeff"],
                "queue": torch.tensor(s["queue"], dtype=torch.float64).reshape(-1, 2)}

    def load_state_dict(self, state: dict) -> None:
        """A whole SAE's state, from a run on any number of ranks, latent-sharded or not."""
        shards, sae_state, optimizer, fired = self.shards, state["sae"], state["optimizer"], state["steps_since_fired"]
        if shards is not None:
            sae_state = {name: shards.part(name, value) for name, value in sae_state.items()}
            optimizer, fired = shards.slice_optimizer_state(optimizer), shards.slice_counter(fired)
        self.sae.load_state_dict(sae_state)
        self.optimizer.load_state_dict(optimizer)
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps_since_fired = fired
        self.state = {"step": int(state["step"]), "p": float(state["p"]),
                      "next_p": None if float(state["next_p"]) < 0 else float(state["next_p"]),
                      "p_step_count": int(state["p_step_count"]), "sparsity_coeff": float(state["sparsity_coeff"]),
                      "queue": state["queue"].tolist()}

    def to_inference(self, **metadata) -> SAE:
        from .sae import SAEConfig

        state = self.sae.state_dict()
        if self.shards is not None:  # the whole SAE, gathered (a collective)
            state = {name: self.shards.full(name, value) for name, value in state.items()}
        sae = SAE(SAEConfig("standard", d_in=self.sae.W_enc.shape[0], d_sae=self.d_sae, metadata=metadata))
        with torch.no_grad():
            for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
                getattr(sae, name).copy_(state[name])
        return sae


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
    Options: skip (bool, a linear skip path), aux_k, aux_coefficient, threshold_lr.

    Under torchrun, data parallel on the global batch: averaged gradients (the loss is a mean over rows, its
    variance the global batch's), BatchTopK's k x (all ranks' rows) kept over every rank (GlobalBatchTopK), a
    latent fired if it fired on any rank, the threshold's smallest kept activation the minimum over ranks."""

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
        if _distributed():  # DDP: averaged gradients; the batch-level rules below run over the global batch
            average_gradients_across_ranks(self.sae)

    def prepare(self, first_batch: torch.Tensor) -> None:
        with torch.no_grad():
            self.sae.b_dec.copy_(first_batch[:, self.d_in:].mean(0))

    def _latents(self, pre: torch.Tensor) -> torch.Tensor:
        if self.batch_topk:
            if _distributed():  # the k x (all ranks' rows) largest of the global batch (GlobalBatchTopK)
                return GlobalBatchTopK(self.k)(pre)
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
            fired, n_tokens = active.any(0), x.shape[0]
            smallest = (latents[active].min() if active.any() else latents.new_tensor(float("inf"))).reshape(1)
            if _distributed():  # a latent fired if it fired on any rank; the smallest kept activation of all
                fired = fired.to(torch.uint8)
                dist.all_reduce(fired, op=dist.ReduceOp.MAX)
                fired, n_tokens = fired.bool(), n_tokens * world_size()
                dist.all_reduce(smallest, op=dist.ReduceOp.MIN)
            self.tokens_since_fired += n_tokens
            self.tokens_since_fired[fired] = 0
            if self.batch_topk and torch.isfinite(smallest[0]):
                smallest = smallest[0]
                lr = float(self.options["threshold_lr"])
                self.threshold = smallest if self.threshold == 0 else (1 - lr) * self.threshold + lr * smallest
        return {"loss": float(loss.detach()), "mse_loss": float(mse.detach()), "aux_loss": float(aux.detach()),
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
    """Each token keeps its own k largest latents (the base class's rule; batch_topk is off)."""


@register_trainer("batchtopk-transcoder")
class BatchTopKTranscoderTrainer(_TranscoderTrainer):
    batch_topk = True


TRANSCODER_TRAINERS = ("topk-transcoder", "batchtopk-transcoder")

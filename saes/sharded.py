"""A TopK SAE sharded by latent across torch.distributed ranks (`saes train --shard-latents` under torchrun).

Rank r of W holds latents [r * d_sae / W, (r + 1) * d_sae / W): those rows of the encoder, its bias, the
decoder and the dead-latent counters, and their Adam moments, so each rank's parameter memory is 1 / W of the
SAE's (pre_bias, d_in numbers, is on every rank). A step:

1. the ranks' batches are all-gathered: every rank sees the global batch X (B x W rows);
2. each rank computes its latents' pre-activations (the dense product, 1 / W of it), and its top k of each row;
3. an all-gather of those W x k candidates (values and global indices) per row gives the exact global top k
   (the global top k of a row holds at most k of any rank's latents);
4. each rank decodes the winners it holds; an all-reduce sums the W partial reconstructions;
5. every rank computes the same loss on X (normalised MSE + AuxK, whose dead latents are also chosen by a
   global top-aux_k over candidates), so each shard's gradient is complete without any gradient all-reduce;
   only pre_bias, whose gradient through the encoder is split across ranks, has that part all-reduced.

Checkpoints hold one whole SAE (`full_state_dict`, the same layout as the unsharded trainer's), written by
rank 0 from gathered shards, and a checkpoint resumes on any world size, sharded or not (`load_full_state_dict`
keeps the rank's slice). The same math as `TrainingTopKSAE.forward` on X (tests/test_saes_distributed.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .sparse_ops import select_pre_activations, sort_rows, sparse_decode
from .topk import TopKConfig, TrainingTopKSAE, normalized_mse_with_variance, plain_variance

SHARDED = ("encoder_weight", "encoder_bias", "decoder_weight", "tokens_since_fired")


def check_shardable(d_sae: int, world: int) -> None:
    if d_sae % world:
        raise ValueError(f"--shard-latents splits d_sae={d_sae} latents over {world} processes, which does not "
                         f"divide it; choose a d_sae that is a multiple of {world}")


class _SumOverRanks(torch.autograd.Function):
    """Forward: the sum of every rank's tensor. Backward: the gradient as it is, since every rank computes the
    same loss from the sum (each rank's part gets the whole of its gradient)."""

    @staticmethod
    def forward(ctx, part):
        total = part.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


class _SharedInput(torch.autograd.Function):
    """Forward: the tensor as it is (the same on every rank). Backward: the sum of every rank's gradient,
    since each rank's encoder slice contributes its own part of it."""

    @staticmethod
    def forward(ctx, shared):
        return shared.view_as(shared)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad


def _all_gather_cat(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts, dim=dim)


def global_topk(local_values: torch.Tensor, first_latent: int, k: int) -> torch.Tensor:
    """local_values: (rows, m) this rank's scores. Returns (rows, k) global latent indices of each row's top k
    over every rank's latents, sorted ascending: the exact top k (each rank proposes its own
    top min(k, m), and the global top k holds at most that many of any rank's)."""
    top = local_values.topk(min(k, local_values.shape[1]), dim=1, sorted=False)
    values = _all_gather_cat(top.values, 1)
    index = _all_gather_cat(top.indices + first_latent, 1)
    best = values.topk(k, dim=1, sorted=False).indices
    return sort_rows(index.gather(1, best))


class ShardedTopKSAE(TrainingTopKSAE):
    """This rank's slice of a TopK SAE; the parameter names and meanings of `TrainingTopKSAE`, sliced."""

    def __init__(self, cfg: TopKConfig):
        world, rank = dist.get_world_size(), dist.get_rank()
        check_shardable(cfg.d_sae, world)
        super().__init__(cfg)  # the whole SAE's initialisation (the same seed on every rank), then this slice
        self.n_local, self.first = cfg.d_sae // world, rank * (cfg.d_sae // world)
        rows = slice(self.first, self.first + self.n_local)
        with torch.no_grad():
            for name in ("encoder_weight", "encoder_bias", "decoder_weight"):
                setattr(self, name, torch.nn.Parameter(getattr(self, name)[rows].clone()))
            self.tokens_since_fired = self.tokens_since_fired[rows].clone()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """x: this rank's (batch, d_in) rows -> the losses of the global batch (the same on every rank),
        latent_index / latent_values of the winners this rank holds (local indices; values 0 elsewhere)."""
        x = _all_gather_cat(x, 0)
        cfg, last = self.cfg, self.first + self.n_local
        centred = x - self.pre_bias
        encoder_input = _SharedInput.apply(centred)
        with torch.no_grad():
            pre_activations = torch.addmm(self.encoder_bias, centred, self.encoder_weight.t())
            winners = global_topk(pre_activations, self.first, cfg.k)
            mine = (winners >= self.first) & (winners < last)
            local_index = (winners - self.first).clamp(0, self.n_local - 1)  # stays sorted per row
        latent_values = select_pre_activations(pre_activations.gather(1, local_index), encoder_input,
                                               self.encoder_weight, self.encoder_bias, local_index).relu() * mine
        partial = sparse_decode(latent_values, local_index, self.decoder_weight)
        reconstruction = _SumOverRanks.apply(partial) + self.pre_bias
        variance = plain_variance(x)  # x is the global batch on every rank: no all-reduce
        mse_loss = normalized_mse_with_variance(reconstruction, x, variance)
        aux_loss = self._sharded_aux_loss(x, centred.detach(), pre_activations, reconstruction.detach())
        return {"loss": mse_loss + cfg.aux_coefficient * aux_loss, "mse_loss": mse_loss, "aux_loss": aux_loss,
                "reconstruction": reconstruction.detach(), "latent_index": local_index,
                "latent_values": latent_values.detach(), "rows": x.shape[0]}

    def _sharded_aux_loss(self, x, centred, pre_activations, reconstruction) -> torch.Tensor:
        """AuxK over all ranks' dead latents: a global top-aux_k of the dead pre-activations, each rank
        decoding the winners it holds."""
        dead = self.dead_latents()
        n_dead = torch.tensor([int(dead.sum())])
        dist.all_reduce(n_dead)
        n_aux = min(self.cfg.aux_k, int(n_dead))
        if n_aux == 0:
            return x.new_zeros(())
        residual = x - reconstruction
        with torch.no_grad():
            scores = pre_activations.masked_fill(~dead, float("-inf"))
            winners = global_topk(scores, self.first, n_aux)
            mine = (winners >= self.first) & (winners < self.first + self.n_local)
            local_index = (winners - self.first).clamp(0, self.n_local - 1)
        # as TrainingTopKSAE._aux_loss: values from the detached input, gradients to the dead rows only
        values = select_pre_activations(pre_activations.gather(1, local_index), centred, self.encoder_weight,
                                        self.encoder_bias, local_index).relu() * mine
        aux_reconstruction = _SumOverRanks.apply(sparse_decode(values, local_index, self.decoder_weight))
        return normalized_mse_with_variance(aux_reconstruction, residual, plain_variance(residual)).nan_to_num(0.0)

    # --- one whole SAE in checkpoints --------------------------------------------------------------------
    def full_state_dict(self) -> dict:
        """The whole SAE's state (gathered from every rank), as the unsharded TrainingTopKSAE's state_dict."""
        state = self.state_dict()
        return {name: _all_gather_cat(value, 0) if name in SHARDED else value for name, value in state.items()}

    def load_full_state_dict(self, state: dict) -> None:
        rows = slice(self.first, self.first + self.n_local)
        if state["encoder_weight"].shape[0] != self.cfg.d_sae:
            raise ValueError(f"the checkpoint holds {state['encoder_weight'].shape[0]} latents, not {self.cfg.d_sae}")
        self.load_state_dict({name: value[rows] if name in SHARDED else value for name, value in state.items()})

    @torch.no_grad()
    def to_inference(self, **metadata):
        from .sae import SAE, SAEConfig

        full = self.full_state_dict()
        sae = SAE(SAEConfig(architecture="topk", d_in=self.cfg.d_in, d_sae=self.cfg.d_sae, k=self.cfg.k,
                            metadata=dict(metadata)))
        sae.W_enc.copy_(full["encoder_weight"].t())
        sae.b_enc.copy_(full["encoder_bias"])
        sae.W_dec.copy_(full["decoder_weight"])
        sae.b_dec.copy_(full["pre_bias"])
        return sae


def gather_optimizer_state(optimizer: torch.optim.Optimizer, sae: ShardedTopKSAE) -> dict:
    """Adam's state with the sharded parameters' moments gathered: the unsharded trainer's layout."""
    state = optimizer.state_dict()
    names = [name for name, _ in sae.named_parameters()]
    for position, name in enumerate(names):
        entry = state["state"].get(position)
        if entry is not None and name in SHARDED:
            state["state"][position] = {key: _all_gather_cat(value, 0) if key in ("exp_avg", "exp_avg_sq") else value
                                        for key, value in entry.items()}
    return state


def slice_optimizer_state(state: dict, sae: ShardedTopKSAE) -> dict:
    rows = slice(sae.first, sae.first + sae.n_local)
    names = [name for name, _ in sae.named_parameters()]
    state = {**state, "state": dict(state["state"])}
    for position, name in enumerate(names):
        entry = state["state"].get(position)
        if entry is not None and name in SHARDED:
            state["state"][position] = {key: value[rows].clone() if key in ("exp_avg", "exp_avg_sq") else value
                                        for key, value in entry.items()}
    return state



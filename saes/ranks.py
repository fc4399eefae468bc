"""Rules over ranks that the trainers (saes.trainers) and the latent-sharded SAEs (saes.sharded) share: whether a
process group of several ranks is running, the mean of gradients over ranks, and sae-lens' BatchTopK activation and
threshold update over the global batch."""

from __future__ import annotations

import torch
import torch.distributed as dist


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

    def __init__(self, k: float, rows_are_global: bool = False):
        super().__init__()
        self.k = k
        self.rows_are_global = rows_are_global  # latent-sharded: every rank holds all rows, some latents

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acts = x.relu()
        flat = acts.detach().flatten()
        n_global = acts.shape[:-1].numel() * (1 if self.rows_are_global else dist.get_world_size())
        keep = int(self.k * n_global)
        if keep <= 0:
            return torch.zeros_like(acts)
        mine = flat.topk(min(keep, flat.numel())).values
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine)
        threshold = torch.cat(gathered).topk(keep).values[-1]
        return acts * (acts >= threshold)


def global_min_positive_threshold(sae):
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

"""The TopK sparse autoencoder of the SDXL Turbo SAE work (Gao et al. 2024, openai/sparse_autoencoder).

    latents        = ReLU(TopK(W_enc (x - b_pre) + b_enc))
    reconstruction = W_dec latents + b_pre
    loss           = MSE / Var(x)  +  1/32 * AuxK

b_pre starts at the geometric median of a data sample; decoder directions stay at unit norm
(the parallel part of their gradient is removed before each step and they are renormalised
after it); AuxK lets the top 256 dead latents (no firing for `dead_after_tokens` tokens)
reconstruct the residual that the live latents leave, so dead latents get a gradient again.

`TrainingTopKSAE.forward` uses the sparse kernels of `saes.sparse_ops` (an exact two-stage top k, one sparse
backward for every weight); `reference_losses`
is the same math with dense matrices, kept for the test that checks one against the other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
import torch.distributed as dist
from torch import nn

from .sparse_ops import gather_dots, sort_rows, sparse_topk_autoencode, topk_index


@dataclass
class TopKConfig:
    """Architecture and optimiser settings of a TopK SAE (defaults: SDXL Turbo block updates)."""

    d_in: int = 1280
    d_sae: int = 5120
    k: int = 10
    batch_size: int = 4096
    lr: float = 1e-4
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 6.25e-10  # openai's value: small, because normalised losses give small gradients
    aux_k: int = 256
    aux_coefficient: float = 1 / 32
    dead_after_tokens: int = 10_000_000
    geometric_median_samples: int = 8192
    seed: int = 0

    def validate(self) -> "TopKConfig":
        if self.d_in <= 0 or self.d_sae <= 0:
            raise ValueError(f"d_in and d_sae must be positive, got d_in={self.d_in}, d_sae={self.d_sae}")
        if not 0 < self.k <= self.d_sae:
            raise ValueError(f"k must be in 1..d_sae, got k={self.k} with d_sae={self.d_sae}")
        if self.batch_size <= 0 or self.lr <= 0:
            raise ValueError(f"batch_size and lr must be positive, got {self.batch_size}, {self.lr}")
        if self.aux_k < 0 or self.dead_after_tokens <= 0:
            raise ValueError("aux_k must be >= 0 and dead_after_tokens > 0")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TopKConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown TopK config fields: {sorted(unknown)}")
        return cls(**values).validate()


@torch.no_grad()
def geometric_median(points: torch.Tensor, max_iterations: int = 100, tolerance: float = 1e-5) -> torch.Tensor:
    """Weiszfeld's algorithm. points: (n, d) -> (d,), the point minimising the sum of distances."""
    points = points.double()
    median = points.mean(0)
    scale = points.std(0).norm().clamp_min(1e-12)
    for _ in range(max_iterations):
        weights = 1.0 / (points - median).norm(dim=1).clamp_min(1e-12)
        updated = (weights[:, None] * points).sum(0) / weights.sum()
        moved = (updated - median).norm()
        median = updated
        if moved <= tolerance * scale:
            break
    return median.float()


@torch.no_grad()
def set_decoder_unit_norm_(decoder_weight: torch.Tensor) -> None:
    """Scale each latent's decoder direction (a row of (d_sae, d_in)) to unit norm, in place."""
    decoder_weight.div_(decoder_weight.norm(dim=1, keepdim=True).clamp_min(1e-12))


@torch.no_grad()
def remove_parallel_gradient_(decoder_weight: torch.Tensor, parallel: torch.Tensor | None = None) -> None:
    """Drop the part of each row's gradient along the row, so a step does not change its norm
    to first order (it only rotates the direction). decoder_weight: (d_sae, d_in), unit rows.
    parallel: (d_sae,) each row's gradient . row when already known (the sparse backward's), else computed."""
    if decoder_weight.grad is None:
        return
    if parallel is None:
        parallel = torch.linalg.vecdot(decoder_weight.grad, decoder_weight)
    decoder_weight.grad.addcmul_(parallel.unsqueeze(1), decoder_weight, value=-1.0)


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


@torch.no_grad()
def plain_variance(target: torch.Tensor) -> torch.Tensor:
    """The variance of this tensor's rows around their mean, averaged over channels (no communication)."""
    return (target - target.mean(0)).square().mean()  # = var(dim=0).mean(); a strided var is 3x slower here


@torch.no_grad()
def batch_variance(target: torch.Tensor) -> torch.Tensor:
    """The target's variance around its batch mean, over the GLOBAL batch under torch.distributed (every
    rank's rows, equal counts per rank): two all-reduces of d_in + 1 numbers. A constant of the loss."""
    if _world() == 1:
        return plain_variance(target)
    total = torch.cat([target.sum(0), target.new_tensor([target.shape[0]])])
    dist.all_reduce(total)
    mean, n = total[:-1] / total[-1], total[-1]
    spread = (target - mean).square().sum().reshape(1)
    dist.all_reduce(spread)
    return spread[0] / (n * target.shape[1])


def normalized_mse(reconstruction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error divided by the target's variance around its batch mean (FVU). Under DDP the
    variance is the global batch's, so that the ranks' averaged gradients equal one process's on the
    global batch (the squared error itself is a mean over rows, which averaging already makes global)."""
    return normalized_mse_with_variance(reconstruction, target, batch_variance(target))


def normalized_mse_with_variance(reconstruction: torch.Tensor, target: torch.Tensor,
                                 variance: torch.Tensor) -> torch.Tensor:
    return (reconstruction - target).pow(2).mean() / variance.clamp_min(1e-12)


def bf16_candidates(k: int) -> int:
    """How many latents a bf16 dense product proposes for the float32 top k: k + max(8, k // 4). Measured on
    SmolLM2 layer-15 residuals (4096 tokens, k 32): with the shipped SAE's encoder, k + 4 already gives every
    row's exact float32 top k (k + 0: 80% of rows); with the tied random initialisation, k + 8 does. Each extra
    candidate costs top-k time and one float32 dot product per row."""
    return k + max(8, k // 4)


class TrainingTopKSAE(nn.Module):
    """A TopK SAE with its training state. Weights are stored latent-major:
    encoder_weight (d_sae, d_in), encoder_bias (d_sae,), decoder_weight (d_sae, d_in) with unit
    rows, pre_bias (d_in,); tokens_since_fired (d_sae,) counts tokens since each latent last fired.
    """

    def __init__(self, cfg: TopKConfig, dense_dtype: torch.dtype | None = None):
        super().__init__()
        self.cfg = cfg.validate()
        # the dtype of the one dense product under autocast (None: float32). It only chooses the k latents:
        # their values, the decoder, the losses and every gradient stay float32 (the sparse CSR kernels of
        # the backward have no bf16 version on CPU)
        self.dense_dtype = dense_dtype
        generator = torch.Generator().manual_seed(cfg.seed)
        directions = torch.randn(cfg.d_sae, cfg.d_in, generator=generator)
        set_decoder_unit_norm_(directions)
        # Tied initialisation: encoder starts as the decoder's transpose (Gao et al.).
        self.encoder_weight = nn.Parameter(directions.clone())
        self.encoder_bias = nn.Parameter(torch.zeros(cfg.d_sae))
        self.decoder_weight = nn.Parameter(directions)
        self.pre_bias = nn.Parameter(torch.zeros(cfg.d_in))
        self.register_buffer("tokens_since_fired", torch.zeros(cfg.d_sae, dtype=torch.int64))

    @torch.no_grad()
    def initialise_pre_bias_(self, sample: torch.Tensor) -> None:
        """sample: (n, d_in) activations; b_pre := their geometric median."""
        self.pre_bias.copy_(geometric_median(sample[: self.cfg.geometric_median_samples].float()))

    def dead_latents(self) -> torch.Tensor:
        """(d_sae,) bool: latents that have not fired for `dead_after_tokens` tokens."""
        return self.tokens_since_fired >= self.cfg.dead_after_tokens

    @torch.no_grad()
    def record_firing_(self, fired: torch.Tensor, n_tokens: int) -> None:
        """fired: (d_sae,) bool over the last n_tokens tokens (all ranks together under DDP)."""
        self.tokens_since_fired.add_(n_tokens)
        self.tokens_since_fired[fired] = 0

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """x: (batch, d_in) -> dict with loss, mse_loss, aux_loss (scalars), reconstruction
        (batch, d_in, detached), latent_index and latent_values (batch, k, detached)."""
        with torch.no_grad():  # the one dense product: TopK has to see every pre-activation
            centred = x - self.pre_bias
            with torch.autocast(x.device.type, dtype=self.dense_dtype or torch.float32,
                                enabled=self.dense_dtype is not None):
                pre_activations = torch.addmm(self.encoder_bias, centred, self.encoder_weight.t())
            latent_index, chosen = self._choose_latents(pre_activations, centred)
        # the sparse rest: reconstruction from the k chosen latents, every gradient in one sparse backward
        self.notes = {}  # the backward's decoder_parallel (decoder_parallel() reads it)
        reconstruction, latent_values = sparse_topk_autoencode(chosen, centred, latent_index, self.pre_bias,
                                                               self.encoder_weight, self.encoder_bias,
                                                               self.decoder_weight, self.notes)
        mse_loss = normalized_mse(reconstruction, x)
        aux_loss = self._aux_loss(x, centred, pre_activations, reconstruction.detach())
        return {
            "loss": mse_loss + self.cfg.aux_coefficient * aux_loss,
            "mse_loss": mse_loss,
            "aux_loss": aux_loss,
            "reconstruction": reconstruction.detach(),
            "latent_index": latent_index,
            "latent_values": latent_values,
        }

    def decoder_parallel(self) -> torch.Tensor | None:
        """Each decoder row's gradient . row from the last backward, when the sparse decode gave the decoder's
        whole gradient (no AuxK term this step, no gradient averaging across ranks afterwards); else None."""
        return self.notes.pop("decoder_parallel", None) if getattr(self, "notes", None) else None

    def _choose_latents(self, pre_activations: torch.Tensor, centred: torch.Tensor):
        """((batch, k) indices of each row's top k latents, sorted per row; their float32 pre-activations).

        With a bf16 dense product, bf16 proposes `bf16_candidates` (k + 8 for k up to 32) and their float32
        pre-activations choose the k: bf16 cannot order near-ties (its resolution is 2**-8 of a value), and
        choosing among them by bf16 cost 0.015 held-out EV on SmolLM2 residuals."""
        k = self.cfg.k
        if self.dense_dtype is None:
            index = topk_index(pre_activations, k)
            return index, pre_activations.gather(1, index)
        candidates = topk_index(pre_activations, min(bf16_candidates(k), self.cfg.d_sae))
        exact = gather_dots(candidates, centred, self.encoder_weight) + self.encoder_bias[candidates]
        # positions in the sorted candidate rows, sorted: the chosen indices come out sorted too
        picked = sort_rows(exact.topk(k, dim=1, sorted=False).indices)
        return candidates.gather(1, picked), exact.gather(1, picked)

    def _aux_loss(self, x, centred, pre_activations, reconstruction) -> torch.Tensor:
        """AuxK: the top aux_k dead latents reconstruct the residual x - reconstruction.

        Computed densely but only over the dead latents' columns, so its cost is proportional to
        how many latents are dead (none, in a healthy run). It trains only the dead latents."""
        dead = self.dead_latents().nonzero().squeeze(1)
        n_aux = min(self.cfg.aux_k, dead.numel())
        if n_aux == 0:
            return x.new_zeros(())
        residual = x - reconstruction
        aux_index = pre_activations[:, dead].topk(n_aux, dim=1, sorted=False).indices
        dead_pre = centred @ self.encoder_weight[dead].t() + self.encoder_bias[dead]
        aux_latents = torch.zeros_like(dead_pre).scatter(1, aux_index, dead_pre.gather(1, aux_index).relu())
        aux_reconstruction = aux_latents @ self.decoder_weight[dead]
        return normalized_mse(aux_reconstruction, residual).nan_to_num(0.0)

    @torch.no_grad()
    def to_inference(self, **metadata):
        """The inference `SAE` (sae-lens layout: W_enc (d_in, d_sae), W_dec (d_sae, d_in))."""
        from .sae import SAE, SAEConfig

        sae = SAE(SAEConfig(architecture="topk", d_in=self.cfg.d_in, d_sae=self.cfg.d_sae, k=self.cfg.k,
                            metadata=dict(metadata)))
        sae.W_enc.copy_(self.encoder_weight.t())
        sae.b_enc.copy_(self.encoder_bias)
        sae.W_dec.copy_(self.decoder_weight)
        sae.b_dec.copy_(self.pre_bias)
        return sae


def reference_losses(sae: TrainingTopKSAE, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same losses as `TrainingTopKSAE.forward`, with dense (batch, d_sae) latents: slow and plain."""
    cfg = sae.cfg
    centred = x - sae.pre_bias
    pre_activations = centred @ sae.encoder_weight.t() + sae.encoder_bias
    top = pre_activations.topk(cfg.k, dim=1)
    latents = torch.zeros_like(pre_activations).scatter(1, top.indices, top.values.relu())
    reconstruction = latents @ sae.decoder_weight + sae.pre_bias
    mse_loss = normalized_mse(reconstruction, x)
    dead = sae.dead_latents()
    n_aux = min(cfg.aux_k, int(dead.sum()))
    aux_loss = x.new_zeros(())
    if n_aux:
        dead_pre = (centred.detach() @ sae.encoder_weight.t() + sae.encoder_bias).masked_fill(~dead, float("-inf"))
        aux_top = dead_pre.topk(n_aux, dim=1)
        aux_latents = torch.zeros_like(pre_activations).scatter(1, aux_top.indices, aux_top.values.relu())
        residual = (x - reconstruction).detach()
        aux_loss = normalized_mse(aux_latents @ sae.decoder_weight, residual).nan_to_num(0.0)
    return {"loss": mse_loss + cfg.aux_coefficient * aux_loss, "mse_loss": mse_loss, "aux_loss": aux_loss,
            "reconstruction": reconstruction.detach()}

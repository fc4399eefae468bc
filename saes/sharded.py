"""SAEs sharded by latent across torch.distributed ranks (`saes train --shard-latents` under torchrun): our TopK
(ShardedTopKSAE, below), sae-lens' standard, jumprelu, batchtopk, matryoshka, gated and topk (ShardedLens) and
p-anneal's ReLU SAE (ShardedReLU), at the end.

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




# --- sae-lens architectures sharded by latent (standard, jumprelu, batchtopk) -----------------------------------
# Standard and JumpReLU act on each latent alone, so a rank can hold any slice of the latents: the reconstruction
# is a sum over latents (an all-reduce, as the TopK's), each rank's penalty term is a sum over its own latents
# (which is all its parameters' gradient needs), and b_dec's gradient through the encoder is summed over ranks.
# BatchTopK adds two rules over all latents: its k x rows largest activations of the whole (rows x d_sae) batch
# (each rank proposes its own top, an all-gather gives the global threshold) and its auxiliary loss's top dead
# latents of each row (the same, per row); Matryoshka (BatchTopK's) also decodes each prefix of the latents, each
# rank its latents below the prefix's width, summed over ranks. Gated's gate and magnitude paths are per latent too;
# its auxiliary reconstruction through the gate path is summed over ranks as the main one is; lens-topk (sae-lens'
# TopK) takes each row's top k over ranks and BatchTopK's AuxK. The transcoders stay data parallel.
LENS_SHARDED = {"W_enc": 1, "b_enc": 0, "W_dec": 0, "threshold": 0,  # parameter -> its latent dimension
                "b_gate": 0, "r_mag": 0, "b_mag": 0}  # gated's
LOCAL_LOSSES = ("l1_loss", "l0_loss", "pre_act_loss")  # sums over this rank's latents only
SHARDABLE = ("topk", "standard", "jumprelu", "batchtopk", "matryoshka", "gated", "p-anneal", "lens-topk")


def _kth_largest(values: torch.Tensor, k: int, dim: int) -> torch.Tensor:
    """The k-th largest of `values` over `dim` across every rank's values (each rank proposes its own top k)."""
    mine = values.topk(min(k, values.shape[dim]), dim=dim).values
    return _all_gather_cat(mine, dim).topk(k, dim=dim).values.narrow(dim, k - 1, 1)


class GlobalRowTopK(torch.nn.Module):
    """sae-lens' TopK activation on this rank's latents: each row's k largest pre-activations over every rank's
    latents (each rank proposes its own top k of the row, an all-gather gives the k-th), ReLU'd, zeros elsewhere."""

    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x >= _kth_largest(x.detach(), self.k, x.dim() - 1)
        return torch.where(kept, x.relu(), 0.0)


class LatentSlices:
    """This rank's slice of the latents, and the gathering and slicing of a whole SAE's state (parameters named in
    LENS_SHARDED, their Adam moments, per-latent counters), shared by the sharded trainers below."""

    def __init__(self, sae: torch.nn.Module, d_sae: int):
        world, rank = dist.get_world_size(), dist.get_rank()
        check_shardable(d_sae, world)
        self.sae, self.d_sae = sae, d_sae
        self.n_local, self.first = d_sae // world, rank * (d_sae // world)

    def slice_parameters(self) -> None:
        """Keep this rank's latents of every parameter named in LENS_SHARDED (the whole SAE's initialisation,
        drawn on every rank with the same seed, sliced)."""
        with torch.no_grad():
            for name, dim in LENS_SHARDED.items():
                value = getattr(self.sae, name, None)
                if isinstance(value, torch.nn.Parameter):
                    setattr(self.sae, name, torch.nn.Parameter(value.narrow(dim, self.first, self.n_local).clone()))
        self.sharded = {id(getattr(self.sae, name)) for name in LENS_SHARDED if hasattr(self.sae, name)}

    def global_batch(self, batch: torch.Tensor) -> torch.Tensor:
        return _all_gather_cat(batch, 0)

    # --- one whole SAE in checkpoints -------------------------------------------------------------------
    def full(self, name: str, value: torch.Tensor) -> torch.Tensor:
        base = name.rsplit(".", 1)[-1]
        return _all_gather_cat(value, LENS_SHARDED[base]) if base in LENS_SHARDED else value

    def part(self, name: str, value: torch.Tensor) -> torch.Tensor:
        base = name.rsplit(".", 1)[-1]
        if base not in LENS_SHARDED:
            return value
        if value.shape[LENS_SHARDED[base]] != self.d_sae:
            raise ValueError(f"the checkpoint holds {value.shape[LENS_SHARDED[base]]} latents, not {self.d_sae}")
        return value.narrow(LENS_SHARDED[base], self.first, self.n_local).clone()

    def _moments(self, state: dict, convert) -> dict:
        names = [name for name, _ in self.sae.named_parameters()]
        state = {**state, "state": dict(state["state"])}
        for position, name in enumerate(names):
            entry = state["state"].get(position)
            if entry is not None:
                state["state"][position] = {key: convert(name, value) if key in ("exp_avg", "exp_avg_sq") else value
                                            for key, value in entry.items()}
        return state

    def gather_optimizer_state(self, state: dict) -> dict:
        return self._moments(state, self.full)

    def slice_optimizer_state(self, state: dict) -> dict:
        return self._moments(state, self.part)

    def gather_counter(self, counter: torch.Tensor) -> torch.Tensor:
        return _all_gather_cat(counter, 0)

    def slice_counter(self, counter: torch.Tensor) -> torch.Tensor:
        return counter[self.first:self.first + self.n_local].clone()

class ShardedLens(LatentSlices):
    """A sae-lens training SAE (standard, jumprelu, batchtopk, matryoshka, gated, topk) cut to this rank's latents,
    the same way as ShardedTopKSAE: rank r of W holds latents [r d_sae / W, (r + 1) d_sae / W) of W_enc, b_enc,
    W_dec (jumprelu's threshold, gated's b_gate, r_mag, b_mag), their Adam moments and sae-lens' dead-latent
    counters; b_dec is on every rank. Every rank trains on the all-gathered global batch, so the counters need no
    merging. Built before sae-lens' trainer (whose optimiser and counters then hold the slice)."""

    def __init__(self, sae, architecture: str):
        from sae_lens.saes.topk_sae import act_times_W_dec

        super().__init__(sae, sae.cfg.d_sae)
        cfg = sae.cfg
        if architecture == "standard" and cfg.lp_norm != 1:
            raise ValueError(f"--shard-latents trains a standard SAE with its L1 penalty (lp_norm 1), not lp_norm "
                             f"{cfg.lp_norm}: an Lp norm over the latents is not a sum of each rank's")
        if architecture == "jumprelu" and cfg.jumprelu_sparsity_loss_mode == "quadratic":
            raise ValueError("--shard-latents trains jumprelu with the step or tanh sparsity loss, not quadratic "
                             "(a function of each row's L0 over all ranks)")
        if architecture == "matryoshka" and cfg.use_matryoshka_aux_loss:
            raise ValueError("--shard-latents trains matryoshka with BatchTopK's auxiliary loss, not "
                             "use_matryoshka_aux_loss (a top k of each level's dead latents)")
        if getattr(cfg, "normalize_activations", "none") not in ("none", None):
            raise ValueError("--shard-latents trains on activations as they are (normalize_activations none)")
        self.slice_parameters()
        sae.cfg.d_sae = self.n_local  # sae-lens' trainer sizes its counters by it
        process_sae_in, decode_rest = sae.process_sae_in, sae.hook_sae_recons
        rescale = bool(getattr(cfg, "rescale_acts_by_decoder_norm", False))  # the TopK family's option

        def shared_process_sae_in(x):  # b_dec's gradient through the encoder: summed over the ranks' slices
            return _SharedInput.apply(process_sae_in(x))

        def times_decoder(feature_acts):  # the sum over latents, taken over every rank
            return _SumOverRanks.apply(act_times_W_dec(feature_acts, sae.W_dec, rescale))

        def decode(feature_acts):  # TrainingSAE.decode / TopKTrainingSAE.decode
            out = decode_rest(times_decoder(feature_acts) + sae.b_dec)
            return sae.reshape_fn_out(sae.run_time_activation_norm_fn_out(out), sae.d_head)

        sae.process_sae_in, sae.decode = shared_process_sae_in, decode
        if architecture in ("batchtopk", "matryoshka"):
            from .ranks import GlobalBatchTopK, global_min_positive_threshold

            # the k x rows largest activations of all ranks' latents together
            sae.activation_fn = GlobalBatchTopK(sae.activation_fn.k, rows_are_global=True)
            sae.update_topk_threshold = global_min_positive_threshold(sae)  # the smallest kept, over ranks
        if architecture == "lens-topk":
            if getattr(cfg, "use_sparse_activations", False):
                raise ValueError("--shard-latents trains lens-topk with dense activations (use_sparse_activations "
                                 "off)")
            sae.activation_fn = GlobalRowTopK(sae.activation_fn.k)
        if architecture in ("batchtopk", "matryoshka", "lens-topk"):
            def calculate_topk_aux_loss(sae_in, sae_out, hidden_pre, dead_neuron_mask):
                """TopKTrainingSAE.calculate_topk_aux_loss over every rank's dead latents."""
                n_dead = torch.tensor([0 if dead_neuron_mask is None else int(dead_neuron_mask.sum())])
                dist.all_reduce(n_dead)
                if int(n_dead) == 0:
                    return sae_out.new_tensor(0.0)
                residual = (sae_in - sae_out).detach()
                k_aux = sae_in.shape[-1] // 2
                scale = min(int(n_dead) / k_aux, 1.0)
                k_aux = min(k_aux, int(n_dead))
                scores = torch.where(dead_neuron_mask[None], hidden_pre, -torch.inf)
                kept = dead_neuron_mask[None] & (scores >= _kth_largest(scores.detach(), k_aux, 1))
                recons = sae.reshape_fn_out(times_decoder(torch.where(kept, hidden_pre, 0.0)), sae.d_head)
                return sae.cfg.aux_loss_coefficient * scale * (recons - residual).pow(2).sum(dim=-1).mean()

            sae.calculate_topk_aux_loss = calculate_topk_aux_loss
        if architecture == "gated":
            def calculate_aux_loss(step_input, feature_acts, hidden_pre, sae_out):
                """GatedTrainingSAE.calculate_aux_loss: the gate path's L1 over this rank's latents, its
                reconstruction summed over ranks (and b_dec's gradient through the gate path summed)."""
                centred = _SharedInput.apply(step_input.sae_in - sae.b_dec * cfg.apply_b_dec_to_input)
                gate = torch.relu(centred @ sae.W_enc + sae.b_gate)
                l1_loss = step_input.coefficients["l1"] * torch.sum(gate * sae.W_dec.norm(dim=1), dim=-1).mean()
                via_gate = _SumOverRanks.apply(gate @ sae.W_dec) + sae.b_dec
                return {"l1_loss": l1_loss,
                        "auxiliary_reconstruction_loss": (via_gate - step_input.sae_in).pow(2).sum(dim=-1).mean()}

            sae.calculate_aux_loss = calculate_aux_loss
        if architecture == "matryoshka":
            first, n_local = self.first, self.n_local

            def iterable_decode(feature_acts, include_outer_loss=False):
                """MatryoshkaBatchTopKTrainingSAE._iterable_decode: each prefix of the latents (the global
                widths) decoded by the ranks holding part of it, summed over ranks."""
                if rescale:
                    feature_acts = feature_acts * (1 / sae.W_dec.norm(dim=-1))
                widths = cfg.matryoshka_widths if include_outer_loss else cfg.matryoshka_widths[:-1]
                for width in widths:
                    mine = min(max(width - first, 0), n_local)  # this rank's latents below the width
                    decoded = _SumOverRanks.apply(feature_acts[:, :mine] @ sae.W_dec[:mine]) + sae.b_dec
                    yield width, sae.run_time_activation_norm_fn_out(decoded)

            sae._iterable_decode = iterable_decode

    def process_for_inference(self, state: dict) -> None:
        """sae-lens' process_state_dict_for_saving_inference on the whole (gathered) state, run as if the module
        held every latent (it reads the decoder's norms and b_enc's size off the module)."""
        sae, held = self.sae, {}
        try:
            for name in LENS_SHARDED:
                if name in sae._parameters:
                    held[name] = sae._parameters[name]
                    sae._parameters[name] = torch.nn.Parameter(state[name].clone(), requires_grad=False)
            sae.cfg.d_sae = self.d_sae
            sae.process_state_dict_for_saving_inference(state)
        finally:
            sae._parameters.update(held)
            sae.cfg.d_sae = self.n_local

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
        """torch's clip_grad_norm_ (which sae-lens' step calls) with the norm of the whole SAE's gradient: the
        slices' squares summed over ranks, b_dec's once."""
        grads = [p.grad for p in parameters if p.grad is not None]
        if norm_type != 2.0:
            raise ValueError("sharded gradient clipping takes the 2-norm")
        mine = torch.zeros(2, dtype=torch.float64)
        for p in self.sae.parameters():
            if p.grad is not None:
                mine[0 if id(p) in self.sharded else 1] += p.grad.double().square().sum()
        shared = mine[1].clone()
        dist.all_reduce(mine)
        total = (mine[0] + shared).sqrt().float()
        scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for grad in grads:
            grad.mul_(scale)
        return total

    def reported(self, losses: dict[str, float], l0: float) -> tuple[dict[str, float], float]:
        """Each rank's penalty terms and L0 cover its own latents: their sums are the whole SAE's (the
        reconstruction losses are the whole SAE's on every rank already)."""
        names = sorted(name for name in losses if name in LOCAL_LOSSES)
        values = torch.tensor([losses[name] for name in names] + [l0], dtype=torch.float64)
        dist.all_reduce(values)
        summed = dict(zip(names, values[:-1].tolist()))
        return {**losses, **summed}, float(values[-1])


class ShardedReLU(LatentSlices):
    """p-anneal's ReLU SAE (saes.trainers._ReLUSAE) cut to this rank's latents: W_enc's columns, b_enc and W_dec's
    rows; b_dec on every rank. Its forward on the global batch sums the decode over ranks and b_dec's gradient
    through the encoder; `sum_over_ranks` gives the trainer the L_p penalty's per-row sum over every latent (the
    penalty is a power of it), the same on every rank."""

    def __init__(self, sae: torch.nn.Module, d_sae: int):
        super().__init__(sae, d_sae)
        self.slice_parameters()

        def forward(x):
            f = ((_SharedInput.apply(x - sae.b_dec)) @ sae.W_enc + sae.b_enc).relu()
            return _SumOverRanks.apply(f @ sae.W_dec) + sae.b_dec, f

        sae.forward = forward

    @staticmethod
    def sum_over_ranks(part: torch.Tensor) -> torch.Tensor:
        return _SumOverRanks.apply(part)

    def sum_l0(self, l0: float) -> float:
        total = torch.tensor([l0], dtype=torch.float64)
        dist.all_reduce(total)
        return float(total[0])

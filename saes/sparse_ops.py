"""Sparse kernels for a TopK SAE: k of d_sae latents touch only k rows of each weight matrix.

A TopK SAE with 5120 latents and k = 10 uses 0.2% of its dictionary per sample, yet a dense
implementation pays for all of it three more times per step (decode, its gradient, and the
encoder's gradient). Here the only dense product is the encoder's forward pass, which TopK
needs to see every pre-activation; everything after it costs O(batch * k * d_in).

Index convention: `latent_index` is (batch, m) with every row sorted ascending, so that it is
directly the column list of a CSR matrix (batch, n_latents) with m entries per row.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn.functional as F



def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    # CSR tensors are "beta" in torch and warn on creation; the kernels used here are stable.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, values, size)


def sort_rows(index: torch.Tensor) -> torch.Tensor:
    """Sort each row of a small (batch, m) integer tensor ascending.

    Through numpy: torch's CPU sort of small integer tensors is ~100x slower here (0.2 s for a
    4096 x 10 index), which would cost a TopK step more than all its sparse kernels together."""
    if index.device.type != "cpu":
        return index.sort(dim=1).values
    return torch.from_numpy(np.sort(index.numpy(), axis=1))


# torch's CPU top k costs about the same for 256 scores a row as for 128, and 4x as much from 512 on (its
# algorithm changes): each stage of `topk_index` reads at most this many scores a row
_DIRECT_TOPK = 256


def _group_size(n: int, k: int) -> int:
    """How many scores `topk_index` groups into one: 8, 4 or 2, dividing n, with k groups' scores within
    _DIRECT_TOPK and at least k groups; 0 where a plain top k is as fast (n within 2 _DIRECT_TOPK) or no size
    fits."""
    if n <= 2 * _DIRECT_TOPK:
        return 0
    for size in (8, 4, 2):
        if n % size == 0 and k * size <= _DIRECT_TOPK and n // size >= k:
            return size
    return 0


def _topk_positions(scores: torch.Tensor, k: int) -> torch.Tensor:
    """(batch, k) positions of each row's k largest scores, in no order (see topk_index)."""
    batch, n = scores.shape
    size = _group_size(n, k)
    if size == 0:
        return scores.topk(k, dim=1, sorted=False).indices
    n_groups = n // size
    # group g holds the scores g, g + n_groups, g + 2 n_groups, ...: their maximum is a vectorised pass
    best_groups = _topk_positions(scores.view(batch, size, n_groups).amax(1), k)
    columns = (best_groups.unsqueeze(2) + torch.arange(0, n, n_groups, device=scores.device)).reshape(batch, -1)
    return columns.gather(1, _topk_positions(scores.gather(1, columns), k))


def topk_index(scores: torch.Tensor, k: int) -> torch.Tensor:
    """(batch, k) indices of each row's k largest scores, sorted ascending per row: the exact top k, as
    `scores.topk(k)` gives it (the same values; among equal scores either may be chosen, as with torch.topk).

    In stages instead of one top k over every score: the scores are grouped (`_group_size` of them), the k
    groups with the largest maxima are found the same way, and the top k of their scores is the answer. Exact: a
    group holding one of the k largest scores has a maximum at least the k-th largest, and at most k groups have
    such a maximum (k distinct top scores), so the k best groups hold every top score. With SmolLM2's 4608
    latents and k 32 the stages read the scores once (a max per 8) and take top k of 72, 256 and 256 scores."""
    return sort_rows(_topk_positions(scores, k))


def _stable_argsort(values: torch.Tensor) -> torch.Tensor:
    """argsort of a 1-D integer tensor (numpy on CPU, for the reason in sort_rows)."""
    if values.device.type != "cpu":
        return torch.argsort(values, stable=True)
    return torch.from_numpy(np.argsort(values.numpy(), kind="stable"))


class LatentMajor:
    """The (batch, m) selection read latent by latent: entry order sorted by latent (stable), each latent's
    first entry (offsets, (n_latents,)) and the sample of each sorted entry. Computed once per index and shared
    by every weight gradient of a step (the encoder's and the decoder's select the same entries)."""

    def __init__(self, latent_index: torch.Tensor, n_latents: int):
        flat = latent_index.reshape(-1)
        self.order = _stable_argsort(flat)
        self.offsets = torch.zeros(n_latents, dtype=torch.int64, device=latent_index.device)
        if n_latents > 1:
            self.offsets[1:] = torch.bincount(flat, minlength=n_latents)[:-1].cumsum(0)
        self.sample = torch.div(self.order, max(latent_index.shape[1], 1), rounding_mode="floor")

    def scatter(self, coefficients: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """out[l] = sum over entries (b, j) of latent l of coefficients[b, j] * rows[b]: (n_latents, d).
        One embedding bag over `rows` per latent, written once (no zero fill, no sparse matrix)."""
        return F.embedding_bag(self.sample, rows, self.offsets, mode="sum",
                               per_sample_weights=coefficients.reshape(-1)[self.order].to(rows.dtype))


def scatter_rows(latent_index: torch.Tensor, coefficients: torch.Tensor, rows: torch.Tensor,
                 n_latents: int) -> torch.Tensor:
    """out[l] = sum over (b, j) with latent_index[b, j] == l of coefficients[b, j] * rows[b].

    latent_index, coefficients: (batch, m); rows: (batch, d) -> (n_latents, d).
    This is the weight gradient of a sparse layer (a sparse (n_latents x batch) @ (batch x d)).
    """
    if latent_index.numel() == 0:
        return rows.new_zeros(n_latents, rows.shape[1])
    return LatentMajor(latent_index, n_latents).scatter(coefficients, rows)


def gather_rows(latent_index: torch.Tensor, coefficients: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """out[b] = sum_j coefficients[b, j] * table[latent_index[b, j]].

    latent_index, coefficients: (batch, m); table: (n_latents, d) -> (batch, d). A sparse decode.
    """
    return F.embedding_bag(latent_index, table, per_sample_weights=coefficients.to(table.dtype), mode="sum")


def gather_dots(latent_index: torch.Tensor, rows: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """out[b, j] = rows[b] . table[latent_index[b, j]], only at the selected entries.

    latent_index: (batch, m) sorted per row; rows: (batch, d); table: (n_latents, d) -> (batch, m).
    A sampled matrix product (rows @ table.T evaluated only where the mask is set).
    """
    batch, m = latent_index.shape
    if m == 0:
        return rows.new_zeros(batch, 0)
    crow = torch.arange(0, batch * m + 1, m, device=rows.device)
    mask = _csr(crow, latent_index.reshape(-1), rows.new_zeros(batch * m), (batch, table.shape[0]))
    return torch.sparse.sampled_addmm(mask, rows, table.t()).values().view(batch, m)


class SelectedPreActivations(torch.autograd.Function):
    """values[b, j] = inputs[b] . weight[index[b, j]] + bias[index[b, j]], with a sparse backward.

    The forward reads the entries from the dense pre-activations already computed (no_grad) for
    TopK, or takes them as given when ``pre_activations`` is already (batch, m), the index's own entries (the
    float32 values of latents a bf16 dense product chose; with m == n_latents the sorted index is every latent,
    so both readings agree); the backward sends the gradient only to the selected rows of the encoder.
    pre_activations: (batch, n_latents) or (batch, m), detached; inputs: (batch, d_in); weight: (n_latents, d_in);
    bias: (n_latents,); index: (batch, m) sorted per row -> (batch, m).
    """

    @staticmethod
    def forward(ctx, pre_activations, inputs, weight, bias, index):
        ctx.save_for_backward(inputs, weight, index)
        ctx.n_latents = weight.shape[0]
        if pre_activations.shape == index.shape:
            return pre_activations.clone()
        return pre_activations.gather(1, index)

    @staticmethod
    def backward(ctx, grad_values):
        inputs, weight, index = ctx.saved_tensors
        grad_values = grad_values.contiguous()
        grad_inputs = grad_weight = grad_bias = None
        if ctx.needs_input_grad[1]:
            grad_inputs = gather_rows(index, grad_values, weight)
        if ctx.needs_input_grad[2]:
            grad_weight = scatter_rows(index, grad_values, inputs, ctx.n_latents)
        if ctx.needs_input_grad[3]:
            grad_bias = grad_values.new_zeros(ctx.n_latents).index_add_(0, index.reshape(-1), grad_values.reshape(-1))
        return None, grad_inputs, grad_weight, grad_bias, None


class SparseDecode(torch.autograd.Function):
    """out[b] = sum_j values[b, j] * weight[index[b, j]], with a sparse backward.

    values: (batch, m); index: (batch, m) sorted per row; weight: (n_latents, d_in) -> (batch, d_in).
    """

    @staticmethod
    def forward(ctx, values, index, weight):
        ctx.save_for_backward(values, index, weight)
        return gather_rows(index, values, weight)

    @staticmethod
    def backward(ctx, grad_out):
        values, index, weight = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_values = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_values = gather_dots(index, grad_out, weight)
        if ctx.needs_input_grad[2]:
            grad_weight = scatter_rows(index, values, grad_out, weight.shape[0])
        return grad_values, None, grad_weight


def select_pre_activations(pre_activations, inputs, weight, bias, index):
    """Functional form of `SelectedPreActivations`."""
    return SelectedPreActivations.apply(pre_activations, inputs, weight, bias, index)


def sparse_decode(values, index, weight):
    """Functional form of `SparseDecode`."""
    return SparseDecode.apply(values, index, weight)


class SparseTopKAutoencode(torch.autograd.Function):
    """A TopK SAE's reconstruction from its chosen latents, with one sparse backward for all its weights.

    forward: values = relu(chosen); reconstruction[b] = sum_j values[b, j] * decoder[index[b, j]] + pre_bias.
    chosen (batch, k) are the pre-activations (x - pre_bias) . encoder[index] + encoder_bias[index] of the
    chosen latents (detached, already computed), centred = x - pre_bias (detached), index (batch, k) sorted per
    row. The backward gives the gradients of pre_bias, the encoder, its bias and the decoder that autograd
    would give through the dense definition, touching only the chosen rows: the two weight gradients share one
    latent-major ordering of the entries (embedding bags), and pre_bias's gradient through the encoder is
    -(encoder_bias's gradient) @ encoder, a (d_sae,) x (d_sae, d_in) product instead of a (batch, d_in) one.
    Returns (reconstruction (batch, d_in), values (batch, k), the latents' values, not differentiable).
    With a dict as `notes`, the backward also leaves there "decoder_parallel" (d_sae,): each decoder row's
    gradient dotted with the row (sum of values x the latents' gradients), which the unit-norm rule needs and which
    costs no pass over the (d_sae, d_in) gradient this way.
    """

    @staticmethod
    def forward(ctx, chosen, centred, index, pre_bias, encoder_weight, encoder_bias, decoder_weight, notes=None):
        ctx.notes = notes
        values = chosen.relu()
        reconstruction = F.embedding_bag(index, decoder_weight, per_sample_weights=values, mode="sum")
        reconstruction += pre_bias
        ctx.save_for_backward(values, centred, index, encoder_weight, decoder_weight)
        ctx.mark_non_differentiable(values)
        return reconstruction, values

    @staticmethod
    def backward(ctx, grad_reconstruction, _grad_values):
        values, centred, index, encoder_weight, decoder_weight = ctx.saved_tensors
        grad_reconstruction = grad_reconstruction.contiguous()
        n_latents = decoder_weight.shape[0]
        grad_latents = gather_dots(index, grad_reconstruction, decoder_weight)
        grad_pre = grad_latents * (values > 0)  # through the ReLU
        order = LatentMajor(index, n_latents)
        grad_decoder = order.scatter(values, grad_reconstruction) if ctx.needs_input_grad[6] else None
        grad_encoder = order.scatter(grad_pre, centred) if ctx.needs_input_grad[4] else None
        grad_bias = grad_pre.new_zeros(n_latents).index_add_(0, index.reshape(-1), grad_pre.reshape(-1))
        grad_pre_bias = None
        if ctx.needs_input_grad[3]:
            grad_pre_bias = grad_reconstruction.sum(0) - grad_bias @ encoder_weight
        if ctx.notes is not None:
            ctx.notes["decoder_parallel"] = grad_bias.new_zeros(n_latents).index_add_(
                0, index.reshape(-1), (values * grad_latents).reshape(-1))
        return (None, None, None, grad_pre_bias, grad_encoder, grad_bias if ctx.needs_input_grad[5] else None,
                grad_decoder, None)


def sparse_topk_autoencode(chosen, centred, index, pre_bias, encoder_weight, encoder_bias, decoder_weight,
                           notes: dict | None = None):
    """Functional form of `SparseTopKAutoencode`: (reconstruction, values)."""
    return SparseTopKAutoencode.apply(chosen, centred, index, pre_bias, encoder_weight, encoder_bias,
                                      decoder_weight, notes)

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


def _stable_argsort(values: torch.Tensor) -> torch.Tensor:
    """argsort of a 1-D integer tensor (numpy on CPU, for the reason in sort_rows)."""
    if values.device.type != "cpu":
        return torch.argsort(values, stable=True)
    return torch.from_numpy(np.argsort(values.numpy(), kind="stable"))


def _latent_major_csr(latent_index: torch.Tensor, coefficients: torch.Tensor, n_latents: int) -> torch.Tensor:
    """The transpose of the (batch, n_latents) selection as a CSR matrix (n_latents, batch)."""
    batch, m = latent_index.shape
    flat_latents = latent_index.reshape(-1)
    order = _stable_argsort(flat_latents)
    crow = torch.zeros(n_latents + 1, dtype=torch.int64, device=latent_index.device)
    crow[1:] = torch.bincount(flat_latents, minlength=n_latents).cumsum(0)
    sample_of_entry = torch.div(order, m, rounding_mode="floor")
    return _csr(crow, sample_of_entry, coefficients.reshape(-1)[order], (n_latents, batch))


def scatter_rows(latent_index: torch.Tensor, coefficients: torch.Tensor, rows: torch.Tensor,
                 n_latents: int) -> torch.Tensor:
    """out[l] = sum over (b, j) with latent_index[b, j] == l of coefficients[b, j] * rows[b].

    latent_index, coefficients: (batch, m); rows: (batch, d) -> (n_latents, d).
    This is the weight gradient of a sparse layer; a sparse (n_latents x batch) @ (batch x d).
    """
    if latent_index.numel() == 0:
        return rows.new_zeros(n_latents, rows.shape[1])
    csr = _latent_major_csr(latent_index, coefficients.to(rows.dtype), n_latents)
    return csr @ rows


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

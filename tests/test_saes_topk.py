"""The TopK SAE's math: sparse kernels against a dense reference, geometric median, unit-norm decoder."""

from __future__ import annotations

import pytest
import torch

from saes.sparse_ops import gather_dots, gather_rows, scatter_rows, topk_index
from saes.topk import (TopKConfig, TrainingTopKSAE, geometric_median, reference_losses, remove_parallel_gradient_,
                       set_decoder_unit_norm_)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: a second thread only adds synchronisation, badly so on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _sorted_index(batch, m, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, n, generator=g).argsort(1)[:, :m].sort(1).values


def test_sparse_kernels_equal_their_dense_definitions():
    batch, m, n, d = 16, 3, 20, 7
    index = _sorted_index(batch, m, n)
    coefficients, rows, table = torch.randn(batch, m), torch.randn(batch, d), torch.randn(n, d)
    dense = torch.zeros(batch, n).scatter(1, index, coefficients)  # (batch, n) selection matrix
    torch.testing.assert_close(scatter_rows(index, coefficients, rows, n), dense.t() @ rows)
    torch.testing.assert_close(gather_rows(index, coefficients, table), dense @ table)
    torch.testing.assert_close(gather_dots(index, rows, table), (rows @ table.t()).gather(1, index))


@pytest.mark.parametrize("n, k", [(4608, 32), (4608, 1), (1152, 40), (576, 7), (100, 5), (131072, 32)])
def test_staged_topk_index_is_the_exact_top_k(n, k):
    scores = torch.randn(8 if n > 10_000 else 64, n, generator=torch.Generator().manual_seed(n + k))
    scores[0, :k + 3] = scores[0].max() + 1  # ties at the top of a row: the same values, whichever is kept
    got = topk_index(scores, k)
    assert torch.equal(got, got.sort(1).values)  # sorted per row, as the sparse kernels' index convention
    torch.testing.assert_close(scores.gather(1, got).sort(1).values, scores.topk(k, dim=1).values.sort(1).values,
                               rtol=0, atol=0)
    torch.testing.assert_close(got[1:], scores[1:].topk(k, dim=1).indices.sort(1).values, rtol=0, atol=0)


@pytest.mark.parametrize("with_dead_latents, d_sae", [(False, 192), (True, 192), (False, 1152)])
def test_sparse_training_step_matches_dense_reference(with_dead_latents, d_sae):
    """The sparse step (staged top k at d_sae 1152, one sparse backward) against autograd on dense latents:
    losses, reconstruction and every gradient within 1e-5."""
    torch.manual_seed(0)
    sae = TrainingTopKSAE(TopKConfig(d_in=48, d_sae=d_sae, k=6, aux_k=16, dead_after_tokens=100))
    x = torch.randn(96, 48) * 1.5 + 0.5
    sae.initialise_pre_bias_(x)
    with torch.no_grad():
        sae.encoder_bias.normal_(0, 0.3)
        sae.encoder_weight.add_(0.1 * torch.randn_like(sae.encoder_weight))
    if with_dead_latents:
        sae.tokens_since_fired[::4] = 1000  # 48 dead latents, more than aux_k
    out = sae(x)
    out["loss"].backward()
    sparse_grads = {name: p.grad.clone() for name, p in sae.named_parameters()}
    # the unit-norm rule's rows . gradients, from the sparse backward: exact when AuxK adds no decoder term
    assert out["aux_loss"].requires_grad == with_dead_latents  # the trainer computes them itself then
    if not with_dead_latents:
        torch.testing.assert_close(sae.decoder_parallel(), torch.linalg.vecdot(sae.decoder_weight.grad,
                                                                               sae.decoder_weight),
                                   rtol=0, atol=1e-6)
    sae.zero_grad()
    ref = reference_losses(sae, x)
    ref["loss"].backward()
    assert (float(out["aux_loss"].detach()) > 0) == with_dead_latents
    for key in ("loss", "mse_loss", "aux_loss"):
        torch.testing.assert_close(out[key], ref[key], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["reconstruction"], ref["reconstruction"], rtol=1e-5, atol=1e-5)
    for name, p in sae.named_parameters():
        assert p.grad.abs().max() > 0, name
        torch.testing.assert_close(sparse_grads[name], p.grad, rtol=1e-4, atol=1e-7, msg=name)
        torch.testing.assert_close(sparse_grads[name], p.grad, rtol=0, atol=1e-5, msg=name)


def test_geometric_median_resists_outliers_and_minimises_distance_sum():
    g = torch.Generator().manual_seed(0)
    cluster = torch.randn(200, 5, generator=g) * 0.1 + 2.0
    points = torch.cat([cluster, torch.full((20, 5), 100.0)])
    median = geometric_median(points)
    assert (median - 2.0).abs().max() < 0.2  # the mean is dragged to ~11
    total = lambda c: (points - c).norm(dim=1).sum()  # noqa: E731
    for direction in torch.eye(5):
        assert total(median) <= total(median + 1e-2 * direction) + 1e-4
        assert total(median) <= total(median - 1e-2 * direction) + 1e-4


def test_decoder_norm_functions_keep_unit_rows_and_orthogonal_gradients():
    weight = torch.nn.Parameter(torch.randn(10, 6) * 3)
    set_decoder_unit_norm_(weight.data)
    torch.testing.assert_close(weight.norm(dim=1), torch.ones(10))
    weight.grad = torch.randn(10, 6)
    remove_parallel_gradient_(weight)
    torch.testing.assert_close((weight.grad * weight).sum(1), torch.zeros(10), atol=1e-6, rtol=0)


def test_config_rejects_k_larger_than_latents():
    with pytest.raises(ValueError, match="k must be"):
        TopKConfig(d_in=8, d_sae=16, k=17).validate()

"""The Variance Concentration Loss: value and gradient against a reference, safety, settings, validation."""

from __future__ import annotations

import math

import pytest
import torch

from flowlens.vcl import VCLConfig, select_positions, top_k_energy_ratio, variance_concentration_loss, window_layers


def reference_ratio(rows: torch.Tensor, k: int) -> torch.Tensor:
    """Straight from the definition: singular values of the centred rows."""
    singular = torch.linalg.svdvals(rows - rows.mean(dim=0))
    return (singular[:k] ** 2).sum() / (singular ** 2).sum()


@pytest.mark.parametrize("shape", [(8, 5), (5, 12)])  # B > d and B < d take different Gram matrices
def test_ratio_and_gradient_match_the_reference(shape):
    rows = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * \
        torch.linspace(3, 0.5, shape[1], dtype=torch.float64)
    rows.requires_grad_(True)
    ours = top_k_energy_ratio(rows, 2)
    (ours_grad,) = torch.autograd.grad(ours, rows)
    ref = reference_ratio(rows, 2)
    (ref_grad,) = torch.autograd.grad(ref, rows)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-7)
    torch.testing.assert_close(ours_grad, ref_grad, rtol=1e-5, atol=1e-9)


def test_gradcheck_in_float64():
    rows = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * \
        torch.tensor([4.0, 2.0, 1.0, 0.5], dtype=torch.float64)
    rows.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda r: top_k_energy_ratio(r, 2), (rows,), eps=1e-6, atol=1e-6)
    config = VCLConfig(k=1, weight=2.0, pooling="stacked")
    other = rows.detach().flip(0).clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: variance_concentration_loss([a, b], config)["loss"], (rows, other),
                                    eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("name,rows", [
    ("constant batch", torch.ones(6, 8)),
    ("single row", torch.randn(1, 8)),
    ("batch smaller than k", torch.randn(2, 8)),
    ("rank one", torch.randn(6, 1) * torch.randn(1, 8)),
    ("duplicated rows", torch.randn(3, 8).repeat(2, 1)),
    ("fp16", (torch.randn(6, 8) * 40).half()),
    ("bf16", (torch.randn(6, 8) * 40).bfloat16()),
    ("large fp16", torch.full((6, 8), 3e4).half() + torch.randn(6, 8).half()),
    ("tiny values", torch.randn(6, 8) * 1e-30),
])
def test_loss_and_gradients_stay_finite(name, rows):
    rows = rows.clone().requires_grad_(True)
    out = variance_concentration_loss([rows, rows * 2], VCLConfig(k=4))
    out["loss"].backward()
    assert math.isfinite(out["loss"].item()), name
    assert torch.isfinite(rows.grad).all(), name
    assert rows.grad.dtype == rows.dtype
    assert -1e-6 <= out["ratio"].item() <= 1 + 1e-6


def test_constant_batch_has_no_concentration_and_few_rows_have_full_concentration():
    assert top_k_energy_ratio(torch.ones(5, 3), 1).item() == 0.0
    assert top_k_energy_ratio(torch.randn(3, 10), 2).item() == pytest.approx(1.0, abs=1e-6)


def test_signs_and_poolings():
    layers = [torch.randn(8, 6, generator=torch.Generator().manual_seed(s)) * torch.arange(1, 7) ** s
              for s in range(2)]
    ratios = [reference_ratio(r.double(), 2).item() for r in layers]
    penalize = variance_concentration_loss(layers, VCLConfig(k=2, weight=3.0))
    encourage = variance_concentration_loss(layers, VCLConfig(k=2, weight=3.0, sign="encourage"))
    assert penalize["loss"].item() == pytest.approx(3.0 * sum(ratios) / 2, rel=1e-5)
    assert encourage["loss"].item() == pytest.approx(-penalize["loss"].item())
    stacked = variance_concentration_loss(layers, VCLConfig(k=2, pooling="stacked"))
    assert stacked["ratio"].item() == pytest.approx(reference_ratio(torch.cat(layers).double(), 2).item(), rel=1e-5)


@pytest.mark.parametrize("sign", ["penalize", "encourage"])
def test_descending_the_loss_moves_concentration_the_asked_way(sign):
    rows = (torch.randn(16, 8, generator=torch.Generator().manual_seed(3)) * torch.linspace(2, 1, 8))
    rows.requires_grad_(True)
    config = VCLConfig(k=2, sign=sign)
    before = top_k_energy_ratio(rows, 2).item()
    optimizer = torch.optim.SGD([rows], lr=0.5)
    for _ in range(30):
        optimizer.zero_grad()
        variance_concentration_loss([rows], config)["loss"].backward()
        optimizer.step()
    after = top_k_energy_ratio(rows, 2).item()
    assert (after < before - 0.05) if sign == "penalize" else (after > before + 0.05)


def test_select_positions_takes_each_rows_last_prompt_token_or_all_response_tokens():
    hidden = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)
    prompt = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    response = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 0, 1]], dtype=torch.bool)
    torch.testing.assert_close(select_positions(hidden, prompt, response, "last_prompt"),
                               torch.stack([hidden[0, 1], hidden[1, 3]]))
    assert select_positions(hidden, prompt, response, "response").shape == (3, 3)


@pytest.mark.parametrize("kwargs,message", [
    ({"window": (-0.1, 0.5)}, "outside"), ({"window": (0.2, 1.5)}, "outside"), ({"window": (0.6, 0.4)}, "empty"),
    ({"weight": float("nan")}, "finite"), ({"weight": float("inf")}, "finite"), ({"k": 0}, "positive"),
    ({"sign": "maximize"}, "sign"), ({"pooling": "max"}, "pooling"),
])
def test_bad_settings_are_refused_on_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VCLConfig(**kwargs)


def test_k_against_batch_width_and_window_against_depth():
    config = VCLConfig(k=4, window=(0.3, 0.5))
    with pytest.raises(ValueError, match="larger than the batch size 2"):
        config.check_against(batch_size=2, width=64, n_layers=16)
    with pytest.raises(ValueError, match="larger than the residual width 3"):
        config.check_against(batch_size=8, width=3, n_layers=16)
    assert config.check_against(batch_size=8, width=64, n_layers=16) == [5, 6, 7]
    assert window_layers((0.0, 1.0), 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="holds no layer of a model with 4 layers"):
        window_layers((0.4, 0.6), 4)

"""The step-transfer experiment's measuring functions on inputs whose answer is known."""

import pytest
import torch

from experiments.step_transfer import (feature_agreement, position_vectors, random_direction_sae,
                                       reconstruction_metrics)


def _sparse_latents(n: int = 400, d_sae: int = 16, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.rand(n, d_sae, generator=generator)
    return values * (torch.rand(n, d_sae, generator=generator) < 0.3)  # each feature fires on about 30% of rows


def test_identical_runs_agree_fully_and_a_rescaled_one_keeps_correlation_and_top_k():
    latents = _sparse_latents()
    same = feature_agreement(latents, latents.clone(), top_k=10, min_firing=20)
    assert same["features_compared"] == 16
    assert same["correlation"] == pytest.approx(1.0) and same["top_k_overlap"] == 1.0
    assert same["active_jaccard"] == 1.0
    scaled = feature_agreement(latents, 3 * latents, top_k=10, min_firing=20)
    assert scaled["correlation"] == pytest.approx(1.0) and scaled["top_k_overlap"] == 1.0


def test_rows_paired_with_other_positions_agree_about_as_chance_does():
    latents = _sparse_latents(n=2000)
    shuffled = latents[torch.randperm(len(latents), generator=torch.Generator().manual_seed(1))]
    result = feature_agreement(latents, shuffled, top_k=20, min_firing=20)
    assert abs(result["correlation"]) < 0.1
    assert result["top_k_overlap"] < 0.1          # chance: about 0.3 * 20 / 2000 rows
    assert result["active_jaccard"] < 0.3         # chance for two 30% sets: 0.09 / 0.51


def test_a_feature_silent_in_the_other_run_counts_as_no_agreement_and_rare_features_are_not_compared():
    latents = _sparse_latents()
    other = latents.clone()
    other[:, 0] = 0                 # feature 0 never fires in the other run
    latents[:, 1] = 0
    latents[:5, 1] = 1.0            # feature 1 fires on 5 rows only: below min_firing
    result = feature_agreement(latents, other, top_k=10, min_firing=20)
    assert result["features_compared"] == 15
    assert result["correlation"] == pytest.approx(14 / 15)
    assert result["top_k_overlap"] == pytest.approx(14 / 15)
    with pytest.raises(ValueError, match="one .n, d_sae. shape"):
        feature_agreement(latents, other[:-1])


def test_position_vectors_pair_the_same_image_and_position_across_settings():
    updates = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)  # (n, C, H, W)
    vectors = position_vectors(updates)
    assert vectors.shape == (2 * 4 * 5, 3)
    assert torch.equal(vectors[1 * 20 + 2 * 5 + 3], updates[1, :, 2, 3])


def test_the_random_direction_floor_reconstructs_far_less_than_an_sae_that_holds_the_data_directions():
    from saes.sae import SAE, SAEConfig

    d_in, d_sae, k = 32, 64, 4
    generator = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(d_in, d_in, generator=generator))[0][:, :8].T  # 8 orthonormal directions
    codes = torch.rand(5000, 8, generator=generator) * (torch.rand(5000, 8, generator=generator) < 0.4)
    vectors = codes @ basis                                  # each vector: at most 8 non-negative parts
    fitted = SAE(SAEConfig("topk", d_in, d_sae, k=8))
    fitted.W_dec.data[:8] = basis
    fitted.W_enc.data[:, :8] = basis.T
    assert reconstruction_metrics(fitted, vectors)["explained_variance"] == pytest.approx(1.0, abs=1e-5)
    floor = random_direction_sae(d_in, d_sae, k, seed=0)
    assert torch.allclose(floor.W_dec.norm(dim=1), torch.ones(d_sae))
    assert torch.equal(floor.W_enc, floor.W_dec.T)
    measured = reconstruction_metrics(floor, vectors)
    assert measured["explained_variance"] < 0.6 and measured["l0"] <= k
    assert torch.equal(random_direction_sae(d_in, d_sae, k, seed=0).W_dec, floor.W_dec)  # reproducible by seed


def test_update_drift_is_zero_for_the_same_updates_and_about_two_for_unrelated_ones():
    from experiments.step_transfer import update_drift

    generator = torch.Generator().manual_seed(0)
    updates = torch.randn(4000, 8, generator=generator)
    assert update_drift(updates, updates.clone()) == 0.0
    assert update_drift(updates, torch.randn(4000, 8, generator=generator)) == pytest.approx(2.0, abs=0.1)
    assert update_drift(updates, 1.5 * updates) == pytest.approx(0.25, abs=0.01)

"""Residual geometry on synthetic data whose structure is known."""

from __future__ import annotations

import numpy as np
import pytest

from flowlens.geometry import (concatenated, concentration_by_layer, concentration_from_spectrum, fit_pca,
                               layer_projections, pc1_stability, stacked, strip_trailing_punctuation,
                               structural_alignment, twonn_dimension)


def plane_points(n=400, width=10, seed=0):
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.normal(size=(width, 2)))
    offset = rng.normal(size=width)
    return rng.uniform(-1, 1, size=(n, 2)) @ basis.T + offset, basis


def test_data_on_a_plane_has_twonn_two_and_all_energy_in_two_directions():
    points, basis = plane_points()
    assert twonn_dimension(points) == pytest.approx(2.0, abs=0.3)
    fit = fit_pca(points, "twonn")
    assert fit.n_components == 2
    assert fit.explained_variance_ratio.sum() == pytest.approx(1.0, abs=1e-9)
    # each principal direction lies in the plane
    np.testing.assert_allclose(np.linalg.norm(fit.components @ basis, axis=1), 1.0, atol=1e-9)
    residuals = points.reshape(100, 4, 10)
    stats = concentration_by_layer(residuals, k=2)
    np.testing.assert_allclose(stats["top_k_energy"], 1.0, atol=1e-9)
    assert all(1.0 < pr <= 2.0 + 1e-9 for pr in stats["participation_ratio"])


def test_twonn_of_a_cube_in_five_dimensions_is_about_five():
    points = np.random.default_rng(1).uniform(size=(2000, 5))
    assert twonn_dimension(points) == pytest.approx(5.0, abs=0.8)


def test_concentration_statistics_match_hand_values():
    stats = concentration_from_spectrum(np.array([4.0, 1.0, 0.0]), k=1)
    assert stats["top_k_energy"] == pytest.approx(0.8)
    assert stats["participation_ratio"] == pytest.approx(25 / 17)
    p = np.array([2 / 3, 1 / 3])  # singular values 2 and 1
    assert stats["effective_rank"] == pytest.approx(np.exp(-(p * np.log(p)).sum()))
    assert concentration_from_spectrum(np.zeros(3), k=2)["top_k_energy"] == 0.0
    equal = concentration_from_spectrum(np.ones(4), k=2)
    assert equal["participation_ratio"] == pytest.approx(4) and equal["effective_rank"] == pytest.approx(4)


def test_constructions_keep_prompt_and_layer_order():
    residuals = np.arange(2 * 3 * 4, dtype=float).reshape(2, 3, 4)
    np.testing.assert_array_equal(stacked(residuals)[1 * 3 + 2], residuals[1, 2])
    np.testing.assert_array_equal(concatenated(residuals)[1, 2 * 4:3 * 4], residuals[1, 2])


def drifting_residuals(n=60, layers=6, width=8, seed=0):
    """Residuals that move along e0 with depth, plus small noise."""
    rng = np.random.default_rng(seed)
    residuals = 0.05 * rng.normal(size=(n, layers, width))
    residuals[:, :, 0] += np.arange(layers)[None, :] * 1.0
    return residuals


def test_stacked_pc1_follows_depth():
    result = layer_projections(drifting_residuals(), "stacked", 2)
    assert abs(result.pca.components[0, 0]) > 0.99
    trajectory = result.mean_by_layer()[:, 0]
    assert abs(np.corrcoef(trajectory, result.depth)[0, 1]) > 0.999
    np.testing.assert_allclose(result.depth, np.linspace(0, 1, 6))


def test_concatenated_layer_shares_sum_to_the_full_projection():
    residuals = drifting_residuals()
    result = layer_projections(residuals, "concatenated", 3)
    full = result.pca.transform(concatenated(residuals))
    np.testing.assert_allclose(result.projections.sum(axis=1), full, atol=1e-9)


def test_low_rank_svd_agrees_with_scikit_learn():
    rng = np.random.default_rng(2)
    matrix = rng.normal(size=(200, 3)) * [10.0, 5.0, 2.0] @ np.linalg.qr(rng.normal(size=(50, 3)))[0].T
    matrix += 0.01 * rng.normal(size=matrix.shape)
    exact, low = fit_pca(matrix, 3, "sklearn"), fit_pca(matrix, 3, "lowrank")
    np.testing.assert_allclose(np.abs((exact.components * low.components).sum(axis=1)), 1.0, atol=1e-6)
    np.testing.assert_allclose(low.explained_variance_ratio, exact.explained_variance_ratio, rtol=1e-6)


def test_alignment_is_one_for_the_same_geometry_and_low_for_a_rotated_one():
    residuals = drifting_residuals(seed=3)
    residuals[:, :, 1] += np.random.default_rng(4).normal(size=(60, 1)) * 0.5  # a second direction
    same = structural_alignment(residuals, residuals.copy(), 2)
    np.testing.assert_allclose(same["score"], 1.0, atol=1e-9)
    rotation = np.linalg.qr(np.random.default_rng(5).normal(size=(8, 8)))[0]
    rotated = structural_alignment(residuals, residuals @ rotation, 1)
    assert rotated["score"].mean() < 0.9
    deeper = structural_alignment(residuals, np.repeat(residuals, 2, axis=1), 1)
    assert deeper["reference_layer"][[0, -1]].tolist() == [0, 11]


def test_alignment_with_a_reference_of_another_width_is_refused():
    with pytest.raises(ValueError, match="width 6 but the model has width 8"):
        structural_alignment(drifting_residuals(), np.zeros((60, 6, 6)))


def test_pc1_stability_separates_small_perturbations_from_unrelated_residuals():
    residuals = drifting_residuals(seed=6)
    residuals[:, :, 2] += np.random.default_rng(7).normal(size=(60, 1)) * 2.0  # per-prompt spread along PC1
    nearby = residuals + 0.01 * np.random.default_rng(8).normal(size=residuals.shape)
    assert pc1_stability(residuals, nearby)["overall"] > 0.99
    unrelated = drifting_residuals(seed=9)
    unrelated[:, :, 2] += np.random.default_rng(10).normal(size=(60, 1)) * 2.0
    assert np.nanmean(np.abs(pc1_stability(residuals, unrelated)["per_layer"])) < 0.5
    assert strip_trailing_punctuation("How do I kill a Python process?! ") == "How do I kill a Python process"


def test_pc1_stability_strips_what_the_residual_capture_strips():
    """Issue 20: geometry stripped .?!;:, and interp.hooks.lm (which computes the stripped residuals) all of
    string.punctuation; there is one function now, interp.lm_text's, with the capture's behaviour."""
    import interp.hooks.lm
    import interp.lm_text

    assert strip_trailing_punctuation is interp.lm_text.strip_trailing_punctuation
    assert interp.hooks.lm.strip_trailing_punctuation is interp.lm_text.strip_trailing_punctuation
    assert strip_trailing_punctuation('Say "hello?" ') == "Say \"hello"
    assert strip_trailing_punctuation("What is 3 plus 4 (or 5)?...") == "What is 3 plus 4 (or 5"
    assert strip_trailing_punctuation("no punctuation") == "no punctuation"


def test_bad_residuals_are_refused():
    with pytest.raises(ValueError, match=r"\(N, L, d\)"):
        concentration_by_layer(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="no prompts"):
        layer_projections(np.zeros((0, 2, 3)))

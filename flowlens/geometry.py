"""Residual-stream geometry: PCA of residuals across layers, intrinsic dimension, alignment, concentration.

Input everywhere is ``residuals`` of shape ``(N, L, d)``: N prompts, L layers (resid_post of each
layer at one position, usually the last prompt token), width d. Arrays are numpy float64
internally; torch tensors are accepted.

The reference study's two constructions:
- stacked: every (prompt, layer) pair is a row, ``(N*L, d)``; one PCA gives directions shared by
  all layers, and a layer's projection shows how it moves along them with depth.
- concatenated: a prompt's layers side by side, ``(N, d*L)``; a direction is then a set of
  per-layer directions, one chunk of d per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The one stripping of trailing punctuation (all of string.punctuation), the one last_token_residuals uses.
from interp.lm_text import strip_trailing_punctuation  # noqa: F401 (re-exported)

CONSTRUCTIONS = ("stacked", "concatenated")
# Above this width the full SVD of scikit-learn is replaced by torch's randomized low-rank SVD.
LOW_RANK_WIDTH = 4096


def as_residual_array(residuals) -> np.ndarray:
    """``(N, L, d)`` float64 numpy array, with a clear error for anything else."""
    if hasattr(residuals, "detach"):
        residuals = residuals.detach().float().cpu().numpy()
    array = np.asarray(residuals, dtype=np.float64)
    if array.ndim != 3:
        raise ValueError(f"residuals must have shape (N, L, d), got {array.shape}")
    if array.shape[0] == 0:
        raise ValueError("residuals hold no prompts (N = 0)")
    if not np.isfinite(array).all():
        raise ValueError("residuals contain NaN or infinite values")
    return array


def stacked(residuals) -> np.ndarray:
    """``(N, L, d)`` -> ``(N*L, d)``; row ``n*L + l`` is prompt n at layer l."""
    array = as_residual_array(residuals)
    return array.reshape(-1, array.shape[2])


def concatenated(residuals) -> np.ndarray:
    """``(N, L, d)`` -> ``(N, L*d)``; columns ``l*d:(l+1)*d`` are layer l."""
    array = as_residual_array(residuals)
    return array.reshape(array.shape[0], -1)


def normalised_depth(n_layers: int) -> np.ndarray:
    """``l / (L - 1)`` for l = 0..L-1 (a single layer sits at depth 0)."""
    if n_layers == 1:
        return np.zeros(1)
    return np.arange(n_layers) / (n_layers - 1)


def twonn_dimension(points: np.ndarray, discard_fraction: float = 0.1) -> float:
    """TwoNN intrinsic dimension (Facco et al. 2017) of ``points`` ``(n, D)``.

    mu = r2 / r1 (distances to the second and first neighbour) follows a Pareto law with
    exponent d; d is the slope through the origin of -log(1 - F(mu)) against log(mu), fitted after
    discarding the largest ``discard_fraction`` of mu (they are noisy). Duplicate points are dropped.
    """
    from sklearn.neighbors import NearestNeighbors

    points = np.unique(np.asarray(points, dtype=np.float64), axis=0)
    if len(points) < 3:
        raise ValueError(f"TwoNN needs at least 3 distinct points, got {len(points)}")
    distances, _ = NearestNeighbors(n_neighbors=3).fit(points).kneighbors(points)
    r1, r2 = distances[:, 1], distances[:, 2]
    mu = np.sort(r2[r1 > 0] / r1[r1 > 0])
    n = len(mu)
    keep = max(2, int(math.floor(n * (1 - discard_fraction))))
    x = np.log(mu[:keep])
    y = -np.log(1 - np.arange(1, keep + 1) / n)
    denominator = float(x @ x)
    if denominator == 0:
        raise ValueError("TwoNN is undefined: all neighbour-distance ratios are 1")
    return float(x @ y / denominator)


@dataclass
class PCAFit:
    """A mean-centred PCA: ``components`` ``(k, D)`` (unit rows), ``mean`` ``(D,)``."""

    mean: np.ndarray
    components: np.ndarray
    explained_variance: np.ndarray
    explained_variance_ratio: np.ndarray
    method: str

    @property
    def n_components(self) -> int:
        return self.components.shape[0]

    def transform(self, rows: np.ndarray) -> np.ndarray:
        """``(n, D)`` -> ``(n, k)`` coordinates along the principal directions."""
        return (np.asarray(rows, dtype=np.float64) - self.mean) @ self.components.T


def fit_pca(matrix: np.ndarray, n_components: int | str = 3, method: str = "auto", seed: int = 0) -> PCAFit:
    """Mean-centred PCA of ``matrix`` ``(n, D)``.

    ``n_components``: an int, or ``"twonn"`` for the rounded TwoNN intrinsic dimension. ``method``:
    ``"sklearn"`` (exact), ``"lowrank"`` (torch.svd_lowrank, for large D) or ``"auto"``.
    Signs are fixed so that each direction's largest-magnitude loading is positive.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    n, width = matrix.shape
    if n < 2:
        raise ValueError(f"PCA needs at least 2 rows, got {n}")
    if n_components == "twonn":
        n_components = max(1, int(round(twonn_dimension(matrix))))
    if not isinstance(n_components, (int, np.integer)) or n_components < 1:
        raise ValueError(f"n_components must be a positive int or 'twonn', got {n_components!r}")
    n_components = int(min(n_components, n - 1, width)) or 1
    if method == "auto":
        method = "lowrank" if width > LOW_RANK_WIDTH else "sklearn"
    mean = matrix.mean(axis=0)
    centred = matrix - mean
    total_variance = float((centred ** 2).sum() / (n - 1))
    if method == "sklearn":
        from sklearn.decomposition import PCA

        # Exact either way; the covariance eigenproblem (d x d) is much faster when rows outnumber columns.
        solver = "covariance_eigh" if n >= width else "full"
        pca = PCA(n_components=n_components, svd_solver=solver).fit(matrix)
        components, variance = pca.components_, pca.explained_variance_
    elif method == "lowrank":
        import torch

        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)  # svd_lowrank draws a random projection; keep results reproducible
        try:
            _, singular, vectors = torch.svd_lowrank(torch.from_numpy(centred), q=min(n_components + 10, n, width),
                                                     niter=4)
        finally:
            torch.random.set_rng_state(generator_state)
        components = vectors[:, :n_components].T.numpy()
        variance = (singular[:n_components].numpy() ** 2) / (n - 1)
    else:
        raise ValueError(f"method must be 'auto', 'sklearn' or 'lowrank', got {method!r}")
    components = np.array(components, dtype=np.float64)
    signs = np.sign(components[np.arange(len(components)), np.abs(components).argmax(axis=1)])
    components *= np.where(signs == 0, 1.0, signs)[:, None]
    ratio = variance / total_variance if total_variance > 0 else np.zeros_like(variance)
    return PCAFit(mean=mean, components=components, explained_variance=np.asarray(variance, dtype=np.float64),
                  explained_variance_ratio=np.asarray(ratio, dtype=np.float64), method=method)


@dataclass
class LayerProjections:
    """Coordinates of every prompt at every layer along the principal directions.

    ``projections`` ``(N, L, k)``; ``depth`` ``(L,)`` is l / (L-1).
    """

    construction: str
    pca: PCAFit
    projections: np.ndarray
    depth: np.ndarray

    def mean_by_layer(self) -> np.ndarray:
        """``(L, k)`` mean coordinate per layer: the trajectory of the stream through depth."""
        return self.projections.mean(axis=0)


def layer_projections(residuals, construction: str = "stacked", n_components: int | str = 3,
                      method: str = "auto") -> LayerProjections:
    """Fit PCA on one construction and project each layer onto its principal directions."""
    array = as_residual_array(residuals)
    n, n_layers, width = array.shape
    if construction == "stacked":
        pca = fit_pca(stacked(array), n_components, method)
        projections = pca.transform(stacked(array)).reshape(n, n_layers, -1)
    elif construction == "concatenated":
        pca = fit_pca(concatenated(array), n_components, method)
        # A concatenated direction splits into per-layer chunks; layer l's coordinate is its share.
        chunks = pca.components.reshape(pca.n_components, n_layers, width)
        centred = array - pca.mean.reshape(n_layers, width)
        projections = np.einsum("nld,kld->nlk", centred, chunks)
    else:
        raise ValueError(f"construction must be one of {CONSTRUCTIONS}, got {construction!r}")
    return LayerProjections(construction, pca, projections, normalised_depth(n_layers))


def per_layer_directions(residuals, n_components: int = 3) -> np.ndarray:
    """``(L, k, d)``: the top-k principal directions of each layer's ``(N, d)`` residuals."""
    array = as_residual_array(residuals)
    return np.stack([fit_pca(array[:, layer], n_components, "sklearn" if array.shape[2] <= LOW_RANK_WIDTH
                             else "lowrank").components for layer in range(array.shape[1])])


def structural_alignment(residuals, reference_residuals, n_components: int = 3) -> dict:
    """|cosine| between a model's j-th principal direction and a reference model's, layer by layer.

    Both are ``(N, L, d)`` residuals of the same prompts. When the layer counts differ, each layer
    is paired with the reference layer nearest in normalised depth. Widths must agree (a cosine
    between directions of different spaces means nothing). Returns ``score`` ``(L, k)``, ``depth``
    ``(L,)`` and ``reference_layer`` ``(L,)``.
    """
    model, reference = as_residual_array(residuals), as_residual_array(reference_residuals)
    if model.shape[2] != reference.shape[2]:
        raise ValueError(f"the reference model has width {reference.shape[2]} but the model has width "
                         f"{model.shape[2]}: alignment needs residuals of the same width")
    if model.shape[0] != reference.shape[0]:
        raise ValueError(f"alignment needs the same prompts: {model.shape[0]} against {reference.shape[0]}")
    k = min(n_components, model.shape[0] - 1, model.shape[2])
    depth, reference_depth = normalised_depth(model.shape[1]), normalised_depth(reference.shape[1])
    paired = np.abs(depth[:, None] - reference_depth[None, :]).argmin(axis=1)
    directions = per_layer_directions(model, k)
    reference_directions = per_layer_directions(reference, k)
    score = np.abs(np.einsum("lkd,lkd->lk", directions, reference_directions[paired]))
    return {"score": score, "depth": depth, "reference_layer": paired}


def pc1_stability(residuals, residuals_stripped, construction: str = "stacked") -> dict:
    """Pearson correlation of PC1 projections with and without trailing punctuation.

    PCA is fitted on the original residuals; both sets are projected onto the same PC1 and the
    N projections are correlated at each layer (``per_layer`` ``(L,)``) and over all rows (``overall``).
    A layer where all projections are equal gets NaN.
    """
    original, stripped = as_residual_array(residuals), as_residual_array(residuals_stripped)
    if original.shape != stripped.shape:
        raise ValueError(f"residual shapes differ: {original.shape} and {stripped.shape}")
    fit = layer_projections(original, construction, 1)
    if construction == "stacked":
        other = fit.pca.transform(stacked(stripped)).reshape(original.shape[0], original.shape[1])
    else:
        chunks = fit.pca.components.reshape(1, original.shape[1], original.shape[2])
        other = np.einsum("nld,kld->nlk", stripped - fit.pca.mean.reshape(original.shape[1:]), chunks)[..., 0]
    first = fit.projections[..., 0]

    def correlation(a: np.ndarray, b: np.ndarray) -> float:
        if a.std() == 0 or b.std() == 0:
            return float("nan")
        return float(np.corrcoef(a, b)[0, 1])

    per_layer = np.array([correlation(first[:, l], other[:, l]) for l in range(original.shape[1])])
    return {"per_layer": per_layer, "overall": correlation(first.ravel(), other.ravel()),
            "depth": normalised_depth(original.shape[1])}


def energy_spectrum(rows: np.ndarray) -> np.ndarray:
    """Squared singular values (descending) of the mean-centred ``(n, d)`` rows."""
    rows = np.asarray(rows, dtype=np.float64)
    centred = rows - rows.mean(axis=0)
    # s_j^2 are the eigenvalues of the smaller Gram matrix: cheaper than an SVD of the rows.
    gram = centred @ centred.T if centred.shape[0] <= centred.shape[1] else centred.T @ centred
    return np.clip(np.linalg.eigvalsh(gram)[::-1], 0.0, None)


def concentration_from_spectrum(energy: np.ndarray, k: int) -> dict:
    """Top-k energy ratio, participation ratio and effective rank of one energy spectrum.

    - top-k energy ratio: sum of the k largest s_j^2 over sum of all s_j^2;
    - participation ratio: (sum s_j^2)^2 / sum s_j^4 (from 1 for one direction to d for isotropy);
    - effective rank (Roy and Vetterli 2007): exp of the entropy of p_j = s_j / sum s_j.
    An all-zero spectrum (constant residuals) gives ratio 0, participation 0, effective rank 0.
    """
    energy = np.clip(np.asarray(energy, dtype=np.float64), 0.0, None)
    total = energy.sum()
    if total <= 0:
        return {"top_k_energy": 0.0, "participation_ratio": 0.0, "effective_rank": 0.0}
    singular = np.sqrt(energy)
    p = singular / singular.sum()
    p = p[p > 0]
    return {"top_k_energy": float(np.sort(energy)[::-1][:k].sum() / total),
            "participation_ratio": float(total ** 2 / (energy ** 2).sum()),
            "effective_rank": float(np.exp(-(p * np.log(p)).sum()))}


def concentration_by_layer(residuals, k: int = 3) -> dict:
    """Variance-concentration statistics of each layer's ``(N, d)`` residuals.

    Returns lists of length L: ``top_k_energy``, ``participation_ratio``, ``effective_rank``,
    plus ``depth`` and ``k``.
    """
    array = as_residual_array(residuals)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    stats = [concentration_from_spectrum(energy_spectrum(array[:, layer]), k) for layer in range(array.shape[1])]
    out = {key: [s[key] for s in stats] for key in ("top_k_energy", "participation_ratio", "effective_rank")}
    out["depth"] = normalised_depth(array.shape[1]).tolist()
    out["k"] = k
    return out

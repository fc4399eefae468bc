"""What a block's updates and its SAE's features say about a world's ground truth.

Targets: the attribute values of the objects in a world's grid cells (`cell_targets`) and the background at each
block position (`background_targets`). Block probes, with no SAE (the SAE report and `saes probe`): how well a
linear probe reads each attribute from a cell's mean update (`cell_probe_accuracy`), the dimensions a block spends
on it (`value_mean_dims`), the best one linear direction's AUROC (`direction_ceiling`) and how far a value's mean
lies from mixtures of the others' (`mixture_distances`). Feature labels: each SAE feature's AUROC for every
attribute value (`attribute_aurocs`, `auroc_matrix`) and a block's feature cards (`analyse_block`):

    frequency        share of block positions where the feature fires (latent > 0)
    mean_activation  mean latent where it fires: the natural unit of edit strength
    top_images       the images with the largest activation (max over positions), each with
                     its heatmap (height, width) at the block's resolution
    label            on a world with ground truth, the attribute value the feature's activation
                     predicts best, by AUROC: per occupied grid cell for object attributes,
                     per block position for the background (see `attribute_aurocs`)
    firing_by_value  per value of that attribute, the share of its objects the feature fires
                     on (a colour feature that also fires on every orange object says so)

The world's layout (its grid cells, their boxes, the objects' masks) comes from its
`interp.ground_truth.GroundTruth` (`truth=`; for a pool, the world its prompts are captions of).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .sae import SAE


@dataclass
class AnalysisConfig:
    """How features are analysed; plain values, saved with the results."""

    n_top_images: int = 6
    label_min_auroc: float = 0.7   # below this a feature's best attribute value is recorded but not its label
    background_max_coverage: float = 0.05  # a position is background when objects cover less than this of it
    html_max_features: int = 256   # cards on the HTML page (live features, labelled and best first)
    html_images_per_card: int = 4

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- targets

class BlockGridError(ValueError):
    """A block whose grid is too coarse for the world's cells: some cell holds none of its positions."""


def check_block_grid(block: str, height: int, width: int, truth) -> None:
    """A BlockGridError, in one line, unless every grid cell of the world holds at least one of the block's
    positions (a 2 x 2 block against the shapes world's 3 x 3 cells: the middle row and column hold none, so no
    cell statistic, probe or label can be read there)."""
    empty = []
    for cell in truth.cells:
        rows, cols = _cell_rows_cols(cell, height, width, truth)
        if rows.stop <= rows.start or cols.stop <= cols.start:
            empty.append(cell)
    if empty:
        raise BlockGridError(f"{block} is a {height} x {width} grid, too coarse for the world's {len(truth.cells)} "
                             f"cells ({len(empty)} of them, e.g. {empty[0]!r}, hold no position of it): no cell "
                             f"statistic or label can be read there; analyse a block with a finer grid")


def _cell_rows_cols(cell: str, height: int, width: int, truth) -> tuple[slice, slice]:
    """The block positions (rows, columns) inside a grid cell: the world's `cell_box` at the block's size."""
    _, y0, _, y1 = truth.cell_box(cell, height)
    x0, _, x1, _ = truth.cell_box(cell, width)
    return slice(y0, y1), slice(x0, x1)


def _object_coverage(scene, height: int, width: int, truth) -> np.ndarray:
    """(height, width): share of each block position's pixels covered by the scene's objects."""
    mask = truth.foreground_mask(scene, truth.image_size).astype(np.float32)
    pooled = torch.nn.functional.adaptive_avg_pool2d(torch.from_numpy(mask)[None, None], (height, width))
    return pooled[0, 0].numpy()


def _object_names(truth) -> list[tuple[str, str]]:
    """Every (attribute, value) an object of the world can have (its attribute values less the background)."""
    return [n for n in truth.attribute_values() if n[0] != "background"]


def cell_targets(scenes: list, *, truth) -> tuple[list[tuple[str, str]], np.ndarray, np.ndarray]:
    """Object attributes per occupied grid cell.

    scenes: one scene of the world `truth` (a `GroundTruth`) per image (None: the image takes no
    part). Returns (names, targets, occupied): occupied (n_images * len(truth.cells),) bool marks
    the cells holding an object, cells ordered (image, `truth.cells`); targets (T, occupied.sum())
    bool: the object in that cell has names[t] = (attribute, value). Only occupied cells take part,
    so that a feature firing on every object ("something is here") does not pass for a colour or
    shape detector.
    """
    cells = list(truth.cells)
    names = _object_names(truth)
    attributes = list(dict.fromkeys(a for a, _ in names))
    index = {name: t for t, name in enumerate(names)}
    targets = np.zeros((len(names), len(scenes), len(cells)), dtype=bool)
    occupied = np.zeros((len(scenes), len(cells)), dtype=bool)
    for i, scene in enumerate(scenes):
        for obj in (scene.objects if scene is not None else ()):
            cell = cells.index(obj.position)
            occupied[i, cell] = True
            for attribute in attributes:
                targets[index[(attribute, getattr(obj, attribute))], i, cell] = True
    occupied = occupied.reshape(-1)
    return names, targets.reshape(len(names), -1)[:, occupied], occupied


def background_targets(scenes: list, height: int, width: int, max_coverage: float = 0.05, *,
                       truth) -> tuple[list[tuple[str, str]], np.ndarray]:
    """The background per block position: targets (T, n_images * height * width) bool, positions
    ordered (image, row, column); positive when the position lies outside every object
    (object coverage below `max_coverage`, the world's `foreground_mask`) of an image with that
    background."""
    names = [n for n in truth.attribute_values() if n[0] == "background"]
    index = {name: t for t, name in enumerate(names)}
    targets = np.zeros((len(names), len(scenes), height, width), dtype=bool)
    for i, scene in enumerate(scenes):
        if scene is not None:
            coverage = _object_coverage(scene, height, width, truth)
            targets[index[("background", scene.background)], i] = coverage < max_coverage
    return names, targets.reshape(len(names), -1)


def _per_cell(values: torch.Tensor, reduce: str, truth) -> torch.Tensor:
    """values (images, height, width, features) -> (images * cells, features): each grid cell's `reduce`
    ("amax" or "mean") over its block positions (the world's `cell_box` at the block's size)."""
    n, h, w, f = values.shape
    check_block_grid("the block", h, w, truth)
    cells = []
    for cell in truth.cells:
        rows, cols = _cell_rows_cols(cell, h, w, truth)
        cells.append(getattr(values[:, rows, cols], reduce)(dim=(1, 2)))  # (images, features)
    return torch.stack(cells, dim=1).reshape(n * len(truth.cells), f)


def cell_maxima(latents: torch.Tensor, *, truth) -> torch.Tensor:
    """latents (images, height, width, features) -> (images * cells, features): each cell's largest activation."""
    return _per_cell(latents, "amax", truth)


def cell_means(updates: torch.Tensor, *, truth) -> torch.Tensor:
    """updates (images, channels, height, width) -> (images * cells, channels): each grid cell's mean update."""
    return _per_cell(updates.permute(0, 2, 3, 1).float(), "mean", truth)


def cell_probe_accuracy(updates: torch.Tensor, scenes: list, attributes: Sequence[str] | None = None,
                        seed: int = 0, *, truth) -> dict[str, dict]:
    """How well a block's update codes each object attribute, independently of any SAE: a multinomial
    logistic regression from an occupied grid cell's mean update (standardised) to the attribute of its
    object, fitted on half of the cells and scored on the other half (image-disjoint halves).
    truth: the scenes' world (`GroundTruth`); attributes: default its object attributes.

    Returns {attribute: {"accuracy", "chance" (the majority value's share), "n_test"}}."""
    attributes = truth.object_attributes if attributes is None else attributes
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    names, targets, occupied = cell_targets(scenes, truth=truth)
    features = cell_means(updates, truth=truth).numpy()[occupied]
    image_of_cell = np.repeat(np.arange(len(scenes)), len(truth.cells))[occupied]
    order = np.random.default_rng(seed).permutation(len(scenes))
    train_images = set(order[: len(scenes) // 2].tolist())
    train = np.array([i in train_images for i in image_of_cell])
    if train.all() or not train.any():
        raise ValueError("probing needs objects in at least two images")
    results = {}
    for attribute in attributes:
        rows = [t for t, (a, _) in enumerate(names) if a == attribute]
        labels = np.argmax(targets[rows], axis=0)
        if len(np.unique(labels[train])) < 2:
            continue
        probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
        probe.fit(features[train], labels[train])
        test_labels = labels[~train]
        results[attribute] = {"accuracy": float(probe.score(features[~train], test_labels)),
                              "chance": float(np.bincount(test_labels).max() / len(test_labels)),
                              "n_test": int(len(test_labels)),
                              "dims": value_mean_dims(features, targets[rows])}
    return results


def value_mean_dims(features: np.ndarray, targets: np.ndarray) -> float:
    """How many dimensions a block spends on an attribute: the participation ratio
    (sum s^2)^2 / sum s^4 of the singular values s of the attribute's centred value means
    (features (cells, channels) in the block's own units; targets (values, cells) bool).

    At most values - 1. Values on a plane give about 2: e.g. colours coded as a hue circle, where
    neighbouring colours share directions and an SAE tends to learn a few colour channels rather
    than one feature per colour."""
    means = np.stack([features[t].mean(0) for t in targets if t.any()])
    squares = np.linalg.svd(means - means.mean(0), compute_uv=False) ** 2
    return float(squares.sum() ** 2 / (squares ** 2).sum()) if squares.sum() > 0 else 0.0


def object_vectors(updates: torch.Tensor, scenes: list, min_coverage: float = 0.6, *,
                   truth) -> tuple[np.ndarray, list]:
    """Each object's mean update over the block positions it covers at least `min_coverage` (its interior,
    the world's `object_mask`): (vectors (objects, channels), objects), objects in scene order; an object too
    small to cover any position fully enough is left out."""
    n, c, h, w = updates.shape
    vectors, objects = [], []
    for i, scene in enumerate(scenes):
        for obj in (scene.objects if scene is not None else ()):
            mask = torch.from_numpy(truth.object_mask(obj, truth.image_size).astype(np.float32))[None, None]
            inside = torch.nn.functional.adaptive_avg_pool2d(mask, (h, w))[0, 0] >= min_coverage
            if inside.any():
                vectors.append(updates[i][:, inside].float().mean(1).numpy())
                objects.append(obj)
    return (np.stack(vectors) if vectors else np.zeros((0, c), np.float32)), objects


def mixture_distances(updates: torch.Tensor, scenes: list, attributes: Sequence[str] | None = None,
                      min_coverage: float = 0.6, *, truth) -> dict[str, float]:
    """`value_mixture_distances` of each attribute over the objects' interior vectors (`object_vectors`):
    {"attribute=value": distance}. truth: the scenes' world (`GroundTruth`); attributes: default its key
    attributes."""
    attributes = truth.key_attributes if attributes is None else attributes
    vectors, objects = object_vectors(updates, scenes, min_coverage, truth=truth)
    results = {}
    for attribute in attributes:
        values = list(dict.fromkeys(n[1] for n in truth.attribute_values() if n[0] == attribute))
        targets = np.array([[getattr(o, attribute) == v for o in objects] for v in values]).reshape(len(values), -1)
        for value, d in zip(values, value_mixture_distances(vectors, targets)):
            if np.isfinite(d):
                results[f"{attribute}={value}"] = float(d)
    return results


def value_mixture_distances(features: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """How far each value's mean lies from every mixture of the other values' means: the distance to the
    convex hull of their means, in units of the RMS distance of a row from its own value's mean
    (features (rows, channels), e.g. objects; targets (values, rows) bool; NaN for a value without rows).

    An SAE feature is a ReLU of one direction; a value whose mean is a mixture of others' (distance near 0,
    e.g. an orange halfway between red and yellow in a block that renders colour as RGB) is reconstructed
    from their features and gets none of its own. Being extreme is necessary, not sufficient: the toy's
    labelled colours lie 0.38-1.04 away, but so do some colours that its SAEs code with shared channels."""
    from scipy.optimize import nnls

    present = np.array([t.any() for t in targets])
    means = np.stack([features[t].mean(0) if t.any() else np.zeros(features.shape[1]) for t in targets])
    spread = np.sqrt(np.mean([((features[t] - m) ** 2).sum(1).mean() for t, m in zip(targets, means) if t.any()]))
    weight = 1e3 * max(np.abs(means).max(), 1e-12)  # holds sum(w) = 1 in the least-squares problem below
    out = np.full(len(targets), np.nan)
    for v in np.flatnonzero(present):
        others = means[present & (np.arange(len(targets)) != v)]
        if len(others) == 0:
            continue
        # min ||m_v - w @ others|| over w >= 0, sum w = 1: nnls with the sum held by a heavily weighted row
        w, _ = nnls(np.vstack([others.T, weight * np.ones(len(others))]), np.append(means[v], weight))
        out[v] = np.linalg.norm(means[v] - w @ others) / spread if spread > 0 else np.nan
    return out


def direction_ceiling(updates: torch.Tensor, scenes: list, attributes: Sequence[str] | None = None, seed: int = 0,
                      background_max_coverage: float = 0.05, min_coverage: float = 0.3,
                      max_positions: int = 50_000, *, truth) -> dict[str, float]:
    """The best AUROC one linear feature of this block can reach for each attribute value, scored
    exactly as the feature labels are (largest activation in each occupied grid cell, see
    `attribute_aurocs`): a one-vs-rest logistic regression (standardised) fitted on the block
    positions of half of the images (positions covered at least `min_coverage` by an object carry
    its value, background positions are negatives; at most `max_positions` of them, drawn at random,
    which bounds the cost on SDXL-size blocks), scored on the other half. An SAE feature is
    one direction read through a ReLU, so this is the ceiling of its label; a gap says the SAE did
    not learn the direction, not that the block lacks it. truth: the scenes' world (`GroundTruth`);
    attributes: default its key attributes.

    Returns {"attribute=value": held-out AUROC}."""
    attributes = truth.key_attributes if attributes is None else attributes
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    n, c, h, w = updates.shape
    positions = updates.permute(0, 2, 3, 1).float()                      # (N, h, w, C)
    order = np.random.default_rng(seed).permutation(n)
    train_images = np.zeros(n, bool)
    train_images[order[: n // 2]] = True
    if train_images.all() or not train_images.any():
        raise ValueError("the direction ceiling needs at least two images")
    names, targets, occupied = cell_targets(scenes, truth=truth)
    vectors, values = [], {attribute: [] for attribute in attributes}
    for i in np.flatnonzero(train_images):
        scene = scenes[i]
        if scene is None:
            continue
        owner = np.full((h, w), -1)
        best = np.zeros((h, w), np.float32)
        for j, obj in enumerate(scene.objects):
            mask = torch.from_numpy(truth.object_mask(obj, truth.image_size).astype(np.float32))[None, None]
            coverage = torch.nn.functional.adaptive_avg_pool2d(mask, (h, w))[0, 0].numpy()
            owner[coverage > best] = j
            best = np.maximum(best, coverage)
        keep = (best >= min_coverage) | (_object_coverage(scene, h, w, truth) < background_max_coverage)
        vectors.append(positions[i][torch.from_numpy(keep)].numpy())
        for attribute in attributes:
            labels = [getattr(scene.objects[o], attribute) if b >= min_coverage else None
                      for o, b in zip(owner[keep].tolist(), best[keep].tolist())]
            values[attribute] += labels
    X = np.concatenate(vectors)
    values = {attribute: np.array(labels, dtype=object) for attribute, labels in values.items()}
    if len(X) > max_positions:
        chosen = np.sort(np.random.default_rng(seed).choice(len(X), max_positions, replace=False))
        X, values = X[chosen], {attribute: labels[chosen] for attribute, labels in values.items()}
    scaler = StandardScaler().fit(X)
    test_cells = np.repeat(~train_images, len(truth.cells))[occupied]
    results = {}
    for t, (attribute, value) in enumerate(names):
        if attribute not in attributes:
            continue
        y = values[attribute] == value
        target = targets[t][test_cells]
        if y.all() or not y.any() or target.all() or not target.any():
            continue
        probe = LogisticRegression(max_iter=2000).fit(scaler.transform(X), y)
        direction = torch.from_numpy((probe.coef_[0] / scaler.scale_).astype(np.float32))
        scores = _per_cell((positions @ direction)[..., None], "amax", truth).numpy()[occupied][test_cells]
        results[f"{attribute}={value}"] = float(auroc_matrix(scores, target[None])[0, 0])
    return results


def attribute_aurocs(latents: torch.Tensor, scenes: list, background_max_coverage: float = 0.05, *,
                     truth) -> tuple[list[tuple[str, str]], np.ndarray, list]:
    """AUROC of every feature for every attribute value of the scenes' world `truth` (a `GroundTruth`).

    Object attributes are judged per occupied grid cell (the feature's largest activation in
    the cell against "the object in this cell has that value"), so a feature that fires on
    the object, wherever in its cell, scores as high as one that covers the whole cell; the
    background per block position (outside the objects). latents: (images, h, w, features).
    Returns (names, auroc (T, features), scorer) where scorer[t] = (scores (units, F), target (units,)).
    """
    n, h, w, f = latents.shape
    object_names, object_targets, occupied = cell_targets(scenes, truth=truth)
    back_names, back_targets = background_targets(scenes, h, w, background_max_coverage, truth=truth)
    cell_scores = cell_maxima(latents, truth=truth).numpy()[occupied]
    position_scores = latents.reshape(-1, f).numpy()
    auroc = np.concatenate([auroc_matrix(cell_scores, object_targets), auroc_matrix(position_scores, back_targets)])
    scorer = [(cell_scores, t) for t in object_targets] + [(position_scores, t) for t in back_targets]
    return object_names + back_names, auroc, scorer


def auroc_matrix(activations: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """AUROC of every feature for every target, at once (Mann-Whitney U with tied ranks averaged).

    activations: (positions, features); targets: (T, positions) bool.
    Returns (T, features); NaN where a target has no positives or no negatives.
    Equal to sklearn.metrics.roc_auc_score(targets[t], activations[:, f]) for each pair.
    """
    from scipy.stats import rankdata

    ranks = rankdata(activations, axis=0).astype(np.float64)  # (P, F), ties get their average rank
    positives = targets.sum(axis=1).astype(np.float64)        # (T,)
    negatives = targets.shape[1] - positives
    rank_sums = targets.astype(np.float64) @ ranks              # (T, F)
    with np.errstate(invalid="ignore", divide="ignore"):
        auroc = (rank_sums - positives[:, None] * (positives[:, None] + 1) / 2) / (positives * negatives)[:, None]
    auroc[(positives == 0) | (negatives == 0)] = np.nan
    return auroc


# ----------------------------------------------------------------------------- analysis

@torch.no_grad()
def encode_positions(sae: SAE, updates: torch.Tensor, batch_size: int = 8192) -> torch.Tensor:
    """updates (images, channels, height, width) -> latents (images, height, width, features)."""
    n, c, h, w = updates.shape
    if c != sae.cfg.d_in:
        raise ValueError(f"the block has {c} channels but the SAE reads {sae.cfg.d_in}")
    vectors = updates.permute(0, 2, 3, 1).reshape(-1, c).float()
    if not torch.isfinite(vectors).all():
        raise ValueError("the block updates contain NaN or Inf values")
    latents = torch.cat([sae.encode(vectors[i:i + batch_size].to(sae.W_enc.dtype)).float()
                         for i in range(0, len(vectors), batch_size)])
    return latents.reshape(n, h, w, -1)


def analyse_block(sae: SAE, updates: torch.Tensor, scenes: list | None = None,
                  config: AnalysisConfig | None = None, *, truth=None) -> tuple[list[dict], dict]:
    """Feature cards of one block and the per-attribute-value summary.

    updates: (images, channels, height, width), one per image of the pool (the last
    denoising step's update). scenes: the pool's scenes (None entries for captions outside
    the world), or None to skip labelling; truth: their world (`GroundTruth`, `AnalysisPool.truth`),
    needed when there are scenes.
    Returns (cards ordered by feature id, summary {"attribute=value": {...}}).
    """
    config = config or AnalysisConfig()
    latents = encode_positions(sae, updates)             # (N, h, w, F)
    n, h, w, n_features = latents.shape
    flat = latents.reshape(-1, n_features)                # (P, F)
    firing = flat > 0
    fire_counts = firing.sum(0)
    frequency = (fire_counts.double() / flat.shape[0]).tolist()
    mean_activation = (flat.sum(0).double() / fire_counts.clamp_min(1)).tolist()
    per_image_max = latents.amax(dim=(1, 2))              # (N, F)
    n_top = min(config.n_top_images, n)
    top_values, top_images = per_image_max.topk(n_top, dim=0)  # (n_top, F)

    auroc = names = None
    labelled = scenes is not None and any(s is not None for s in scenes)
    if labelled:
        if truth is None:
            raise ValueError("labelling features needs the scenes' world (truth=, e.g. AnalysisPool.truth())")
        names, auroc, scorer = attribute_aurocs(latents, scenes, config.background_max_coverage, truth=truth)
        usable = ~np.isnan(auroc).all(axis=1)
    cards = []
    for f in range(n_features):
        card = {"id": f, "frequency": float(frequency[f]), "mean_activation": float(mean_activation[f]),
                "label": None, "attribute": None, "value": None, "auroc": None, "top_images": []}
        for value, image in zip(top_values[:, f].tolist(), top_images[:, f].tolist()):
            if value <= 0:
                break
            card["top_images"].append({"index": int(image), "activation": float(value),
                                       "heatmap": latents[image, :, :, f].tolist()})
        if labelled and fire_counts[f] > 0:
            column = np.where(usable, auroc[:, f], -np.inf)
            best = int(np.argmax(column))
            attribute, value = names[best]
            scores, target = scorer[best]
            card.update(attribute=attribute, value=value, auroc=_sklearn_auroc(target, scores[:, f]))
            # what else it fires on: per value of its attribute, the share of that value's objects
            # (background: positions) where the feature fires
            card["firing_by_value"] = {names[t][1]: float((scorer[t][0][scorer[t][1], f] > 0).mean())
                                       for t in range(len(names)) if names[t][0] == attribute and usable[t]}
            if card["auroc"] >= config.label_min_auroc:
                card["label"] = f"{attribute}={value}"
        cards.append(card)

    summary = {}
    if labelled:
        for t, (attribute, value) in enumerate(names):
            if not usable[t]:
                continue
            label = f"{attribute}={value}"
            column = np.where(fire_counts.numpy() > 0, auroc[t], -np.inf)
            best = int(np.argmax(column))
            own = [c for c in cards if c["label"] == label]
            best_own = max(own, key=lambda c: c["auroc"], default=None)
            summary[label] = {
                "attribute": attribute, "value": value,
                "best_feature": best, "best_auroc": float(auroc[t, best]),
                "best_feature_label": cards[best]["label"],
                "labelled_features": len(own),
                "best_labelled_feature": best_own["id"] if best_own else None,
                "best_labelled_auroc": best_own["auroc"] if best_own else None,
            }
    return cards, summary


def _sklearn_auroc(target: np.ndarray, scores: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(target, scores))

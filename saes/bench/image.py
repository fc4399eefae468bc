"""Image SAEBench: SAEBench's questions asked of SAEs on a text-to-image denoiser's block updates, scored against a
world's ground truth where the model has one (issue 44).

Every eval is a pure function of data (block updates, scenes, an SAE) returning ``(metrics, details)``: plain
numbers for the table, and what they were computed from. The generation-driven ones (reconstruction, unlearning,
editing) take the model. Per block and SAE:

image_reconstruction  (any family; no truth needed) EV, L0, dead latents on the block's updates, and *denoising
                      loss recovered*, the analogue of SAEBench's CE loss recovered: with the SAE spliced into the
                      block's update during generation (no error term), 1 - d(spliced) / d(zero), d = the mean squared
                      distance to the clean run, at the denoiser's output (every call) and at the final latent; the
                      zero run has the block's update ablated. A perfect splice scores 1, a splice of nothing 0.
                      With a world: the probe's accuracy on images generated with the splice and without.
image_sparse_probing  (truth) SAEBench's sparse probing on the world's object attributes: each object's latents
                      pooled over its region (coverage-weighted mean at the block's resolution), one-vs-rest
                      balanced binary tasks per attribute value, the k latents of largest |mean difference| on the
                      training images, a logistic probe; test accuracy (chance 0.5), and the same probe on the raw
                      update's channels (top k and all).
image_localisation    (truth) each labelled feature's (best AUROC >= 0.7, as the feature cards label) share of its
                      activation on the block positions that touch an object with its label (for a background label:
                      positions off every object of images with that background); the positions' share is the base
                      rate of a feature that fires everywhere. Moran's I (rook neighbours) of the unlabelled live
                      features' maps on their top images: high when a feature fires in spatially coherent blobs.
image_absorption      (truth) SAEBench's feature absorption with "first letter" replaced by an attribute value of the
                      world's hierarchy (colour and shape: a colour feature that stops firing where a colour-and-shape
                      feature fires): a logistic probe on the raw pooled update is the ground-truth direction; the
                      main latents come from k-sparse probing (L1 probe ranking, k grown while F1 rises by > 0.03);
                      on the probe's true positives, the absorption fraction and full absorption with SAEBench's
                      thresholds (cosine 0.025 / 0.1, projection share 0.4, at most 3 absorbing latents).
image_unlearning      (truth) SAeUron's protocol scored by the world's probe: the concept's features (top AUROC for
                      attribute=value) scaled by `multiplier` (0: ablated) during generation; unlearning accuracy (the
                      drawn concept objects no longer read with the value), in-domain retention (their other
                      attributes kept), cross-domain retention (images without the concept kept); against a
                      negative prompt under CFG and activation-difference steering (the concept's mean pooled update
                      minus the other values', subtracted at every position).
image_editing         (truth) RIEBench on the block alone: the best success at preservation >= 0.9.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

EVAL_TYPES = ("image_reconstruction", "image_sparse_probing", "image_localisation", "image_absorption",
              "image_unlearning", "image_editing")
TRUTH_EVALS = frozenset(EVAL_TYPES[1:])  # need a world's ground truth; image_reconstruction runs on any model

# bounds of every count a request carries (checked before any work)
LIMITS = {"n_images": (2, 2048), "probe_images": (8, 4096), "unlearn_images": (1, 256),
          "riebench_per_category": (1, 50),
          "batch_size": (1, 512), "max_unlearn_features": (1, 64), "moran_images": (1, 64)}


@dataclass
class ImageBenchConfig:
    """What the image evals run on; plain values, saved with the results."""

    n_images: int = 48              # reconstruction: prompts generated clean / spliced / zero-ablated
    probe_images: int = 400         # sparse probing, localisation, absorption, concept features: the capture pool
    seed: int = 0                   # the prompts' seed (the world's captions) and the image seeds' base
    ks: tuple[int, ...] = (1, 2, 5)
    label_min_auroc: float = 0.7    # a feature is labelled when its best AUROC reaches this (the feature cards')
    moran_images: int = 8           # Moran's I: a feature's top images by activation
    unlearn_attributes: tuple[str, ...] | None = None  # concepts: every value of these (default: key attributes)
    unlearn_images: int = 8         # per concept: prompts with the concept and prompts without
    max_unlearn_features: int = 3   # a concept's features: its top AUROC features (at most this many)
    multiplier: float = 0.0         # their scale during generation (0: ablated; SAeUron uses negative values)
    negative_guidance: float = 5.0  # the negative-prompt baseline's guidance scale
    riebench_per_category: int = 2  # RIEBench tasks per category
    riebench_k: tuple[int, ...] = (1, 5)  # its sweep of k_trans x m (the best at preservation >= 0.9 is kept)
    riebench_m: tuple[float, ...] = (1.0,)
    batch_size: int = 32

    def __post_init__(self):
        for name, (low, high) in LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer from {low} to {high}, not {value!r}")
        self.ks = tuple(int(k) for k in self.ks)
        if not self.ks or any(not 1 <= k <= 64 for k in self.ks):
            raise ValueError(f"ks must be integers from 1 to 64, not {self.ks!r}")
        if not (math.isfinite(self.multiplier) and -10 <= self.multiplier <= 10):
            raise ValueError(f"multiplier must be a number from -10 to 10, not {self.multiplier!r}")
        if not (math.isfinite(self.negative_guidance) and 1 < self.negative_guidance <= 30):
            raise ValueError(f"negative_guidance must be above 1 (CFG) and at most 30, not {self.negative_guidance!r}")
        if not 0.5 <= self.label_min_auroc <= 1:
            raise ValueError(f"label_min_auroc must be from 0.5 to 1, not {self.label_min_auroc!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def require_world(truth, eval_type: str, model_name: str):
    """The world's ground truth, or a ValueError of one line naming the eval and the model."""
    if truth is None:
        from interp.ground_truth import GroundTruthError

        raise GroundTruthError(f"{eval_type} is scored against a world's ground truth; {model_name} has none (only "
                               f"image_reconstruction runs on any model)")
    return truth


# ----------------------------------------------------------------------------- capture and pooling

@dataclass
class BlockPool:
    """The capture pool of one model: each block's last-step update (images, C, h, w) for world prompts."""

    prompts: list[str]
    scenes: list
    truth: object
    updates: dict[str, torch.Tensor] = field(default_factory=dict)


# Work shared by every SAE and eval of one model in a process (`saes bench` runs one SAE and eval at a time):
# (kind, id(model), key) -> (model, value); the model is kept so that a reused id never matches another model.
_SHARED: dict = {}
_SHARED_MAX = 16


def _shared(kind: str, model, key, make):
    entry = _SHARED.get((kind, id(model), key))
    if entry is not None and entry[0] is model:
        return entry[1]
    value = make()
    if len(_SHARED) >= _SHARED_MAX:
        _SHARED.pop(next(iter(_SHARED)))
    _SHARED[(kind, id(model), key)] = (model, value)
    return value


@torch.no_grad()
def capture_pool(model, blocks, prompts: list[str], seeds: list[int], batch_size: int = 32) -> dict[str, torch.Tensor]:
    """Each block's update at the last denoising step (conditional half) for every prompt: {block: (n, C, h, w)};
    computed once per model, blocks, prompts and seeds in a process."""
    key = (tuple(blocks), tuple(prompts), tuple(seeds))
    return _shared("pool", model, key, lambda: _capture_pool(model, blocks, prompts, seeds, batch_size))


def _capture_pool(model, blocks, prompts, seeds, batch_size) -> dict[str, torch.Tensor]:
    from interp.hooks import capture_updates, generate

    parts: dict[str, list] = {b: [] for b in blocks}
    for start in range(0, len(prompts), batch_size):
        chunk, chunk_seeds = prompts[start:start + batch_size], seeds[start:start + batch_size]
        with capture_updates(model, list(blocks), dtype=torch.float32, stop_after_last=True) as cap:
            generate(model, chunk, seed=chunk_seeds, output_type="latent")
        for block in blocks:
            parts[block].append(cap.updates(block)[-1])
    return {block: torch.cat(p) for block, p in parts.items()}


def object_coverages(scenes: list, height: int, width: int, truth) -> tuple[list[tuple[int, object]], np.ndarray]:
    """Every object of the scenes and how much of each block position it covers: (objects as (image, object),
    coverage (objects, height, width) in [0, 1])."""
    objects, maps = [], []
    for i, scene in enumerate(scenes):
        for obj in (scene.objects if scene is not None else ()):
            mask = torch.from_numpy(truth.object_mask(obj, truth.image_size).astype(np.float32))[None, None]
            maps.append(torch.nn.functional.adaptive_avg_pool2d(mask, (height, width))[0, 0].numpy())
            objects.append((i, obj))
    return objects, (np.stack(maps) if maps else np.zeros((0, height, width), np.float32))


def pool_objects(values: torch.Tensor, objects: list, coverage: np.ndarray) -> np.ndarray:
    """values (images, h, w, D) -> (objects, D): each object's coverage-weighted mean over its region."""
    out = np.zeros((len(objects), values.shape[-1]), np.float32)
    for j, ((i, _), cov) in enumerate(zip(objects, coverage)):
        weight = torch.from_numpy(cov).float()
        out[j] = ((values[i] * weight[..., None]).sum((0, 1)) / weight.sum().clamp_min(1e-12)).numpy()
    return out


def object_labels(objects: list, attributes) -> dict[str, np.ndarray]:
    return {a: np.array([getattr(obj, a) for _, obj in objects], dtype=object) for a in attributes}


def image_split(n_images: int, seed: int = 0) -> np.ndarray:
    """(n_images,) bool: the training images (half, at random by seed); the rest are the test images."""
    order = np.random.default_rng(seed).permutation(n_images)
    train = np.zeros(n_images, bool)
    train[order[: n_images // 2]] = True
    return train


# ----------------------------------------------------------------------------- reconstruction

def loss_recovered(clean: torch.Tensor, spliced: torch.Tensor, zero: torch.Tensor) -> float | None:
    """1 - d(spliced, clean) / d(zero, clean), d the mean squared difference: the share of the gap between the
    zero-ablated run and the clean run the splice closes (1: as clean, 0: as ablated, below 0: worse than ablating).
    None when ablating changes nothing (no gap to close)."""
    gap = float(((zero.double() - clean.double()) ** 2).mean())
    if gap == 0:
        return None
    return 1.0 - float(((spliced.double() - clean.double()) ** 2).mean()) / gap


@torch.no_grad()
def _run(model, prompts, seeds, edits, saes, batch_size, images: bool):
    """(denoiser outputs per call, concatenated over prompts; final latents; uint8 images or None)."""
    from interp.hooks import apply_edits, generate
    from interp.hooks.diffusion import capture_denoiser_outputs

    outputs, latents, pictures = [], [], []
    for start in range(0, len(prompts), batch_size):
        chunk, chunk_seeds = prompts[start:start + batch_size], seeds[start:start + batch_size]
        with capture_denoiser_outputs(model) as cap:
            if edits:
                with apply_edits(model, edits, saes=saes):
                    latents.append(torch.as_tensor(generate(model, chunk, seed=chunk_seeds,
                                                            output_type="latent")).float())
            else:
                latents.append(torch.as_tensor(generate(model, chunk, seed=chunk_seeds, output_type="latent")).float())
        outputs.append(torch.stack([o.reshape(o.shape[0], -1) for o in cap.outputs], 1))  # (batch, calls, D)
        if images:
            if edits:
                with apply_edits(model, edits, saes=saes):
                    array = generate(model, chunk, seed=chunk_seeds, output_type="np")
            else:
                array = generate(model, chunk, seed=chunk_seeds, output_type="np")
            pictures.append(np.clip(np.rint(np.asarray(array) * 255), 0, 255).astype(np.uint8))
    return torch.cat(outputs), torch.cat(latents), (np.concatenate(pictures) if images else None)


@torch.no_grad()
def reconstruction_stats(sae, updates: torch.Tensor) -> dict:
    """EV, MSE, L0 and dead / dense latents of the SAE on a block's updates (images, C, h, w)."""
    from saes.evaluate import evaluate

    vectors = updates.permute(0, 2, 3, 1).reshape(-1, updates.shape[1]).float()
    result = evaluate(sae, (vectors[i:i + 8192] for i in range(0, len(vectors), 8192)))
    return {k: result[k] for k in ("explained_variance", "mse", "l0", "dead_fraction", "dense_features", "tokens")}


@torch.no_grad()
def image_reconstruction(model, sae, block: str, prompts: list[str], seeds: list[int], batch_size: int = 32,
                         truth=None, scenes=None, updates: torch.Tensor | None = None) -> tuple[dict, dict]:
    """Denoising loss recovered at the denoiser output and the final latent, EV / L0 / dead on `updates` (when
    given: the block's captured updates), and with `truth` and `scenes` (the prompts' scenes) the world's probe
    accuracy on the images generated with the splice and without."""
    from interp.edits import Edit

    images = truth is not None and scenes is not None
    runs = {"clean": [], "spliced": [Edit(block=block, mode="splice", keep_error=False)],
            "zero": [Edit(block=block, mode="ablate")]}
    out = {name: _run(model, prompts, seeds, edits, {block: sae}, batch_size, images) for name, edits in runs.items()}
    metrics = {"denoiser_loss_recovered": loss_recovered(out["clean"][0], out["spliced"][0], out["zero"][0]),
               "latent_loss_recovered": loss_recovered(out["clean"][1], out["spliced"][1], out["zero"][1])}
    details = {"n_images": len(prompts), "denoiser_calls": int(out["clean"][0].shape[1]),
               "denoiser_mse": {k: float(((v[0] - out["clean"][0]) ** 2).mean()) for k, v in out.items()},
               "latent_mse": {k: float(((v[1] - out["clean"][1]) ** 2).mean()) for k, v in out.items()}}
    if updates is not None:
        metrics.update(reconstruction_stats(sae, updates))
    if images:
        reader = truth.probe()
        for name in runs:
            scores = [reader.score(image, scene) for image, scene in zip(out[name][2], scenes)]
            details[f"probe_{name}"] = {a: float(np.mean([s[a] for s in scores])) for a in scores[0]}
        metrics["probe_accuracy_clean"] = details["probe_clean"]["all"]
        metrics["probe_accuracy_spliced"] = details["probe_spliced"]["all"]
        metrics["probe_accuracy_zero"] = details["probe_zero"]["all"]
    return metrics, details


# ----------------------------------------------------------------------------- sparse probing

def _balanced(indices_pos: np.ndarray, indices_neg: np.ndarray, rng) -> np.ndarray:
    n = min(len(indices_pos), len(indices_neg))
    return np.concatenate([rng.choice(indices_pos, n, replace=False), rng.choice(indices_neg, n, replace=False)])


def _probe_accuracy(x_train, y_train, x_test, y_test) -> float:
    """SAEBench's sklearn probe: L2 logistic regression, C = 1, lbfgs, max_iter 1000, on the raw values."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        probe = LogisticRegression(C=1.0, max_iter=1000).fit(x_train, y_train)
    return float((probe.predict(x_test) == y_test).mean())


def top_mean_diff(x: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """The k columns of largest |mean over positives - mean over negatives| (SAEBench's selection)."""
    diff = np.abs(x[y].mean(0) - x[~y].mean(0))
    return np.argsort(-diff, kind="stable")[:k]


def sparse_probing(sae_x: np.ndarray, raw_x: np.ndarray, labels: dict[str, np.ndarray], train: np.ndarray,
                   ks=(1, 2, 5), seed: int = 0, min_examples: int = 4) -> tuple[dict, dict]:
    """SAEBench's sparse probing on objects: sae_x (objects, d_sae) pooled latents, raw_x (objects, C) pooled
    updates, labels {attribute: (objects,) values}, train (objects,) bool (the training images' objects).

    Per attribute value a balanced one-vs-rest task (negatives drawn to the positives' count, train and test):
    the probe on the top-k columns by |mean difference| (train), and on every column. Returns metrics averaged
    over each attribute's values and then over attributes ({sae,raw_update}_top_{k}_test_accuracy,
    {sae,raw_update}_test_accuracy) and details per attribute and value."""
    rng = np.random.default_rng(seed)
    per_attribute: dict[str, dict] = {}
    for attribute, values in labels.items():
        rows = {}
        for value in dict.fromkeys(values.tolist()):
            y = values == value
            tr_pos, tr_neg = np.flatnonzero(train & y), np.flatnonzero(train & ~y)
            te_pos, te_neg = np.flatnonzero(~train & y), np.flatnonzero(~train & ~y)
            if min(len(tr_pos), len(tr_neg), len(te_pos), len(te_neg)) < min_examples:
                continue
            tr, te = _balanced(tr_pos, tr_neg, rng), _balanced(te_pos, te_neg, rng)
            row = {"n_train": len(tr), "n_test": len(te)}
            for name, x in (("sae", sae_x), ("raw_update", raw_x)):
                for k in ks:
                    cols = top_mean_diff(x[tr], y[tr], min(k, x.shape[1]))
                    row[f"{name}_top_{k}_test_accuracy"] = _probe_accuracy(x[tr][:, cols], y[tr], x[te][:, cols], y[te])
                    if name == "sae":
                        row[f"sae_top_{k}_latents"] = cols.tolist()
                row[f"{name}_test_accuracy"] = _probe_accuracy(x[tr], y[tr], x[te], y[te])
            rows[str(value)] = row
        if rows:
            keys = [k for k in next(iter(rows.values())) if k.endswith("accuracy")]
            per_attribute[attribute] = {"mean": {k: float(np.mean([r[k] for r in rows.values()])) for k in keys},
                                        "values": rows}
    if not per_attribute:
        raise ValueError("sparse probing found no attribute value with enough objects on both sides of the split")
    keys = list(next(iter(per_attribute.values()))["mean"])
    metrics = {k: float(np.mean([p["mean"][k] for p in per_attribute.values()])) for k in keys}
    for attribute, p in per_attribute.items():
        for k in ks:
            metrics[f"sae_top_{k}_test_accuracy_{attribute}"] = p["mean"][f"sae_top_{k}_test_accuracy"]
    return metrics, {"attributes": per_attribute, "n_objects": int(len(sae_x)), "n_train_objects": int(train.sum())}


# ----------------------------------------------------------------------------- localisation

def morans_i(image: np.ndarray) -> float | None:
    """Moran's I of a (h, w) map with rook (4-neighbour) weights: near 1 for one smooth blob, near 0 for
    spatially random values, negative for a checkerboard; None for a constant map."""
    z = image.astype(np.float64) - image.mean()
    denominator = (z ** 2).sum()
    if denominator == 0:
        return None
    cross = 2 * ((z[1:, :] * z[:-1, :]).sum() + (z[:, 1:] * z[:, :-1]).sum())  # both directions of each pair
    weights = 2 * (z[1:, :].size + z[:, 1:].size)
    return float(z.size / weights * cross / denominator)


def feature_labels(latents: torch.Tensor, scenes: list, truth, min_auroc: float = 0.7) -> tuple[list, np.ndarray, dict]:
    """(names, auroc (T, F), labels {feature: (attribute, value)}): each live feature's best attribute value by
    AUROC (`saes.probes.attribute_aurocs`), kept as its label when it reaches min_auroc."""
    from saes.probes import attribute_aurocs

    names, auroc, _ = attribute_aurocs(latents, scenes, truth=truth)
    live = (latents.reshape(-1, latents.shape[-1]) > 0).any(0).numpy()
    labels = {}
    filled = np.where(np.isnan(auroc), -np.inf, auroc)
    for f in np.flatnonzero(live):
        best = int(np.argmax(filled[:, f]))
        if filled[best, f] >= min_auroc:
            labels[int(f)] = names[best]
    return names, auroc, labels


def label_region(label: tuple[str, str], scenes: list, height: int, width: int, truth,
                 background_max_coverage: float = 0.05) -> np.ndarray:
    """(images, h, w) bool: the block positions a label names: those touching an object with that value, or for
    the background, the positions off every object of images with that background."""
    attribute, value = label
    region = np.zeros((len(scenes), height, width), bool)
    for i, scene in enumerate(scenes):
        if scene is None:
            continue
        if attribute == "background":
            if scene.background == value:
                from saes.probes import _object_coverage

                region[i] = _object_coverage(scene, height, width, truth) < background_max_coverage
            continue
        for obj in scene.objects:
            if getattr(obj, attribute) == value:
                mask = torch.from_numpy(truth.object_mask(obj, truth.image_size).astype(np.float32))[None, None]
                region[i] |= torch.nn.functional.adaptive_avg_pool2d(mask, (height, width))[0, 0].numpy() > 0
    return region


def localisation(latents: torch.Tensor, scenes: list, truth, min_auroc: float = 0.7,
                 moran_images: int = 8) -> tuple[dict, dict]:
    """latents (images, h, w, F) on the scenes' images. Per labelled feature the share of its activation inside
    its label's region (`label_region`) and that region's share of positions (the base rate); Moran's I of every
    live feature on its top images, reported apart for unlabelled and labelled features."""
    n, h, w, f = latents.shape
    _, _, labels = feature_labels(latents, scenes, truth, min_auroc)
    regions: dict[tuple, np.ndarray] = {}
    per_feature = {}
    for feature, label in labels.items():
        if label not in regions:
            regions[label] = label_region(label, scenes, h, w, truth)
        act = latents[..., feature].numpy().astype(np.float64)
        total = act.sum()
        per_feature[feature] = {"label": f"{label[0]}={label[1]}",
                                "inside": float((act * regions[label]).sum() / total) if total > 0 else None,
                                "base_rate": float(regions[label].mean())}
    live = np.flatnonzero((latents.reshape(-1, f) > 0).any(0).numpy())
    peaks = latents.amax(dim=(1, 2))  # (n, F)
    moran = {}
    for feature in live.tolist():
        top = torch.argsort(peaks[:, feature], descending=True)[:moran_images]
        values = [morans_i(latents[i, :, :, feature].numpy()) for i in top.tolist() if peaks[i, feature] > 0]
        values = [v for v in values if v is not None]
        if values:
            moran[feature] = float(np.mean(values))
    inside = [p["inside"] for p in per_feature.values() if p["inside"] is not None]
    unlabelled = [v for k, v in moran.items() if k not in labels]
    labelled = [v for k, v in moran.items() if k in labels]
    metrics = {"n_labelled": len(labels), "n_live": int(len(live)),
               "mean_localisation": float(np.mean(inside)) if inside else None,
               "mean_base_rate": (float(np.mean([p["base_rate"] for p in per_feature.values()])) if per_feature
                                  else None),
               "moran_i_unlabelled": float(np.mean(unlabelled)) if unlabelled else None,
               "moran_i_labelled": float(np.mean(labelled)) if labelled else None}
    return metrics, {"features": {str(k): {**v, "moran_i": moran.get(k)} for k, v in per_feature.items()},
                     "moran_i_unlabelled": {str(k): v for k, v in moran.items() if k not in labels}}


# ----------------------------------------------------------------------------- absorption

# SAEBench's thresholds (sae_bench/evals/absorption: feature_absorption_calculator.py, k_sparse_probing.py)
FULL_ABSORPTION_COS = 0.025
FRACTION_ABSORPTION_COS = 0.1
PROJECTION_SHARE = 0.4
MAX_ABSORBING_LATENTS = 3
TOP_PROJECTION_FEATURES = 10
F1_JUMP = 0.03
EPS = 1e-8


def _f1(y: np.ndarray, predicted: np.ndarray) -> float:
    tp = float((y & predicted).sum())
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + float((~y & predicted).sum()) + float((y & ~predicted).sum()))


def main_latents(sae_x: np.ndarray, y: np.ndarray, train: np.ndarray, max_k: int = 5) -> tuple[list[int], list[float]]:
    """SAEBench's feature split: latents ranked by an L1 logistic probe's positive weights (train), a k-sparse
    probe (balanced logistic regression on the top k) for k = 1.. max_k, k grown while the test F1 rises by more
    than F1_JUMP. Returns (the main latents, F1 per k)."""
    from sklearn.linear_model import LogisticRegression

    l1 = LogisticRegression(l1_ratio=1.0, solver="liblinear", C=1.0, class_weight="balanced", max_iter=2000)
    l1.fit(sae_x[train], y[train])
    order = np.argsort(-l1.coef_[0], kind="stable")
    best, chosen, f1s = -100.0, [], []
    for k in range(1, max_k + 1):
        cols = order[:k]
        probe = LogisticRegression(max_iter=2000, class_weight="balanced").fit(sae_x[train][:, cols], y[train])
        score = _f1(y[~train], probe.decision_function(sae_x[~train][:, cols]) > 0)
        f1s.append(score)
        if score > best + F1_JUMP:
            best, chosen = score, cols.tolist()
        else:
            break
    return chosen, f1s


def absorption_of(latents: np.ndarray, act_projection: float, cos: np.ndarray, main: list[int]) -> tuple[float, bool]:
    """SAEBench's absorption on one input: latents (d_sae,), act_projection (the input on the probe's unit
    direction), cos (d_sae,) each decoder row's cosine with it, main (the main latents).
    Returns (absorption fraction, full absorption)."""
    projection = latents * cos
    main_projection = float(projection[main].sum()) if main else 0.0
    absorbers = np.ones(len(latents), bool)
    absorbers[main] = False
    absorbers &= (cos >= FRACTION_ABSORPTION_COS) & (projection > 0)
    top = np.sort(projection[absorbers])[::-1][:MAX_ABSORBING_LATENTS]
    absorbed = float(top.sum())
    share = absorbed / act_projection if act_projection != 0 else 0.0
    if main_projection >= act_projection or share < PROJECTION_SHARE:
        fraction = 0.0
    elif main_projection <= 0.0:
        fraction = 1.0
    else:
        absorbed = min(absorbed, act_projection - main_projection)
        fraction = float(np.clip(absorbed / (absorbed + main_projection), 0.0, 1.0))
    order = np.argsort(-projection, kind="stable")[:TOP_PROJECTION_FEATURES]
    full = (all(latents[m] < EPS for m in main) and cos[order[0]] >= FULL_ABSORPTION_COS and act_projection > 0
            and projection[order[0]] / act_projection >= PROJECTION_SHARE)
    return fraction, bool(full)


def absorption(sae_x: np.ndarray, raw_x: np.ndarray, labels: dict[str, np.ndarray], train: np.ndarray,
               decoder: np.ndarray, max_k: int = 5, min_true_positives: int = 3) -> tuple[dict, dict]:
    """SAEBench's absorption on the world's parent concepts (every value of `labels`' attributes: colour=red,
    shape=circle, ...). decoder (d_sae, C): the SAE's W_dec. Per value: a logistic probe on the raw pooled update
    (train objects) is the ground-truth direction; the main latents (`main_latents`); over the test objects with
    the value that the probe reads as positive (its true positives), the mean absorption fraction and the share
    of full absorption (`absorption_of`). Metrics: the means over values (SAEBench's over letters)."""
    from sklearn.linear_model import LogisticRegression

    dec = decoder / np.clip(np.linalg.norm(decoder, axis=1, keepdims=True), 1e-12, None)
    rows = {}
    for attribute, values in labels.items():
        for value in dict.fromkeys(values.tolist()):
            y = values == value
            if min(int((train & y).sum()), int((train & ~y).sum()), int((~train & y).sum())) < 4:
                continue
            probe = LogisticRegression(max_iter=2000, class_weight="balanced").fit(raw_x[train], y[train])
            direction = probe.coef_[0] / np.linalg.norm(probe.coef_[0])
            positives = np.flatnonzero(~train & y & (probe.decision_function(raw_x) > 0))
            if len(positives) < min_true_positives:
                continue
            main, f1s = main_latents(sae_x, y, train, max_k)
            cos = dec @ direction
            results = [absorption_of(sae_x[j], float(raw_x[j] @ direction), cos, main) for j in positives]
            rows[f"{attribute}={value}"] = {
                "main_latents": main, "k_sparse_f1": f1s, "probe_true_positives": int(len(positives)),
                "absorption_fraction": float(np.mean([r[0] for r in results])),
                "full_absorption": float(np.mean([r[1] for r in results]))}
    if not rows:
        raise ValueError("absorption found no attribute value with enough objects and probe true positives")
    fractions = [r["absorption_fraction"] for r in rows.values()]
    full = [r["full_absorption"] for r in rows.values()]
    splits = [max(len(r["main_latents"]) - 1, 0) for r in rows.values()]
    metrics = {"mean_absorption_fraction_score": float(np.mean(fractions)),
               "mean_full_absorption_score": float(np.mean(full)),
               "mean_num_split_features": float(np.mean(splits)),
               "std_dev_absorption_fraction_score": float(np.std(fractions)),
               "std_dev_full_absorption_score": float(np.std(full))}
    return metrics, {"values": rows}


# ----------------------------------------------------------------------------- unlearning

def concept_prompts(truth, attribute: str, value: str, n: int, seed: int) -> tuple[list[str], list[str]]:
    """n captions of scenes with an object of attribute=value and n without (the world's held-out scenes)."""
    rng = np.random.default_rng(seed)
    with_concept, without = [], []
    for _ in range(200 * n):
        scene = truth.held_out_scene(rng)
        has = any(getattr(o, attribute) == value for o in scene.objects)
        target = with_concept if has else without
        if len(target) < n:
            target.append(truth.caption(scene))
        if len(with_concept) >= n and len(without) >= n:
            return with_concept, without
    raise ValueError(f"could not draw {n} held-out scenes with and without {attribute}={value}")


def unlearning_scores(readings_before: list, readings_after: list, scenes: list, attribute: str, value: str,
                      object_attributes) -> dict:
    """From the probe's readings of images without and with the intervention (same seeds): unlearning accuracy over
    the concept's objects drawn in the original (share no longer read with the value), in-domain retention (their
    other attributes read right in the original and still right), and for `scenes` without the concept,
    cross-domain retention (every attribute of every object and the background read right in the original, still
    right). Objects are matched by cell."""
    unlearned, in_kept, cross_kept = [], [], []
    others = [a for a in object_attributes if a not in (attribute, "position")]
    for before, after, scene in zip(readings_before, readings_after, scenes):
        concept_scene = any(getattr(o, attribute) == value for o in scene.objects)
        for obj in scene.objects:
            was, now = before.at(obj.position), after.at(obj.position)
            if concept_scene and getattr(obj, attribute) == value:
                if was is None or getattr(was, attribute) != value:
                    continue  # the model did not draw the concept here: nothing to unlearn
                unlearned.append(now is None or getattr(now, attribute) != value)
                for a in others:
                    if getattr(was, a) == getattr(obj, a):
                        in_kept.append(now is not None and getattr(now, a) == getattr(obj, a))
            elif not concept_scene:
                if was is None:
                    continue
                for a in [x for x in object_attributes if x != "position"]:
                    if getattr(was, a) == getattr(obj, a):
                        cross_kept.append(now is not None and getattr(now, a) == getattr(obj, a))
        if not concept_scene and before.background == scene.background:
            cross_kept.append(after.background == scene.background)
    mean = lambda v: float(np.mean(v)) if v else None  # noqa: E731
    return {"unlearning_accuracy": mean(unlearned), "in_domain_retention": mean(in_kept),
            "cross_domain_retention": mean(cross_kept), "n_concept_objects": len(unlearned)}


def _read(truth, images) -> list:
    reader = truth.probe()
    return [reader.read(image) for image in images]


@torch.no_grad()
def _images(model, prompts, seeds, batch_size, edits=None, saes=None, negative: str | None = None,
            guidance: float | None = None) -> np.ndarray:
    from interp.hooks import apply_edits, generate
    from interp.models.t2i import run_pipeline

    out = []
    for start in range(0, len(prompts), batch_size):
        chunk, chunk_seeds = prompts[start:start + batch_size], seeds[start:start + batch_size]
        if negative is not None:  # a negative prompt under CFG: the pipeline's own argument
            generators = [torch.Generator(device="cpu").manual_seed(int(s)) for s in chunk_seeds]
            latents = model.initial_latents(generators)
            array = run_pipeline(model.pipe, prompt=chunk, negative_prompt=[negative] * len(chunk),
                                 num_inference_steps=model.default_steps, guidance_scale=float(guidance),
                                 latents=latents.to(model.denoiser.device), height=model.default_size,
                                 width=model.default_size, output_type="np").images
        elif edits:
            with apply_edits(model, edits, saes=saes):
                array = generate(model, chunk, seed=chunk_seeds, output_type="np")
        else:
            array = generate(model, chunk, seed=chunk_seeds, output_type="np")
        out.append(np.clip(np.rint(np.asarray(array) * 255), 0, 255).astype(np.uint8))
    return np.concatenate(out)


def concept_features(auroc: np.ndarray, names: list, attribute: str, value: str, n: int) -> tuple[list[int], list]:
    """The n features of highest AUROC for attribute=value (NaN-free), with their AUROCs."""
    row = np.nan_to_num(auroc[names.index((attribute, value))], nan=-np.inf)
    top = np.argsort(-row, kind="stable")[:n]
    return top.tolist(), [float(row[f]) for f in top]


def difference_direction(raw_x: np.ndarray, values: np.ndarray, value: str) -> np.ndarray:
    """The concept's mean pooled update minus the mean of the same attribute's other values' objects."""
    y = values == value
    return raw_x[y].mean(0) - raw_x[~y].mean(0)


@torch.no_grad()
def image_unlearning(model, sae, block: str, truth, latents: torch.Tensor, pool_scenes: list, raw_x: np.ndarray,
                     labels: dict[str, np.ndarray], config: ImageBenchConfig, cache: dict | None = None
                     ) -> tuple[dict, dict]:
    """Per concept (every value of config.unlearn_attributes, default the world's key attributes): its features on
    the capture pool (latents (images, h, w, F) of pool_scenes), their scale set to config.multiplier during
    generation, and the two baselines; scored by `unlearning_scores`. cache: shared across SAEs of one model
    (the prompts, unedited readings and the negative-prompt baseline depend on the concept only)."""
    from interp.edits import Edit
    from saes.probes import attribute_aurocs

    cache = {} if cache is None else cache
    names, auroc, _ = attribute_aurocs(latents, pool_scenes, truth=truth)
    attributes = config.unlearn_attributes or truth.key_attributes
    concepts = [(a, v) for a, v in truth.attribute_values() if a in attributes]
    per_concept = {}
    for c, (attribute, value) in enumerate(concepts):
        key = (attribute, value)
        if key not in cache:
            with_c, without = concept_prompts(truth, attribute, value, config.unlearn_images, config.seed + 1000 + c)
            prompts = with_c + without
            seeds = [config.seed + 5000 + i for i in range(len(prompts))]
            scenes = truth.scenes(prompts)
            before = _read(truth, _images(model, prompts, seeds, config.batch_size))
            negative = _read(truth, _images(model, prompts, seeds, config.batch_size, negative=value,
                                            guidance=config.negative_guidance))
            cache[key] = (prompts, seeds, scenes, before,
                          unlearning_scores(before, negative, scenes, attribute, value, truth.object_attributes))
        prompts, seeds, scenes, before, negative_scores = cache[key]
        features, feature_aurocs = concept_features(auroc, names, attribute, value, config.max_unlearn_features)
        edits = [Edit(block=block, mode="scale", feature=f, strength=config.multiplier) for f in features]
        after = _read(truth, _images(model, prompts, seeds, config.batch_size, edits, {block: sae}))
        sae_scores = unlearning_scores(before, after, scenes, attribute, value, truth.object_attributes)
        if (block, key) not in cache:  # the steering baseline depends on the block, not on the SAE
            direction = difference_direction(raw_x, labels[attribute], value)
            steer = [Edit(block=block, mode="add", direction=(-direction).tolist(), strength=1.0)]
            steered = _read(truth, _images(model, prompts, seeds, config.batch_size, steer))
            cache[(block, key)] = unlearning_scores(before, steered, scenes, attribute, value, truth.object_attributes)
        per_concept[f"{attribute}={value}"] = {
            "features": features, "feature_aurocs": feature_aurocs, "sae": sae_scores,
            "negative_prompt": negative_scores, "activation_steering": cache[(block, key)]}
    metrics = {}
    for method in ("sae", "negative_prompt", "activation_steering"):
        for score in ("unlearning_accuracy", "in_domain_retention", "cross_domain_retention"):
            values = [p[method][score] for p in per_concept.values() if p[method][score] is not None]
            prefix = "" if method == "sae" else f"{method}_"
            metrics[prefix + score] = float(np.mean(values)) if values else None
    return metrics, {"concepts": per_concept, "multiplier": config.multiplier,
                     "negative_guidance": config.negative_guidance}


# ----------------------------------------------------------------------------- editing (RIEBench)

def image_editing(model, sae, block: str, config: ImageBenchConfig, out_dir, min_preservation: float = 0.9
                  ) -> tuple[dict, dict]:
    """RIEBench's shapes suite (config.riebench_per_category tasks per category) edited by SAE feature transport
    on this block alone over k_trans x m; the best success among configurations whose preservation is at least
    min_preservation (RIEBench's headline), overall and per category."""
    from riebench.methods import MethodConfig
    from riebench.report import category_table, headline_table
    from riebench.runner import Runner, RunConfig, load_results

    configs = [MethodConfig("sae", k_trans=k, multiplier=m, blocks=[block])
               for k in config.riebench_k for m in config.riebench_m]
    run = RunConfig(model=model.name, limit_per_category=config.riebench_per_category, configs=configs)
    Runner(run, out_dir, model=model, saes={block: sae}, progress=False).run()
    results, _ = load_results(out_dir)
    rows = category_table(results)
    headline = headline_table(rows, min_preservation)
    overall = [r for r in headline if r["category"] == "all"]
    best = overall[0] if overall else None
    metrics = {"success_at_preservation": best["success"] if best else 0.0,
               "preservation_at_best": best["preservation"] if best else None,
               "min_preservation": min_preservation}
    details = {"best": {k: best.get(k) for k in ("k_trans", "m", "success", "preservation")} if best else None,
               "categories": {r["category"]: r["success"] for r in headline if r["category"] != "all"},
               "n_tasks": len({r.get("task") for r in results}), "configs": [c.key() for c in configs]}
    return metrics, details


# ----------------------------------------------------------------------------- the suite

def run_image_evals(model, saes: dict, eval_types=EVAL_TYPES, config: ImageBenchConfig | None = None,
                    work_dir=None, progress=None) -> dict:
    """Every eval of `eval_types` on every SAE of `saes` ({name: (block, SAE)}) of one model.

    Evals of TRUTH_EVALS are refused in one line on a model without a world, before any work. The capture pool
    (world prompts' last-step updates, every block at once), the concepts' prompts, unedited readings and the
    negative-prompt baseline are computed once per model and shared by its SAEs. Returns
    {name: {eval_type: {"metrics", "details", "seconds"}}}; work_dir: where RIEBench writes its runs (needed
    for image_editing). progress: a callable taking one line, or None."""
    import time

    from interp.ground_truth import ground_truth_for, world as world_named

    config = config or ImageBenchConfig()
    unknown = [e for e in eval_types if e not in EVAL_TYPES]
    if unknown:
        raise ValueError(f"unknown image eval type(s) {', '.join(unknown)}; the image evals are: "
                         f"{', '.join(EVAL_TYPES)}")
    truth = ground_truth_for(model)
    for eval_type in eval_types:
        if eval_type in TRUTH_EVALS:
            require_world(truth, eval_type, getattr(model, "name", "this model"))
    if "image_editing" in eval_types and work_dir is None:
        raise ValueError("image_editing needs a work directory for RIEBench's runs")
    for name, (block, sae) in saes.items():
        if block not in model.blocks:
            raise ValueError(f"{name}: the model has no block {block!r}; its blocks: {', '.join(model.blocks)}")
        if sae.cfg.d_in != model.blocks[block].channels:
            raise ValueError(f"{name}: the SAE reads {sae.cfg.d_in} channels, {block} has "
                             f"{model.blocks[block].channels}")
    say = progress or (lambda line: None)
    blocks = sorted({block for block, _ in saes.values()})
    # reconstruction prompts: the model's world's captions, else the shapes world's words (any model reads text)
    prompt_world = truth or world_named("shapes")
    recon_prompts = prompt_world.prompts(config.n_images, seed=config.seed + 1)
    recon_seeds = [config.seed + 10_000 + i for i in range(config.n_images)]
    recon_scenes = truth.scenes(recon_prompts) if truth is not None else None
    needs_pool = any(e in eval_types for e in ("image_sparse_probing", "image_localisation", "image_absorption",
                                               "image_unlearning")) or "image_reconstruction" in eval_types
    pool = None
    if needs_pool:
        start = time.perf_counter()
        n_pool = config.probe_images if truth is not None else config.n_images
        pool_prompts = prompt_world.prompts(n_pool, seed=config.seed)
        pool_updates = capture_pool(model, blocks, pool_prompts, [config.seed + i for i in range(n_pool)],
                                    config.batch_size)
        pool = BlockPool(pool_prompts, truth.scenes(pool_prompts) if truth is not None else [], truth, pool_updates)
        say(f"capture pool: {n_pool} images, {len(blocks)} blocks, {time.perf_counter() - start:.1f} s")
    results: dict = {}
    unlearn_cache = _shared("unlearning", model, (config.seed, config.unlearn_images, config.negative_guidance,
                                                  config.unlearn_attributes), dict)
    per_block: dict = {}
    for name, (block, sae) in saes.items():
        results[name] = {}
        updates = pool.updates[block]
        latents = objects = coverage = None
        if truth is not None:
            from saes.probes import encode_positions

            latents = encode_positions(sae, updates)
            if block not in per_block:
                objects, coverage = object_coverages(pool.scenes, updates.shape[2], updates.shape[3], truth)
                raw = pool_objects(updates.permute(0, 2, 3, 1).float(), objects, coverage)
                train_images = image_split(len(pool.scenes), config.seed)
                per_block[block] = (objects, coverage, raw, np.array([train_images[i] for i, _ in objects]))
            objects, coverage, raw_x, train = per_block[block]
            sae_x = pool_objects(latents, objects, coverage)
            labels = object_labels(objects, truth.object_attributes)
        for eval_type in eval_types:
            start, cpu_start = time.perf_counter(), time.process_time()
            if eval_type == "image_reconstruction":
                metrics, details = image_reconstruction(model, sae, block, recon_prompts, recon_seeds,
                                                        config.batch_size, truth, recon_scenes, updates)
            elif eval_type == "image_sparse_probing":
                metrics, details = sparse_probing(sae_x, raw_x, labels, train, config.ks, config.seed)
            elif eval_type == "image_localisation":
                metrics, details = localisation(latents, pool.scenes, truth, config.label_min_auroc,
                                                config.moran_images)
            elif eval_type == "image_absorption":
                key_labels = {a: labels[a] for a in truth.key_attributes}
                metrics, details = absorption(sae_x, raw_x, key_labels, train,
                                              sae.W_dec.detach().float().numpy(), max_k=max(config.ks))
            elif eval_type == "image_unlearning":
                metrics, details = image_unlearning(model, sae, block, truth, latents, pool.scenes, raw_x, labels,
                                                    config, unlearn_cache)
            else:
                from pathlib import Path

                metrics, details = image_editing(model, sae, block, config, Path(work_dir) / "riebench" / name)
            seconds = time.perf_counter() - start
            results[name][eval_type] = {"metrics": metrics, "details": details, "seconds": seconds,
                                        "cpu_seconds": time.process_time() - cpu_start}
            say(f"{name} {eval_type}: {seconds:.1f} s")
    return results

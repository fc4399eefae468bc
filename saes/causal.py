"""Causal label scores: what painting a labelled feature draws, not what its activation predicts.

A feature card's label (`saes.probes`) is the attribute value the feature's *activation* predicts best
(AUROC). Adding the feature is another matter: the feature the AUROC picks for colour=red can turn a blue star
green. The causal label score measures the edit itself, on the shapes world:

    for each of n held-out scenes whose target object does not have the labelled value,
    paint the feature inside that object (`FeatureLibrary.paint_edit`, the Paint tab's edit: strength x the
    card's mean activation, the object's mask downsampled to the block), regenerate with the same seed and
    read the object with the world's probe (`interp.ground_truth`: the model's world, the shapes world);
    causal_label = share of scenes where the probe reads the labelled value on the edited image,
    causal_label_before = the same share on the unedited image (about 0 by construction).

What "reads the labelled value" means per attribute: an object attribute (the shapes world's colour, shape, size,
texture): the object the probe finds in the target object's cell has the value; position=P: the probe finds an
object in cell P (empty in the scene); background=B: the edit covers everything outside the objects and the probe
reads background B. A value that would hide an object on its background (`GroundTruth.hides_on_background`: the
shapes world's colours) is never asked of an object on that background, nor of a background behind such an object.

With `steps`, the scenes are generated (and the feature painted, at every step, as `FeatureLibrary.paint` does
by default) at that many denoising steps instead of the model's default; `preservation=True` adds how much of what
the edit should leave alone reads the same as on the unedited image (`preserved`: RIEBench's preservation,
`riebench.metrics.attribute_preservation`, for a painted label). `experiments.step_transfer paint` measures the
shipped 1-step SAEs' features so at 1, 2 and 4 steps.

Scenes are drawn from the world's held-out split (combinations the model never trained on; the model's
`GroundTruth` draws them, captions them and gives their objects' masks) by a generator seeded with `seed` and
the label, so a label's scenes are the same for every feature and block, and a feature's
score is reproducible. `python -m saes causal` stores the scores in the cards (features.json);
`FeatureLibrary.search` ranks by them.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

N_SCENES = 24          # held-out scenes per label
STRENGTH = 3.0         # x the feature's mean activation: the Paint tab's default strength
SEED = 21              # the scenes' generator (with the label); image i of a label is generated with seed 1000 + i
SCORE_KEYS = ("causal_label", "causal_label_before", "causal_label_n")


class CausalError(ValueError):
    """A feature or label that cannot be scored, and why."""


@dataclass(frozen=True)
class Trial:
    """One scene of a label's test: its caption, generation seed and the image-space region the edit covers."""

    prompt: str
    seed: int
    scene: object           # a scene of the world (`GroundTruth`: .objects, .background)
    target: object | None   # the edited object (one of scene.objects); None for a background label
    region: np.ndarray      # (image_size, image_size) bool


def label_trials(label: str, n: int = N_SCENES, seed: int = SEED, *, truth) -> list[Trial]:
    """The n held-out scenes of the world `truth` (a `GroundTruth`: its held-out scenes, captions and masks) a
    label ("attribute=value") is tested on, each with the object (or background) the edit covers, chosen so
    that the scene does not already show the value there."""
    from interp.ground_truth import example_label

    attribute, _, value = label.partition("=")
    if attribute not in {a for a, _ in truth.attribute_values()} or not value:
        raise CausalError(f"a causal label score needs a label of the {truth.name} world like "
                          f"{example_label(truth)}, not {label!r}")
    hides = truth.hides_on_background  # an object with the background's value of it cannot be seen
    size = truth.image_size
    rng = np.random.default_rng([seed, zlib.crc32(label.encode())])
    trials = []
    for _ in range(200 * n):
        if len(trials) == n:
            break
        scene = truth.held_out_scene(rng)
        if attribute == "background":
            if scene.background == value or hides and any(getattr(o, hides) == value for o in scene.objects):
                continue  # the edit could not show a background the objects would vanish into
            target, region = None, ~truth.foreground_mask(scene, size)
        elif attribute == "position":
            if any(o.position == value for o in scene.objects):
                continue  # the cell the label names is empty before the edit
            target = scene.objects[0]
            region = truth.object_mask(target, size) > 0
        else:
            if attribute == hides and scene.background == value:
                continue  # an object of the background's colour (the world's hides_on_background) cannot be seen
            target = next((o for o in scene.objects if getattr(o, attribute) != value), None)
            if target is None:
                continue
            region = truth.object_mask(target, size) > 0
        trials.append(Trial(truth.caption(scene), 1000 + len(trials), scene, target, region))
    if len(trials) < n:
        raise CausalError(f"found only {len(trials)} held-out scenes for {label}")
    return trials


def reads_label(reading, label: str, trial: Trial) -> bool:
    """Whether a probe reading (the world's probe's, e.g. `shapes.ProbeReading`) shows the label where the trial's
    edit acted."""
    attribute, _, value = label.partition("=")
    if attribute == "background":
        return reading.background == value
    if attribute == "position":
        return reading.at(value) is not None
    found = reading.at(trial.target.position)
    return found is not None and getattr(found, attribute) == value


def preserved(before, after, label: str, trial: Trial, truth) -> tuple[float, int]:
    """Share of the readings a label's edit should leave alone that read the same on the edited image (`after`, a
    probe reading) as on the unedited one (`before`: what the model drew, not the caption), and how many were
    compared. RIEBench's preservation (`riebench.metrics.attribute_preservation`) for a painted label: the
    background (unless the label is one), every object attribute of each object outside the edited cells, the
    target's attributes other than the label's, and no object appearing outside the edited cells. The edited cells:
    the target's, and for position=P also P."""
    attribute, _, value = label.partition("=")
    kept = [a for a in truth.object_attributes if a != "position"]
    edited_cells = {trial.target.position} if trial.target is not None else set()
    if attribute == "position":
        edited_cells.add(value)
    checks: list[bool] = []
    if attribute != "background":
        checks.append(after.background == before.background)
    for cell in truth.cells:
        obj = before.at(cell)
        if obj is None or cell in edited_cells:
            continue
        now = after.at(cell)
        checks += [now is not None and getattr(now, a) == getattr(obj, a) for a in kept]
    if trial.target is not None and attribute in kept:
        obj, now = before.at(trial.target.position), after.at(trial.target.position)
        if obj is not None:
            checks += [now is not None and getattr(now, a) == getattr(obj, a) for a in kept if a != attribute]
    appeared = {c for c in truth.cells if after.at(c) is not None and before.at(c) is None}
    checks.append(not (appeared - edited_cells))
    return float(np.mean(checks)), len(checks)


def causal_label_scores(library, model, block: str, features: list[int], n_scenes: int = N_SCENES,
                        strength: float = STRENGTH, seed: int = SEED, probe=None,
                        originals: dict | None = None, steps: int | None = None,
                        preservation: bool = False) -> dict[int, dict]:
    """{feature: {"causal_label", "causal_label_before", "causal_label_n"}} for labelled features of a block.

    library: a `saes.library.FeatureLibrary`; model: its T2IModel, made in the shapes world (a model without
    that ground truth is refused: its images cannot be read). probe: the reader of images (default: the world's).
    originals: a dict kept between calls to reuse the unedited generations of a label's scenes (they do not
    depend on the feature or block). steps: denoising steps of every generation (default: the model's); the
    feature is painted at every step. preservation: also "preservation", the mean over the scenes of `preserved`
    (what the edit should not touch, read the same as unedited)."""
    from interp.ground_truth import require_ground_truth
    from interp.hooks import apply_edits

    truth = require_ground_truth(model, "a causal label score (features painted into scenes of the shapes world, "
                                        "read back by its probe)")
    probe = truth.probe() if probe is None else probe
    originals = {} if originals is None else originals
    n_steps = model.default_steps if steps is None else steps
    results = {}
    for feature in features:
        label = library.card(block, feature).get("label")
        if not label:
            raise CausalError(f"{block} feature {feature} has no label to test")
        trials = label_trials(label, n_scenes, seed, truth=truth)
        key = (label, n_scenes, seed, n_steps)
        if key not in originals:  # one batch: no edit, so every scene can be generated at once
            images = model.generate([t.prompt for t in trials], steps=n_steps, seed=[t.seed for t in trials])
            originals[key] = [probe.read(image) for image in images]
        after, kept = [], []
        for trial, before in zip(trials, originals[key]):
            edit = library.paint_edit(model, block, feature, strength, mask=trial.region)  # every step
            with apply_edits(model, [edit], saes={block: library.sae(block)}, n_steps=n_steps):
                image = model.generate(trial.prompt, steps=n_steps, seed=trial.seed)[0]
            reading = probe.read(image)
            after.append(reads_label(reading, label, trial))
            if preservation:
                kept.append(preserved(before, reading, label, trial, truth)[0])
        results[feature] = {"causal_label": float(np.mean(after)),
                            "causal_label_before": float(np.mean([reads_label(r, label, t)
                                                                  for r, t in zip(originals[key], trials)])),
                            "causal_label_n": len(trials)}
        if preservation:
            results[feature]["preservation"] = float(np.mean(kept))
    return results


def causal_label_score(library, model, block: str, feature: int, **options) -> dict:
    """`causal_label_scores` of one feature."""
    return causal_label_scores(library, model, block, [feature], **options)[feature]


def features_to_score(cards: list[dict], per_label: int | None = None) -> list[int]:
    """The labelled features of a block's cards; with per_label, only that many per label, best AUROC first."""
    by_label: dict[str, list[dict]] = {}
    for card in cards:
        if card.get("label"):
            by_label.setdefault(card["label"], []).append(card)
    chosen = []
    for label_cards in by_label.values():
        label_cards.sort(key=lambda c: -(c.get("auroc") or 0.0))
        chosen += [c["id"] for c in label_cards[:per_label]]
    return sorted(chosen)


def write_scores(features_path: str | os.PathLike, scores: dict[int, dict], config: dict) -> None:
    """Store the scores in a features.json (atomically; every other field kept). Cards of the file that this
    run did not score lose any score they had, so that every score in a file comes from the run its "causal"
    entry describes."""
    from .strict_json import write_json

    path = Path(features_path)
    data = json.loads(path.read_text())
    for card in data["features"]:
        for key in SCORE_KEYS:
            card.pop(key, None)
        if card["id"] in scores:
            card.update(scores[card["id"]])
    data["causal"] = config
    write_json(path, data, separators=(",", ":"))


def summarise(library, blocks: list[str]) -> str:
    """A markdown summary of the stored scores: per attribute the features scored and the median score (before
    and after), and per label and block whether the label search's pick beats the AUROC's."""
    from .library import label_rank

    rows, picks = {}, []
    for block in blocks:
        cards = [c for c in library.cards(block) if c.get("causal_label") is not None]
        for card in cards:
            rows.setdefault(card["attribute"], []).append(card)
        for label in sorted({c["label"] for c in cards}):
            own = [c for c in cards if c["label"] == label]
            by_auroc = max(own, key=lambda c: c.get("auroc") or 0.0)
            by_search = min(own, key=label_rank)
            picks.append((label, block, len(own), by_auroc, by_search))
    lines = ["| attribute | features scored | median causal label | median before | best |",
             "|---|---|---|---|---|"]
    for attribute, cards in sorted(rows.items()):
        lines.append(f"| {attribute} | {len(cards)} | {statistics.median(c['causal_label'] for c in cards):.2f} | "
                     f"{statistics.median(c['causal_label_before'] for c in cards):.2f} | "
                     f"{max(c['causal_label'] for c in cards):.2f} |")
    lines += ["", "| label | block | features | AUROC pick (AUROC, causal) | search pick (AUROC, causal) |",
              "|---|---|---|---|---|"]
    for label, block, n, a, s in picks:
        lines.append(f"| {label} | {block} | {n} | #{a['id']} ({a['auroc']:.3f}, {a['causal_label']:.2f}) | "
                     f"#{s['id']} ({s['auroc']:.3f}, {s['causal_label']:.2f}) |")
    return "\n".join(lines) + "\n"


def add_causal_arguments(parser) -> None:
    """`saes causal`: the SAEs and their cards, which blocks and features, the scenes and the edit's strength."""
    from interp.cli import add_dtype_argument, at_least

    parser.add_argument("--model", default="toy", help="the model the SAEs belong to (images are generated with it)")
    parser.add_argument("--sae", required=True, help="directory with one SAE per block and its features.json "
                                                     "(e.g. a copy of saes/pretrained/toy)")
    parser.add_argument("--block", action="append", default=None, help="score only this block (repeatable)")
    parser.add_argument("--scenes", type=at_least(1), default=N_SCENES, help="held-out scenes per label")
    parser.add_argument("--strength", type=float, default=STRENGTH,
                        help="x the feature's mean activation (default 3: the Paint tab's default strength)")
    parser.add_argument("--per-label", type=at_least(1), default=None,
                        help="score only the N best-AUROC features of each label (default: every labelled feature)")
    parser.add_argument("--seed", type=int, default=SEED, help="seed of the scenes (with the label)")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    add_dtype_argument(parser, default=None)
    parser.add_argument("--threads", type=at_least(1), default=1)
    parser.add_argument("--overwrite", action="store_true",
                        help="rewrite features.json shipped with the repository (saes/pretrained/...)")


def causal_command(args) -> int:
    """`python -m saes causal`: score the labelled features of a library's blocks and store the scores. The model
    (`saes.pool.load_model`) is loaded once the arguments are checked."""
    from interp.shipped import refuse_shipped

    from .library import FeatureLibrary
    from .pool import FEATURES_FILENAME, load_model

    library = FeatureLibrary(args.sae)
    blocks = args.block or library.blocks
    for block in blocks:
        library.sae(block)  # an unknown block is an error before anything runs
    paths = [library.root / block / FEATURES_FILENAME for block in blocks]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise CausalError(f"no feature cards to score: {', '.join(missing)} (run `python -m saes features` first)")
    if not args.overwrite:
        refuse_shipped(paths, "saes causal", "copy the SAEs out first (e.g. cp -r saes/pretrained/toy runs/toy-saes) "
                                             "and score the copies")
    model = load_model(args)
    config = {"scenes": args.scenes, "strength": args.strength, "seed": args.seed, "per_label": args.per_label,
              "steps": model.default_steps}
    originals: dict = {}
    for block, path in zip(blocks, paths):
        features = features_to_score(library.cards(block), args.per_label)
        start = time.perf_counter()
        scores = causal_label_scores(library, model, block, features, n_scenes=args.scenes, strength=args.strength,
                                     seed=args.seed, originals=originals)
        seconds = time.perf_counter() - start
        write_scores(path, scores, config)
        for card in library.cards(block):  # the library's cards now hold what the file holds
            for key in SCORE_KEYS:
                card.pop(key, None)
            card.update(scores.get(card["id"], {}))
        per = f", {seconds / len(features):.2f} s per feature" if features else ""
        print(f"{block}: {len(features)} labelled features scored on {args.scenes} scenes in {seconds:.0f} s{per}",
              flush=True)
    print(summarise(library, blocks), end="")
    return 0

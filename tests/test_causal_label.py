"""Causal label scores (issue 21): a label says what a feature's activation predicts, not what painting it draws.
The label search picked colour=red's best-AUROC feature, which painted into objects rarely reads red; the cards
now hold how often painting each labelled feature in makes the probe read its label, and the search ranks by it."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from zoo import shapes
from saes.causal import SCORE_KEYS, causal_label_score, label_trials, reads_label
from saes.library import FeatureLibrary, label_rank

ROOT = Path(__file__).resolve().parents[1] / "saes" / "pretrained" / "toy"
RED_BLOCK = "up_blocks.1.attentions.2"  # the only shipped block with colour=red features
PROBE = shapes.AttributeProbe()


@pytest.fixture(scope="module")
def library():
    library = FeatureLibrary.for_model("toy")
    if library is None or RED_BLOCK not in library.blocks:
        pytest.skip("needs the SAEs shipped for the toy model")
    return library


def _with_label(scene, label: str, trial):
    """The scene as it would be if the edit had drawn the label where it acted."""
    attribute, _, value = label.partition("=")
    if attribute == "background":
        return shapes.Scene(scene.objects, value)
    changes = {attribute: value}
    return shapes.Scene(tuple(replace(o, **changes) if o == trial.target else o for o in scene.objects),
                        scene.background)


@pytest.mark.parametrize("label", ["colour=red", "shape=star", "size=small", "texture=striped", "position=top left",
                                   "background=black"])
def test_a_labels_scenes_do_not_show_it_until_it_is_drawn_and_are_the_same_every_time(label):
    trials = label_trials(label, 5, truth=shapes.WORLD)
    again = label_trials(label, 5, truth=shapes.WORLD)
    assert [(t.prompt, t.seed) for t in trials] == [(t.prompt, t.seed) for t in again]
    assert len({t.prompt for t in trials}) == 5
    for trial in trials:
        assert shapes.parse_caption(trial.prompt) == trial.scene and shapes.is_held_out(trial.scene)
        assert trial.region.shape == (shapes.IMAGE_SIZE, shapes.IMAGE_SIZE) and trial.region.any()
        assert not reads_label(PROBE.read(shapes.render(trial.scene)), label, trial)
        assert reads_label(PROBE.read(shapes.render(_with_label(trial.scene, label, trial))), label, trial)


def test_the_label_search_ranks_by_the_causal_score_then_auroc(library):
    assert sorted([{"auroc": 0.99}, {"auroc": 0.8, "causal_label": 0.1}, {"auroc": 0.9, "causal_label": 0.1},
                   {"auroc": 0.7, "causal_label": 0.3}], key=label_rank) == \
        [{"auroc": 0.7, "causal_label": 0.3}, {"auroc": 0.9, "causal_label": 0.1},
         {"auroc": 0.8, "causal_label": 0.1}, {"auroc": 0.99}]
    reds = [c for c in library.cards(RED_BLOCK) if c.get("label") == "colour=red"]
    by_auroc = max(reds, key=lambda c: c["auroc"])
    picked = library.card(RED_BLOCK, library.search(RED_BLOCK, "red")[0])
    assert picked["causal_label"] == max(c["causal_label"] for c in reds)
    # the pick the search made before (best AUROC) is not the one that paints red best
    assert picked["id"] != by_auroc["id"] and picked["causal_label"] > by_auroc["causal_label"]


def test_every_labelled_shipped_card_has_a_causal_score_measured_as_its_file_says(library):
    for block in library.blocks:
        config = library.causal_config(block)
        assert config["scenes"] >= 16 and config["strength"] > 0, block
        for card in library.cards(block):
            if card.get("label"):
                assert 0 <= card["causal_label"] <= 1 and 0 <= card["causal_label_before"] <= 1, (block, card["id"])
                assert card["causal_label_n"] == config["scenes"]
            else:
                assert not set(SCORE_KEYS) & set(card)


def test_the_score_is_a_real_edit_and_regeneration_and_the_search_pick_paints_red_more_often(library, toy_t2i):
    """Recomputed from scratch: the search's red pick, painted into held-out objects that are not red, makes the
    probe read red more often than the best-AUROC red feature does; without the edit (strength 0) the score is
    what the unedited images read."""
    config = library.causal_config(RED_BLOCK)
    options = {"n_scenes": config["scenes"], "seed": config["seed"], "originals": {}}
    picked = library.search(RED_BLOCK, "red")[0]
    by_auroc = max((c for c in library.cards(RED_BLOCK) if c.get("label") == "colour=red"), key=lambda c: c["auroc"])
    score = causal_label_score(library, toy_t2i, RED_BLOCK, picked, strength=config["strength"], **options)
    stored = library.card(RED_BLOCK, picked)
    assert score["causal_label_n"] == config["scenes"]
    assert score["causal_label"] == pytest.approx(stored["causal_label"], abs=1.5 / config["scenes"])
    assert score["causal_label"] > score["causal_label_before"]
    auroc_score = causal_label_score(library, toy_t2i, RED_BLOCK, by_auroc["id"], strength=config["strength"],
                                     **options)
    assert score["causal_label"] > auroc_score["causal_label"]
    unedited = causal_label_score(library, toy_t2i, RED_BLOCK, picked, strength=0.0, **options)
    assert unedited["causal_label"] == unedited["causal_label_before"] == score["causal_label_before"]


def _copy_block(tmp_path: Path, block: str) -> Path:
    root = tmp_path / "toy"
    shutil.copytree(ROOT / block, root / block)
    for name in ("analysis_images.npz", "analysis_prompts.json"):
        shutil.copy(ROOT / name, root / name)
    return root


def test_the_causal_command_scores_a_copy_and_refuses_the_shipped_cards(library, tmp_path, capsys):
    from saes.__main__ import main

    block = "up_blocks.0.attentions.1"
    shipped = (ROOT / block / "features.json").read_bytes()
    assert main(["causal", "--sae", str(ROOT), "--block", block]) == 2
    assert "would rewrite files shipped with the repository" in capsys.readouterr().err
    assert (ROOT / block / "features.json").read_bytes() == shipped

    root = _copy_block(tmp_path, block)
    assert main(["causal", "--sae", str(root), "--scenes", "2", "--per-label", "1", "--strength", "4"]) == 0
    assert f"{block}: " in capsys.readouterr().out
    before, after = json.loads(shipped), json.loads((root / block / "features.json").read_text())
    assert after["causal"] == {"scenes": 2, "strength": 4.0, "seed": 21, "per_label": 1, "steps": 1}
    assert {k: v for k, v in after.items() if k not in ("causal", "features")} == \
        {k: v for k, v in before.items() if k not in ("causal", "features")}
    labels = {c["label"] for c in before["features"] if c.get("label")}
    scored = [c for c in after["features"] if "causal_label" in c]
    assert sorted(c["label"] for c in scored) == sorted(labels)  # one per label: its best AUROC
    for old, new in zip(before["features"], after["features"]):
        assert {k: v for k, v in new.items() if k not in SCORE_KEYS} == \
            {k: v for k, v in old.items() if k not in SCORE_KEYS}
        if "causal_label" in new:
            assert new["causal_label_n"] == 2
            assert new["auroc"] == max(c["auroc"] for c in before["features"] if c.get("label") == new["label"])
    copy = FeatureLibrary(root)  # the pool still matches
    assert copy.causal_config(block)["scenes"] == 2


def test_the_features_card_and_the_paint_info_line_show_the_causal_score_next_to_auroc(library, tmp_path):
    from app import Workbench
    from ui.features import FeaturesTab
    from ui.paint import PaintTab

    bench = Workbench("toy", data_dir=tmp_path / "data")
    picked = bench.library.search(RED_BLOCK, "red")[0]
    card = bench.library.card(RED_BLOCK, picked)
    scores = f"AUROC {card['auroc']:.3f}, causal label {card['causal_label']:.2f}"
    text, _ = FeaturesTab(bench).feature_card(RED_BLOCK, picked)
    assert f"**Label:** colour=red ({scores}" in text and "**Causal label:**" in text
    *_, info = PaintTab(bench).paint("a large blue star in the center on a white background", 1, 0, RED_BLOCK, "",
                                     "red", 3, "all", None, progress=lambda *a, **k: None)
    assert info.startswith(f"{RED_BLOCK} feature {picked} (colour=red) [{scores}")

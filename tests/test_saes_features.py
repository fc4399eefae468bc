"""Feature analysis: AUROC labels on the shapes world, features.json as the library reads it,
the HTML page, and the `python -m saes features` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from interp.zoo import shapes
from saes.features import (AnalysisConfig, AnalysisPool, analyse, analyse_block, attribute_targets, auroc_matrix,
                           generate_pool)
from saes.library import FeatureLibrary, load_analysis_images
from saes.sae import SAE, SAEConfig

GRID = 8  # block positions per side, as on the toy model


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _identity_sae(channels: int) -> SAE:
    """Feature f = ReLU(channel f): an SAE whose features are known exactly."""
    sae = SAE(SAEConfig(architecture="standard", d_in=channels, d_sae=channels))
    sae.W_enc.data.copy_(torch.eye(channels))
    sae.W_dec.data.copy_(torch.eye(channels))
    return sae


def _scenes(n: int, seed: int = 0) -> list[shapes.Scene]:
    rng = np.random.default_rng(seed)
    return [shapes.sample_scene(rng) for _ in range(n)]


def _tracking_updates(scenes, noise_seed: int = 0) -> torch.Tensor:
    """(N, 4, 8, 8) updates: channel 0 lights the cells of red objects, channel 1 those of stars,
    channel 2 the background of blue-background images, channel 3 is noise."""
    names, targets = attribute_targets(scenes, GRID, GRID)
    index = {name: t for t, name in enumerate(names)}
    grid = targets.reshape(len(names), len(scenes), GRID, GRID)
    rng = np.random.default_rng(noise_seed)
    updates = np.zeros((len(scenes), 4, GRID, GRID), np.float32)
    updates[:, 0] = grid[index[("colour", "red")]] * rng.uniform(1, 2, (len(scenes), GRID, GRID))
    updates[:, 1] = grid[index[("shape", "star")]] * rng.uniform(1, 2, (len(scenes), GRID, GRID))
    updates[:, 2] = grid[index[("background", "blue")]] * 0.5
    updates[:, 3] = rng.uniform(0, 1, (len(scenes), GRID, GRID))
    return torch.from_numpy(updates)


def test_auroc_matrix_equals_sklearn_with_ties():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    activations = np.where(rng.random((300, 5)) < 0.7, 0.0, rng.integers(1, 4, (300, 5)).astype(float))
    targets = rng.random((3, 300)) < np.array([[0.1], [0.5], [0.9]])
    result = auroc_matrix(activations, targets)
    for t in range(3):
        for f in range(5):
            assert result[t, f] == pytest.approx(roc_auc_score(targets[t], activations[:, f]), abs=1e-12)


def test_targets_mark_the_cell_of_each_object_and_the_background_around_them():
    scene = shapes.Scene((shapes.ShapeObject("star", "red", "large", "striped", "top left"),
                          shapes.ShapeObject("circle", "green", "small", "solid", "bottom right")), "blue")
    names, targets = attribute_targets([scene], GRID, GRID)
    grid = {name: targets[t].reshape(GRID, GRID) for t, name in enumerate(names)}
    expected = np.zeros((GRID, GRID), bool)
    expected[0:3, 0:3] = True  # cell_box("top left", 8): rows and columns 0..2
    for name in [("colour", "red"), ("shape", "star"), ("texture", "striped"), ("size", "large"),
                 ("position", "top left")]:
        assert np.array_equal(grid[name], expected), name
    assert grid[("colour", "green")][5:, 5:].all() and grid[("colour", "green")].sum() == 9
    assert not grid[("colour", "blue")].any()  # no blue object: the blue background is its own attribute
    background = grid[("background", "blue")]
    assert background[3:5, :].all() and not background[1, 1] and not background[6, 6]
    assert not grid[("background", "white")].any()


def test_a_feature_that_tracks_an_attribute_gets_its_label():
    scenes = _scenes(120)
    cards, summary = analyse_block(_identity_sae(4), _tracking_updates(scenes), scenes)
    assert (cards[0]["label"], cards[1]["label"], cards[2]["label"]) == ("colour=red", "shape=star", "background=blue")
    assert cards[0]["auroc"] == pytest.approx(1.0) and cards[1]["auroc"] == pytest.approx(1.0)
    assert cards[2]["auroc"] == pytest.approx(1.0)
    # Noise predicts nothing: its best AUROC stays near chance and it gets no label.
    assert cards[3]["label"] is None and cards[3]["auroc"] < 0.6
    assert summary["colour=red"]["best_feature"] == 0 and summary["colour=red"]["best_labelled_feature"] == 0
    assert summary["shape=star"]["best_auroc"] == pytest.approx(1.0)
    # Firing statistics: channel 2 is 0.5 wherever it fires.
    assert cards[2]["mean_activation"] == pytest.approx(0.5)
    red_positions = sum(float((_tracking_updates([s])[0, 0] > 0).float().mean()) for s in scenes) / len(scenes)
    assert cards[0]["frequency"] == pytest.approx(red_positions)


def _synthetic_pool(n: int = 40) -> AnalysisPool:
    scenes = _scenes(n, seed=1)
    rng = np.random.default_rng(1)
    prompts = [shapes.caption(s, rng) for s in scenes]
    images = np.stack([shapes.render(s) for s in scenes])
    return AnalysisPool(images, prompts, list(range(n)), {"mid_block.attentions.0": _tracking_updates(scenes)})


def test_features_json_is_written_in_the_library_format(tmp_path):
    pool = _synthetic_pool()
    sae_dir = tmp_path / "toy" / "mid_block.attentions.0"
    sae = _identity_sae(4)
    sae.save(sae_dir)
    summary = analyse({"mid_block.attentions.0": (sae, sae_dir)}, pool, "toy", tmp_path / "html",
                      AnalysisConfig(n_top_images=3))
    data = json.loads((sae_dir / "features.json").read_text())
    assert set(data) == {"block", "model", "n_images", "features"}
    assert (data["block"], data["model"], data["n_images"]) == ("mid_block.attentions.0", "toy", 40)
    assert [c["id"] for c in data["features"]] == [0, 1, 2, 3]
    for card in data["features"]:
        assert {"id", "frequency", "mean_activation", "label", "attribute", "value", "auroc",
                "top_images"} <= set(card)
        assert 1 <= len(card["top_images"]) <= 3
        activations = [t["activation"] for t in card["top_images"]]
        assert activations == sorted(activations, reverse=True)
        for top in card["top_images"]:
            heatmap = np.array(top["heatmap"])
            assert heatmap.shape == (GRID, GRID) and 0 <= top["index"] < 40
            assert heatmap.max() == pytest.approx(top["activation"], abs=1e-3)
    # The top image of the red feature shows a red object where the heatmap is hot.
    top = data["features"][0]["top_images"][0]
    assert any(o.colour == "red" for o in shapes.parse_caption(pool.prompts[top["index"]]).objects)

    library = FeatureLibrary(tmp_path / "toy")
    assert library.cards("mid_block.attentions.0")[0]["label"] == "colour=red"
    assert library.search("mid_block.attentions.0", "star") == [1]
    images, prompts = load_analysis_images(tmp_path / "toy")
    assert images.dtype == np.uint8 and images.shape == (40, 64, 64, 3) and prompts == pool.prompts

    html = (tmp_path / "html" / "features.html").read_text()
    assert html.count("data:image/png;base64,") >= 4 and "colour=red" in html
    written = json.loads((tmp_path / "html" / "features_summary.json").read_text())
    assert written == json.loads(json.dumps(summary))
    assert written["best_block"]["colour=red"] == {"block": "mid_block.attentions.0", "feature": 0,
                                                   "auroc": pytest.approx(1.0)}


def test_captions_outside_the_world_give_statistics_without_labels():
    pool = _synthetic_pool(8)
    pool.prompts = ["a photo of a cat"] * 8
    assert pool.scenes() is None
    cards, summary = analyse_block(_identity_sae(4), pool.updates["mid_block.attentions.0"], pool.scenes())
    assert summary == {} and all(c["label"] is None and c["auroc"] is None for c in cards)
    assert cards[3]["frequency"] > 0.9


def test_pool_of_a_generation_holds_images_and_last_step_updates():
    from test_hooks_diffusion import random_t2i

    model = random_t2i()
    prompts = ["a red circle on a blue background", "a small green star at the top left"]
    pool = generate_pool(model, ["mid_block.attentions.0"], prompts, [0, 1], steps=2, progress=False)
    assert pool.images.shape == (2, 64, 64, 3) and pool.images.dtype == np.uint8
    assert pool.updates["mid_block.attentions.0"].shape == (2, 64, 8, 8)
    assert pool.scenes()[1].objects[0].position == "top left"


def test_features_command_on_a_saved_pipeline_and_its_errors(tmp_path, capsys):
    from test_store import saved_random_pipeline

    from saes.__main__ import main

    root = tmp_path / "sae"
    sae = SAE(SAEConfig(architecture="topk", d_in=64, d_sae=32, k=4, metadata={"hook_name": "unet.mid_block.attentions.0"}))
    torch.manual_seed(0)
    sae.W_enc.data.normal_()
    sae.W_dec.data.normal_()
    sae.save(root / "mid_block.attentions.0")
    args = ["features", "--model", saved_random_pipeline(), "--sae", str(root), "--world", "6", "--steps", "1",
            "--top", "2", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    data = json.loads((root / "mid_block.attentions.0" / "features.json").read_text())
    assert data["block"] == "mid_block.attentions.0" and data["n_images"] == 6 and len(data["features"]) == 32
    assert (root / "analysis_images.npz").exists() and (tmp_path / "out" / "features.html").exists()

    bad = SAE(SAEConfig(architecture="topk", d_in=32, d_sae=8, k=2, metadata={"hook_name": "mid_block.attentions.0"}))
    bad.save(tmp_path / "bad")
    assert main(["features", "--model", saved_random_pipeline(), "--sae", str(tmp_path / "bad"), "--world", "2",
                 "--out", str(tmp_path / "o2")]) == 2
    assert "reads 32 channels but mid_block.attentions.0 has 64" in capsys.readouterr().err
    assert main(["features", "--model", saved_random_pipeline(), "--sae", str(root), "--out", str(tmp_path)]) == 2
    assert "--store DIR or --world N" in capsys.readouterr().err

"""Feature analysis: AUROC labels on the shapes world, features.json as the library reads it,
the HTML page, and the `python -m saes features` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from zoo import shapes
from saes.features import analyse
from saes.library import FeatureLibrary
from saes.pool import AnalysisPool, generate_pool, load_analysis_images
from saes.probes import (AnalysisConfig, analyse_block, auroc_matrix, background_targets, cell_maxima,
                         cell_probe_accuracy, cell_targets, direction_ceiling, mixture_distances)
from saes.sae import SAE, SAEConfig

GRID = 8  # block positions per side, as on the toy model
WORLD = shapes.WORLD  # the scenes' ground truth (their layout included)


def _identity_sae(channels: int) -> SAE:
    """Feature f = ReLU(channel f): an SAE whose features are known exactly."""
    sae = SAE(SAEConfig(architecture="standard", d_in=channels, d_sae=channels))
    sae.W_enc.data.copy_(torch.eye(channels))
    sae.W_dec.data.copy_(torch.eye(channels))
    return sae


def _scenes(n: int, seed: int = 0) -> list[shapes.Scene]:
    rng = np.random.default_rng(seed)
    return [shapes.sample_scene(rng) for _ in range(n)]


def _cells_of(scene, **attributes) -> np.ndarray:
    """(8, 8) bool: the block positions of the grid cells holding objects with these attributes."""
    grid = np.zeros((GRID, GRID), bool)
    for obj in scene.objects:
        if all(getattr(obj, k) == v for k, v in attributes.items()):
            x0, y0, x1, y1 = shapes.cell_box(obj.position, GRID)
            grid[y0:y1, x0:x1] = True
    return grid


def _tracking_updates(scenes, noise_seed: int = 0) -> torch.Tensor:
    """(N, 4, 8, 8) updates: channel 0 lights the cells of red objects, channel 1 those of stars,
    channel 2 the blue background outside objects, channel 3 is noise."""
    rng = np.random.default_rng(noise_seed)
    updates = np.zeros((len(scenes), 4, GRID, GRID), np.float32)
    _, background = background_targets(scenes, GRID, GRID, truth=WORLD)
    blue = background[[n for n in shapes.BACKGROUNDS].index("blue")].reshape(len(scenes), GRID, GRID)
    for i, scene in enumerate(scenes):
        updates[i, 0] = _cells_of(scene, colour="red") * rng.uniform(1, 2, (GRID, GRID))
        updates[i, 1] = _cells_of(scene, shape="star") * rng.uniform(1, 2, (GRID, GRID))
        updates[i, 2] = blue[i] * 0.5
        updates[i, 3] = rng.uniform(0, 1, (GRID, GRID))
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
    names, targets, occupied = cell_targets([scene], truth=WORLD)
    assert occupied.tolist() == [True] + [False] * 7 + [True]  # top left and bottom right
    cells = {name: targets[t] for t, name in enumerate(names)}  # (occupied cells,) each
    for name in [("colour", "red"), ("shape", "star"), ("texture", "striped"), ("size", "large"),
                 ("position", "top left")]:
        assert cells[name].tolist() == [True, False], name
    assert cells[("colour", "green")].tolist() == [False, True]
    assert not cells[("colour", "blue")].any()  # no blue object: the blue background is its own attribute
    back_names, back = background_targets([scene], GRID, GRID, truth=WORLD)
    grid = {name: back[t].reshape(GRID, GRID) for t, name in enumerate(back_names)}
    assert grid[("background", "blue")][3:5, :].all()
    assert not grid[("background", "blue")][1, 1] and not grid[("background", "blue")][6, 6]
    assert not grid[("background", "white")].any()
    # A cell's score is the largest activation among its block positions (cell_box at 8 x 8: 0-2, 3-4, 5-7).
    latents = torch.zeros(1, GRID, GRID, 1)
    latents[0, 4, 6, 0] = 2.0
    assert cell_maxima(latents, truth=WORLD)[:, 0].tolist() == [0, 0, 0, 0, 0, 2.0, 0, 0, 0]  # the "right" cell


class _HalvesWorld:
    """A second world's layout: the shapes world's objects on two cells, the image's left and right halves."""

    name, image_size, cells = "halves", shapes.IMAGE_SIZE, ("left", "right")

    def attribute_values(self):
        return [(a, v) for a, v in WORLD.attribute_values() if a != "position" or v in self.cells]

    def cell_box(self, cell, size):
        return (0, 0, size // 2, size) if cell == "left" else (size // 2, 0, size, size)

    def object_mask(self, obj, size):
        return WORLD.object_mask(obj, size)

    def foreground_mask(self, scene, size):
        return WORLD.foreground_mask(scene, size)


def test_the_targets_take_the_grid_from_the_scenes_world():
    scene = shapes.Scene((shapes.ShapeObject("star", "red", position="left"),
                          shapes.ShapeObject("circle", "green", position="right")), "blue")
    halves = _HalvesWorld()
    names, targets, occupied = cell_targets([scene, None], truth=halves)
    assert occupied.tolist() == [True, True, False, False]  # two cells per image
    cells = {name: targets[t] for t, name in enumerate(names)}
    assert cells[("colour", "red")].tolist() == [True, False] and cells[("position", "right")].tolist() == [False, True]
    latents = torch.zeros(2, GRID, GRID, 1)
    latents[0, 4, 6, 0] = 2.0
    assert cell_maxima(latents, truth=halves)[:, 0].tolist() == [0, 2.0, 0, 0]  # the right half
    back_names, back = background_targets([scene], GRID, GRID, truth=halves)
    assert back[back_names.index(("background", "blue"))].reshape(GRID, GRID)[0].all()


def test_a_feature_firing_on_every_object_is_not_taken_for_a_colour_or_shape():
    scenes = _scenes(120)
    rng = np.random.default_rng(3)
    objectness = torch.from_numpy(np.stack([_cells_of(s) * rng.uniform(1, 2, (GRID, GRID)) for s in scenes]))
    cards, _ = analyse_block(_identity_sae(1), objectness[:, None].float(), scenes, truth=WORLD)
    # Among occupied cells it predicts nothing (with empty cells counted it would score about
    # 0.87 for colour=red: "an object is here" would pass for "a red object is here").
    assert cards[0]["label"] is None and cards[0]["auroc"] < 0.7


def test_a_feature_that_tracks_an_attribute_gets_its_label():
    scenes = _scenes(120)
    cards, summary = analyse_block(_identity_sae(4), _tracking_updates(scenes), scenes, truth=WORLD)
    assert (cards[0]["label"], cards[1]["label"], cards[2]["label"]) == ("colour=red", "shape=star", "background=blue")
    assert cards[0]["auroc"] == pytest.approx(1.0) and cards[1]["auroc"] == pytest.approx(1.0)
    assert cards[2]["auroc"] == pytest.approx(1.0)
    # Noise predicts nothing: its best AUROC stays well below the label threshold (0.7).
    assert cards[3]["label"] is None and cards[3]["auroc"] < 0.65
    assert summary["colour=red"]["best_feature"] == 0 and summary["colour=red"]["best_labelled_feature"] == 0
    assert summary["shape=star"]["best_auroc"] == pytest.approx(1.0)
    # Firing statistics: channel 2 is 0.5 wherever it fires.
    assert cards[2]["mean_activation"] == pytest.approx(0.5)
    red_positions = float(np.mean([_cells_of(s, colour="red").mean() for s in scenes]))
    assert cards[0]["frequency"] == pytest.approx(red_positions)
    # it fires on every red object and on no object of another colour
    assert cards[0]["firing_by_value"]["red"] == 1.0 and len(cards[0]["firing_by_value"]) > 1
    assert all(share == 0.0 for colour, share in cards[0]["firing_by_value"].items() if colour != "red")


def test_cell_probes_read_the_attribute_a_block_codes_and_not_one_it_lacks():
    scenes = _scenes(300, seed=3)
    rng = np.random.default_rng(0)
    colour_code = rng.normal(size=(len(shapes.COLOURS), 6)).astype(np.float32)
    updates = rng.normal(scale=0.3, size=(len(scenes), 6, GRID, GRID)).astype(np.float32)
    for i, scene in enumerate(scenes):  # each object's cells carry its colour's code, nothing about its shape
        for obj in scene.objects:
            cells = _cells_of(shapes.Scene((obj,), scene.background), colour=obj.colour)
            updates[i][:, cells] += colour_code[list(shapes.COLOURS).index(obj.colour)][:, None]
    probes = cell_probe_accuracy(torch.from_numpy(updates), scenes, truth=WORLD)
    assert probes["colour"]["accuracy"] > 0.9 > probes["colour"]["chance"] + 0.5
    assert probes["shape"]["accuracy"] < probes["shape"]["chance"] + 0.15
    assert probes["colour"]["n_test"] > 100


def _colour_coded_updates(scenes, colour_code: np.ndarray, seed: int = 0) -> torch.Tensor:
    """(N, channels, 8, 8) noise plus, in each object's cells, its colour's row of colour_code."""
    rng = np.random.default_rng(seed)
    updates = rng.normal(scale=0.3, size=(len(scenes), colour_code.shape[1], GRID, GRID)).astype(np.float32)
    for i, scene in enumerate(scenes):
        for obj in scene.objects:
            cells = _cells_of(shapes.Scene((obj,), scene.background), colour=obj.colour)
            updates[i][:, cells] += colour_code[list(shapes.COLOURS).index(obj.colour)][:, None]
    return torch.from_numpy(updates)


def test_value_dims_tell_a_hue_circle_from_one_direction_per_colour():
    scenes = _scenes(200, seed=4)
    own = 3 * np.eye(len(shapes.COLOURS), dtype=np.float32)  # colour i writes channel i
    angles = 2 * np.pi * np.arange(len(shapes.COLOURS)) / len(shapes.COLOURS)
    circle = np.zeros_like(own)
    circle[:, 0], circle[:, 1] = 3 * np.cos(angles), 3 * np.sin(angles)
    dims_own = cell_probe_accuracy(_colour_coded_updates(scenes, own), scenes, truth=WORLD)["colour"]["dims"]
    dims_circle = cell_probe_accuracy(_colour_coded_updates(scenes, circle), scenes, truth=WORLD)["colour"]["dims"]
    assert dims_circle == pytest.approx(2.0, abs=0.2)
    assert dims_own > 6.0  # at most 7 for 8 colours: a simplex


def test_mixture_distance_finds_a_colour_coded_halfway_between_two_others():
    scenes = _scenes(200, seed=6)
    code = 3 * np.random.default_rng(2).normal(size=(len(shapes.COLOURS), 8)).astype(np.float32)
    names = list(shapes.COLOURS)
    code[names.index("orange")] = (code[names.index("red")] + code[names.index("yellow")]) / 2
    mixture = mixture_distances(_colour_coded_updates(scenes, code), scenes, ("colour",), truth=WORLD)
    assert set(mixture) == {f"colour={name}" for name in names}
    others = min(d for name, d in mixture.items() if name != "colour=orange")
    assert others > 1.0
    assert mixture["colour=orange"] < 0.1 * others  # a mixture of red and yellow: no direction of its own


def test_direction_ceiling_reaches_the_coded_colours_and_not_the_uncoded_shapes():
    scenes = _scenes(200, seed=5)
    code = 2 * np.random.default_rng(1).normal(size=(len(shapes.COLOURS), 8)).astype(np.float32)
    ceiling = direction_ceiling(_colour_coded_updates(scenes, code), scenes, ("colour", "shape"), truth=WORLD)
    assert {label.split("=")[0] for label in ceiling} == {"colour", "shape"}
    assert min(v for label, v in ceiling.items() if label.startswith("colour=")) > 0.95
    assert max(v for label, v in ceiling.items() if label.startswith("shape=")) < 0.7
    # a sample of the positions is enough to find the directions
    sampled = direction_ceiling(_colour_coded_updates(scenes, code), scenes, ("colour",), max_positions=2000,
                                truth=WORLD)
    assert min(sampled.values()) > 0.95


class _SizeKeyedWorld:
    """The shapes world with other roles: its key attribute is size, and only colour and size are object attributes."""
    key_attributes = ("size",)
    object_attributes = ("colour", "size")

    def __getattr__(self, name):
        return getattr(WORLD, name)


def test_the_probes_ask_about_the_worlds_attributes_unless_told():
    """No probe names a world's attributes: left to their defaults they read the world's roles."""
    scenes = _scenes(60, seed=7)
    updates = _colour_coded_updates(scenes, np.random.default_rng(3).normal(size=(len(shapes.COLOURS), 8)))
    world = _SizeKeyedWorld()
    assert {label.split("=")[0] for label in direction_ceiling(updates, scenes, truth=world)} == {"size"}
    assert {label.split("=")[0] for label in mixture_distances(updates, scenes, truth=world)} == {"size"}
    assert set(cell_probe_accuracy(updates, scenes, truth=world)) == {"colour", "size"}
    assert set(cell_probe_accuracy(updates, scenes, truth=WORLD)) == set(WORLD.object_attributes)


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
    assert set(data) == {"block", "model", "n_images", "pool_sha256", "features"}
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
    assert pool.scenes() is None and pool.truth() is None
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
    assert pool.truth() is WORLD and pool.scenes()[1].objects[0].position == "top left"


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


def test_a_block_too_coarse_for_the_worlds_cells_is_refused_before_any_work(tmp_path, capsys):
    """SD 1.x's deepest block at a small size: a 2 x 2 grid against the shapes world's 3 x 3 cells, where the middle
    row and column hold no block position (amax's IndexError of old). One line, no image generated, nothing
    written; a 3 x 3 block is read."""
    import sys
    from pathlib import Path

    from saes.__main__ import main
    from saes.probes import BlockGridError, cell_means

    with pytest.raises(BlockGridError, match="2 x 2 grid, too coarse for the world's 9 cells"):
        cell_maxima(torch.ones(2, 2, 2, 4), truth=WORLD)
    assert cell_means(torch.ones(2, 4, 3, 3), truth=WORLD).shape == (2 * 9, 4)

    # analyse: refused before anything is written
    scenes = _scenes(4)
    pool = AnalysisPool(np.zeros((4, 8, 8, 3), np.uint8), [WORLD.caption(s) for s in scenes], [0, 1, 2, 3],
                        {"mid_block.attentions.0": torch.ones(4, 4, 2, 2)})
    with pytest.raises(BlockGridError):
        analyse({"mid_block.attentions.0": (_identity_sae(4), tmp_path / "sae")}, pool, "tiny", tmp_path / "out",
                pool_dir=tmp_path / "pool")
    assert not any((tmp_path / d).exists() for d in ("out", "pool", "sae"))

    # the command on a tiny SD 1.x whose mid block is 2 x 2 at its default size
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_diffusers import tiny_pipeline

    pipe = tiny_pipeline("sd1")
    pipe.unet.register_to_config(sample_size=4)  # 8 px images: the mid block (second level) is 2 x 2
    pipe.save_pretrained(tmp_path / "sd1")
    sae_dir = tmp_path / "sae" / "mid_block.attentions.0"
    SAE(SAEConfig(architecture="topk", d_in=16, d_sae=8, k=2, metadata={"hook_name": "mid_block.attentions.0"})
        ).save(sae_dir)
    assert main(["features", "--model", str(tmp_path / "sd1"), "--sae", str(sae_dir), "--world", "4",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()  # above it: the pipeline's loading bars
    assert err.splitlines()[-1].startswith("error: mid_block.attentions.0 is a 2 x 2 grid") and "Traceback" not in err
    assert not (tmp_path / "out").exists() and sorted(p.name for p in sae_dir.iterdir()) == \
        ["cfg.json", "sae_weights.safetensors"]

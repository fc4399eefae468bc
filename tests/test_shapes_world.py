import numpy as np
import pytest

from zoo import shapes
from zoo.shapes import (AttributeProbe, Scene, ShapeObject, WorldError, caption, is_held_out,
                               parse_caption, render, sample_scene)


def test_world_has_the_attribute_ranges_the_project_needs():
    assert len(shapes.SHAPES) >= 6 and len(shapes.COLOURS) >= 8 and len(shapes.SIZES) == 2
    assert len(shapes.POSITIONS) == 9 and len(shapes.BACKGROUNDS) >= 6
    assert set(shapes.TEXTURES) == {"solid", "striped", "dotted"}


def test_every_varied_caption_parses_back_to_its_scene():
    rng = np.random.default_rng(0)
    wordings = set()
    for _ in range(500):
        scene = sample_scene(rng)
        text = caption(scene, rng)
        wordings.add(text)
        assert parse_caption(text) == scene, text
    assert len(wordings) == 500


def test_captions_read_as_plain_english_with_defaults():
    scene = parse_caption("a small red circle at the top left on a blue background")
    assert scene == Scene((ShapeObject("circle", "red", "small", "solid", "top left"),), "blue")
    two = parse_caption("a blue square and a yellow star on a white background")
    assert [(o.shape, o.colour, o.position) for o in two.objects] == [("square", "blue", "left"),
                                                                       ("star", "yellow", "right")]
    assert parse_caption("A big green dotted triangle in the middle.").objects[0] == \
        ShapeObject("triangle", "green", "large", "dotted", "center")


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("a red dragon on a white background", "dragon"),
    ("a red circle on a purple background", "background"),
    ("a red circle, a blue square, a green star and a pink cross", "1 to 3"),
    ("a red circle at the top and a blue star at the top", "share a position"),
    ("a blue circle on a blue background", "invisible"),
])
def test_captions_outside_the_world_are_rejected_with_a_reason(text, message):
    with pytest.raises(WorldError, match=message):
        parse_caption(text)


def test_renderer_draws_the_object_in_its_cell_in_its_colour():
    scene = parse_caption("a large red square at the bottom right on a white background")
    img = render(scene).astype(int)
    x0, y0, x1, y1 = shapes.cell_box("bottom right")
    cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
    assert tuple(img[cy, cx]) == shapes.COLOURS["red"]
    assert tuple(img[5, 5]) == shapes.BACKGROUNDS["white"]
    assert np.all(img[:x0 - 1, :] == shapes.BACKGROUNDS["white"])  # nothing outside its cell


def test_probe_reads_rendered_images_at_least_98_percent_per_attribute():
    rng = np.random.default_rng(1)
    probe = AttributeProbe()
    scores = []
    for _ in range(150):
        scene = sample_scene(rng)
        noisy = np.clip(render(scene) + rng.normal(0, 8, (64, 64, 3)), 0, 255)  # robust to noise, not just exact
        scores.append(probe.score(noisy, scene))
    per_attribute = {k: np.mean([s[k] for s in scores]) for k in scores[0]}
    for attribute in ("background",) + shapes.ATTRIBUTES:
        assert per_attribute[attribute] >= 0.98, per_attribute


def test_probe_tells_a_changed_attribute():
    scene = parse_caption("a small red striped circle at the top on a gray background")
    changed = shapes.replace_object(scene, "top", shape="star", colour="blue")
    reading = AttributeProbe().read(render(changed))
    assert reading.at("top").shape == "star" and reading.at("top").colour == "blue"
    assert reading.at("top").texture == "striped" and reading.background == "gray"


def test_held_out_split_is_stable_and_about_a_tenth():
    rng = np.random.default_rng(2)
    scenes = [sample_scene(rng, 1) for _ in range(2000)]
    held = [is_held_out(s) for s in scenes]
    assert 0.07 < np.mean(held) < 0.13
    assert held == [is_held_out(Scene.from_dict(s.to_dict())) for s in scenes]
    assert all(is_held_out(shapes.sample_split(rng, "held_out", 1)) for _ in range(20))

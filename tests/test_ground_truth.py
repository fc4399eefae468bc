"""The ground-truth interface (issue 20): the shapes world implements it, the toy model gets it, a real model and
prompts outside every world get None, and the work that needs it says so instead of running shapes-world code."""

from __future__ import annotations

import numpy as np
import pytest

from interp.ground_truth import (WORLDS, GroundTruth, GroundTruthError, example_label, ground_truth_for,
                                 ground_truth_of, require_ground_truth, world)
from zoo import shapes


def test_the_shapes_world_is_a_ground_truth_of_its_own_captions():
    truth = world("shapes")
    assert isinstance(truth, GroundTruth) and truth is shapes.WORLD and truth.image_size == shapes.IMAGE_SIZE
    prompts = truth.prompts(20, seed=3)
    assert prompts == shapes.world_prompts(20, seed=3)
    assert truth.scenes(prompts) == [shapes.parse_caption(p) for p in prompts]
    assert truth.scenes(["a photo of a cat", prompts[0]]) == [None, shapes.parse_caption(prompts[0])]
    assert truth.scenes(["a photo of a cat"]) is None
    scene = truth.scene(prompts[0])
    assert truth.probe().score(shapes.render(scene), scene)["all"] == 1.0
    assert truth.probe() is truth.probe()  # one probe (its templates are cached)
    assert ("colour", "red") in truth.attribute_values() and truth.attribute_values()[-1][0] == "background"
    # its layout: the 3 x 3 grid, the objects' masks, held-out scenes and their captions
    assert truth.cells == shapes.POSITIONS and truth.cell_box("right", 8) == shapes.cell_box("right", 8) == (5, 3, 8, 5)
    assert (truth.object_mask(scene.objects[0], 16) == shapes.object_mask(scene.objects[0], 16)).all()
    assert (truth.foreground_mask(scene, truth.image_size) == shapes.foreground_mask(scene)).all()
    held_out = truth.held_out_scene(np.random.default_rng(1))
    assert held_out == shapes.sample_split(np.random.default_rng(1), "held_out") and shapes.is_held_out(held_out)
    assert truth.caption(held_out) == shapes.caption(held_out) and truth.scene(truth.caption(held_out)) == held_out


@pytest.mark.parametrize("name", list(WORLDS))
def test_a_world_names_its_attributes_by_role_consistently_with_its_values_and_its_probe(name):
    """What the report, splice fidelity, causal label scores and the Paint tab read instead of attribute names."""
    truth = world(name)
    attributes = list(dict.fromkeys(a for a, _ in truth.attribute_values()))
    assert attributes == [*truth.object_attributes, "background"] and "position" in truth.object_attributes
    assert truth.key_attributes and set(truth.key_attributes) <= set(truth.object_attributes)
    assert truth.hides_on_background is None or truth.hides_on_background in truth.object_attributes
    scene = truth.scene(truth.prompts(1, seed=0)[0])
    assert set(truth.probe().score(np.zeros((truth.image_size,) * 2 + (3,), np.uint8), scene)) >= \
        {"all", "background", *truth.object_attributes}
    attribute, _, value = example_label(truth).partition("=")
    assert attribute == truth.key_attributes[0] and (attribute, value) in truth.attribute_values()


def test_the_shapes_world_s_roles_are_its_colour_and_shape():
    truth = world("shapes")
    assert truth.object_attributes == shapes.ATTRIBUTES and truth.key_attributes == ("colour", "shape")
    assert truth.hides_on_background == "colour" and example_label(truth) == "colour=red"


def test_the_toy_model_has_the_shapes_worlds_ground_truth_and_a_real_model_none(toy_t2i):
    assert ground_truth_for("toy") is world("shapes") and ground_truth_for(toy_t2i) is world("shapes")
    assert ground_truth_for("sdxl-turbo") is None and ground_truth_for("stabilityai/sdxl-turbo") is None
    assert ground_truth_of(["a photo of a cat", "a red circle"]) is world("shapes")
    assert ground_truth_of(["a photo of a cat"]) is None
    with pytest.raises(GroundTruthError, match="unknown world 'mars'"):
        world("mars")


def test_work_that_needs_ground_truth_refuses_a_model_without_it_by_name():
    from test_hooks_diffusion import random_t2i

    from saes.causal import causal_label_scores
    from saes.report import build_report, probe_blocks

    model = random_t2i()  # a random pipeline: no world made it
    assert ground_truth_for(model) is None
    with pytest.raises(GroundTruthError, match="probing blocks for attributes needs a model made in a world whose "
                                               "scenes are known .*; random has no ground truth"):
        probe_blocks(model, n_images=2)
    with pytest.raises(GroundTruthError, match="a causal label score .* random has no ground truth"):
        causal_label_scores(None, model, "mid_block.attentions.0", [0])
    with pytest.raises(GroundTruthError, match=r"the SAE report .* random has no ground truth: `python -m saes eval "
                                               r"--store DIR`"):
        build_report(model, "no-saes-here")
    assert require_ground_truth("toy", "anything") is world("shapes")

"""Image SAEBench (saes/bench/image.py): every metric on a case whose answer is known.

The probing, localisation and absorption metrics run on synthetic block updates laid out by the shapes world's
exact object masks (each object writes its colour's direction where it covers the block), so an SAE whose
decoder holds those directions is a planted exact feature; splices run on the tiny pipelines of every family.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp.ground_truth import GroundTruthError, world
from saes.bench import image as bench
from saes.sae import SAE, SAEConfig

SIDE, CHANNELS, STRENGTH = 16, 24, 4.0


@pytest.fixture(scope="module")
def planted():
    """(truth, scenes, updates (n, C, 16, 16), colours): channel c < 8 is colour c's direction, written by every
    object of that colour in proportion to its coverage of each position, plus small noise everywhere."""
    truth = world("shapes")
    scenes = truth.scenes(truth.prompts(160, seed=3))
    colours = [v for a, v in truth.attribute_values() if a == "colour"]
    generator = torch.Generator().manual_seed(0)
    updates = 0.05 * torch.randn(len(scenes), CHANNELS, SIDE, SIDE, generator=generator)
    objects, coverage = bench.object_coverages(scenes, SIDE, SIDE, truth)
    for (i, obj), cov in zip(objects, coverage):
        updates[i, colours.index(obj.colour)] += STRENGTH * torch.from_numpy(cov)
    return truth, scenes, updates, colours


def _sae(w_enc: torch.Tensor, b_enc: torch.Tensor, w_dec: torch.Tensor) -> SAE:
    """A ReLU ("standard") SAE with these weights and no decoder bias."""
    sae = SAE(SAEConfig("standard", d_in=w_enc.shape[0], d_sae=w_enc.shape[1]))
    with torch.no_grad():
        sae.W_enc.copy_(w_enc)
        sae.b_enc.copy_(b_enc)
        sae.W_dec.copy_(w_dec)
    return sae


def _planted_sae(n_colours: int) -> SAE:
    """One feature per colour: its exact direction, firing where an object covers more than a tenth of a position."""
    eye = torch.eye(CHANNELS)[:, :n_colours]
    return _sae(eye, torch.full((n_colours,), -STRENGTH / 10), eye.T.contiguous())


def _random_sae(n: int = 16) -> SAE:
    """Random directions in the channels no attribute writes (a random SAE, seen from the attributes)."""
    generator = torch.Generator().manual_seed(1)
    directions = torch.zeros(CHANNELS, n)
    directions[8:] = torch.randn(CHANNELS - 8, n, generator=generator)
    directions /= directions.norm(dim=0, keepdim=True)
    return _sae(directions, torch.zeros(n), directions.T.contiguous())


def _pooled(truth, scenes, updates, sae):
    from saes.probes import encode_positions

    latents = encode_positions(sae, updates)
    objects, coverage = bench.object_coverages(scenes, SIDE, SIDE, truth)
    train_images = bench.image_split(len(scenes), 0)
    train = np.array([train_images[i] for i, _ in objects])
    raw = bench.pool_objects(updates.permute(0, 2, 3, 1), objects, coverage)
    return latents, bench.pool_objects(latents, objects, coverage), raw, bench.object_labels(
        objects, truth.object_attributes), train


def test_planted_feature_probes_at_one_and_localises_fully(planted):
    truth, scenes, updates, colours = planted
    latents, sae_x, raw_x, labels, train = _pooled(truth, scenes, updates, _planted_sae(len(colours)))
    metrics, details = bench.sparse_probing(sae_x, raw_x, {"colour": labels["colour"]}, train, ks=(1,))
    assert metrics["sae_top_1_test_accuracy"] == 1.0
    assert metrics["sae_top_1_test_accuracy_colour"] == 1.0
    # the top-1 latent chosen for each colour is that colour's own feature
    chosen = {v: row["sae_top_1_latents"][0] for v, row in details["attributes"]["colour"]["values"].items()}
    assert chosen == {c: colours.index(c) for c in chosen}
    local, local_details = bench.localisation(latents, scenes, truth)
    assert local["n_labelled"] == len(colours)
    assert {f["label"] for f in local_details["features"].values()} == {f"colour={c}" for c in colours}
    assert local["mean_localisation"] == 1.0
    assert local["mean_base_rate"] < 0.2  # firing everywhere would score this, not 1
    # the planted features are the main latents of their colour, and nothing absorbs them
    absorbed, absorbed_details = bench.absorption(sae_x, raw_x, {"colour": labels["colour"]}, train,
                                                  np.eye(CHANNELS)[:len(colours)])
    assert absorbed["mean_absorption_fraction_score"] == 0.0 and absorbed["mean_full_absorption_score"] == 0.0
    assert all(row["main_latents"][0] == colours.index(v.split("=")[1])
               for v, row in absorbed_details["values"].items())


def test_random_direction_sae_scores_at_chance(planted):
    truth, scenes, updates, _ = planted
    latents, sae_x, raw_x, labels, train = _pooled(truth, scenes, updates, _random_sae())
    metrics, _ = bench.sparse_probing(sae_x, raw_x, {"colour": labels["colour"]}, train, ks=(1, 5))
    assert abs(metrics["sae_top_1_test_accuracy"] - 0.5) < 0.1
    assert abs(metrics["sae_top_5_test_accuracy"] - 0.5) < 0.1
    assert metrics["raw_update_top_1_test_accuracy"] == 1.0  # the update itself carries colour exactly
    local, _ = bench.localisation(latents, scenes, truth)
    assert local["n_labelled"] == 0 and local["mean_localisation"] is None


def test_absorption_of_counts_a_compensating_latent():
    cos = np.array([1.0, 0.8, 0.0])  # latent 0 the main one, 1 aligned with the probe, 2 orthogonal
    # main latent silent, latent 1 carries the probe's projection: full absorption, fraction 1
    assert bench.absorption_of(np.array([0.0, 2.0, 5.0]), 1.6, cos, [0]) == (1.0, True)
    # main latent carries it all: none
    assert bench.absorption_of(np.array([2.0, 0.0, 5.0]), 2.0, cos, [0]) == (0.0, False)
    # shared: half the projection unaccounted by the main latent, carried by latent 1
    fraction, full = bench.absorption_of(np.array([1.0, 1.25, 0.0]), 2.0, cos, [0])
    assert fraction == pytest.approx(0.5) and not full


def test_morans_i_reads_blobs_and_checkerboards():
    blob = np.zeros((8, 8))
    blob[2:5, 2:5] = 1.0
    checker = np.indices((8, 8)).sum(0) % 2
    assert bench.morans_i(blob) > 0.5
    assert bench.morans_i(checker.astype(float)) == pytest.approx(-1.0)
    assert bench.morans_i(np.ones((4, 4))) is None


def test_loss_recovered_known_answers():
    clean, zero = torch.zeros(3, 5), torch.ones(3, 5)
    assert bench.loss_recovered(clean, clean, zero) == 1.0
    assert bench.loss_recovered(clean, zero, zero) == 0.0
    assert bench.loss_recovered(clean, 0.5 * zero, zero) == pytest.approx(0.75)
    assert bench.loss_recovered(clean, zero, clean) is None


def _run_of(probing: dict, absorption: dict) -> dict:
    """An experiments.image_saebench run: {(trainer, block): per-task top-1 accuracies} and {(trainer, block):
    per-concept absorption fractions}, with the metrics their means."""
    saes = {}
    for (trainer, block), tasks in probing.items():
        concepts = absorption[trainer, block]
        evals = {"image_sparse_probing": {
                     "metrics": {"sae_top_1_test_accuracy": float(np.mean(list(tasks.values())))},
                     "details": {"attributes": {"colour": {"values": {
                         v: {"sae_top_1_test_accuracy": a} for v, a in tasks.items()}}}}},
                 "image_absorption": {
                     "metrics": {"mean_absorption_fraction_score": float(np.mean(list(concepts.values())))},
                     "details": {"values": {c: {"absorption_fraction": f} for c, f in concepts.items()}}}}
        saes[f"{trainer}/{block}"] = {"trainer": trainer, "block": block, "evals": evals}
    return {"model": "toy", "saes": saes}


def test_trainer_summary_names_each_metrics_winner_its_margin_and_whether_it_is_noise():
    from saes.bench.results import trainer_summary

    tasks = ["red", "green", "blue", "pink"]
    # probing: a is 0.1 above b on every task of both blocks (paired: no noise), though the tasks differ widely
    base = {"red": 0.9, "green": 0.6, "blue": 0.8, "pink": 0.5}
    probing = {(t, b): {v: base[v] - (0.1 if t == "b" else 0.0) for v in tasks} for t in "ab" for b in ("x", "y")}
    # absorption (lower is better): b below a by 0.05 on average, but by +-0.3 from concept to concept: a tie
    absorption = {("a", b): dict(zip(tasks, [0.5, 0.5, 0.5, 0.5])) for b in ("x", "y")}
    absorption.update({("b", b): dict(zip(tasks, [0.8, 0.15, 0.75, 0.1])) for b in ("x", "y")})
    # the shipped TopK, on another budget, is shown beside the set but not ranked: its perfect probe wins nothing
    probing.update({("topk-shipped", b): dict.fromkeys(tasks, 1.0) for b in ("x", "y")})
    absorption.update({("topk-shipped", b): dict.fromkeys(tasks, 0.0) for b in ("x", "y")})
    headers, rows = trainer_summary(_run_of(probing, absorption))
    table = {row[0]: dict(zip(headers, row)) for row in rows}
    top1 = table["probe top-1"]
    assert (top1["winner"], top1["runner-up"], top1["margin"], top1["noise (2 SE)"], top1["blocks won"],
            top1["reading"]) == ("a", "b", 0.1, 0.0, "2/2", "wins")
    assert top1["mean"] == pytest.approx(0.7)
    absorbed = table["absorption"]
    assert (absorbed["winner"], absorbed["margin"], absorbed["reading"]) == ("b", 0.05, "tie")
    # paired differences (+0.3, -0.35, +0.25, -0.4) in each block: SE 0.188 a block, of the two blocks' mean 0.133
    assert absorbed["noise (2 SE)"] == pytest.approx(2 * 0.18819 / 2 ** 0.5, abs=1e-3)
    # one trainer: nothing to compare
    assert trainer_summary(_run_of({k: v for k, v in probing.items() if k[0] != "b"}, absorption))[1] == []


def test_image_saebench_finds_each_trainers_sae_and_refuses_a_missing_one_in_one_line(tmp_path):
    from experiments.image_saebench import load_saes, sae_directory

    shipped, trained = tmp_path / "shipped", tmp_path / "trained"
    assert sae_directory("topk-shipped", "b", shipped, trained) == shipped / "b"
    assert sae_directory("topk", "b", shipped, trained) == trained / "topk" / "b"  # the like-for-like TopK
    assert sae_directory("topk", "b", shipped, None) == shipped / "b"  # no trained set: the shipped one
    assert sae_directory("gated", "b", shipped, None) is None
    (shipped / "b").mkdir(parents=True)
    (shipped / "b" / "cfg.json").write_text("not read: every SAE is found before any is loaded")
    with pytest.raises(ValueError, match=r"^no gated SAE for b \(looked in .*trained/gated/b\); train it or drop"):
        load_saes(["topk-shipped", "gated"], ["b"], shipped, trained)


def test_unlearning_scores_from_readings():
    from zoo.shapes import ProbeReading, Scene, ShapeObject

    truth = world("shapes")
    red = ShapeObject("circle", "red", position="left")
    blue = ShapeObject("square", "blue", position="right")
    scene, other = Scene((red, blue), "white"), Scene((blue,), "white")

    def reading(background, *objects):
        r = ProbeReading(background)
        r.objects.extend(objects)
        return r

    before = [reading("white", red, blue), reading("white", blue)]
    after = [reading("white", ShapeObject("circle", "green", position="left"), blue),
             reading("white", ShapeObject("square", "pink", position="right"))]
    scores = bench.unlearning_scores(before, after, [scene, other], "colour", "red", truth.object_attributes)
    assert scores["unlearning_accuracy"] == 1.0  # the red circle is drawn green
    assert scores["in_domain_retention"] == 1.0  # still a large solid circle
    assert scores["cross_domain_retention"] == pytest.approx(4 / 5)  # the other image: its square lost its colour


def _identity_sae(channels: int) -> SAE:
    """decode(encode(x)) = relu(x) - relu(-x) = x: a perfect splice."""
    eye = torch.eye(channels)
    return _sae(torch.cat([eye, -eye], 1), torch.zeros(2 * channels), torch.cat([eye, -eye], 0))


@pytest.mark.parametrize("family", ["sd1", "pixart"])
def test_perfect_splice_recovers_one_and_zero_splice_zero(family):
    from tiny_diffusers import tiny_model

    model = tiny_model(family)
    block = next(iter(model.blocks))
    channels = model.blocks[block].channels
    prompts, seeds = ["a red circle", "a blue square at the top"], [0, 1]
    perfect, details = bench.image_reconstruction(model, _identity_sae(channels), block, prompts, seeds)
    assert perfect["denoiser_loss_recovered"] == pytest.approx(1.0, abs=1e-6)
    assert perfect["latent_loss_recovered"] == pytest.approx(1.0, abs=1e-6)
    assert details["denoiser_calls"] >= model.default_steps  # every call of the generation was compared
    nothing = _sae(torch.zeros(channels, 4), torch.zeros(4), torch.zeros(4, channels))
    zero, _ = bench.image_reconstruction(model, nothing, block, prompts, seeds)
    assert zero["denoiser_loss_recovered"] == 0.0 and zero["latent_loss_recovered"] == 0.0


def test_toy_sdxl_splice_and_probe(toy_t2i):
    """The toy (an SDXL pipeline with a world): the perfect splice is the clean run, and so are its images."""
    block = "up_blocks.1.attentions.2"
    truth = world("shapes")
    prompts = truth.prompts(2, seed=4)
    metrics, details = bench.image_reconstruction(toy_t2i, _identity_sae(toy_t2i.blocks[block].channels), block,
                                                  prompts, [0, 1], truth=truth, scenes=truth.scenes(prompts))
    assert metrics["denoiser_loss_recovered"] == pytest.approx(1.0, abs=1e-6)
    assert details["probe_spliced"] == details["probe_clean"]


def test_truth_evals_refuse_a_model_without_a_world():
    from tiny_diffusers import tiny_model

    model = tiny_model("sd1")
    block = next(iter(model.blocks))
    sae = _identity_sae(model.blocks[block].channels)
    for eval_type in sorted(bench.TRUTH_EVALS):
        with pytest.raises(GroundTruthError) as err:
            bench.run_image_evals(model, {"s": (block, sae)}, (eval_type,), work_dir="unused")
        assert "\n" not in str(err.value) and eval_type in str(err.value) and "has none" in str(err.value)
    with pytest.raises(ValueError, match="unknown image eval"):
        bench.run_image_evals(model, {"s": (block, sae)}, ("image_colour",))
    with pytest.raises(ValueError, match="n_images"):
        bench.ImageBenchConfig(n_images=10**9)


def test_registered_image_evals_write_saebench_results(toy_t2i, tmp_path):
    """`saes bench`'s registry runs an image eval on the toy's shipped SAE, and its envelope validates against the
    eval type's schema; a model without a world is refused by the eval's check, in one line."""
    from saes.bench.registry import BenchOptions, eval_types
    from saes.bench.schema import SchemaError, envelope, validate, write_result

    block = "up_blocks.1.attentions.2"
    sae = SAE.load(f"saes/pretrained/toy/{block}")
    registered = eval_types()
    assert set(bench.EVAL_TYPES) <= set(registered)
    options = BenchOptions(hook=block, model_name="toy", extra={"probe_images": 24})
    eval_type = registered["image_localisation"]
    eval_type.check(sae, toy_t2i, options)
    outcome = eval_type.run(sae, toy_t2i, options)
    result = envelope(eval_type.eval_type_id, outcome.config, outcome.metrics, outcome.details, outcome.unstructured,
                      sae=sae, sae_name=block, hook=block, model_name="toy")
    path = write_result(tmp_path / "image_localisation" / "r.json", result)
    assert path.is_file() and outcome.metrics["localisation"]["n_labelled"] >= 1
    broken = {**result, "eval_result_metrics": {"nonsense": {"x": 1.0}}}
    with pytest.raises(SchemaError):
        validate(broken)
    with pytest.raises(ValueError, match="probe_images"):
        eval_type.check(sae, toy_t2i, BenchOptions(hook=block, model_name="toy", extra={"probe_images": 10**7}))

    from tiny_diffusers import tiny_model

    tiny = tiny_model("sd1")
    tiny_block = next(iter(tiny.blocks))
    with pytest.raises(GroundTruthError, match="image_absorption is scored against a world"):
        registered["image_absorption"].check(_identity_sae(tiny.blocks[tiny_block].channels), tiny,
                                             BenchOptions(hook=tiny_block, model_name="tiny-sd1"))

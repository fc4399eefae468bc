"""The step-transfer experiment's measuring functions on inputs whose answer is known."""

import json

import pytest
import torch

from experiments.step_transfer import (feature_agreement, position_vectors, random_direction_sae,
                                       reconstruction_metrics)


def _sparse_latents(n: int = 400, d_sae: int = 16, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.rand(n, d_sae, generator=generator)
    return values * (torch.rand(n, d_sae, generator=generator) < 0.3)  # each feature fires on about 30% of rows


def test_identical_runs_agree_fully_and_a_rescaled_one_keeps_correlation_and_top_k():
    latents = _sparse_latents()
    same = feature_agreement(latents, latents.clone(), top_k=10, min_firing=20)
    assert same["features_compared"] == 16
    assert same["correlation"] == pytest.approx(1.0) and same["top_k_overlap"] == 1.0
    assert same["active_jaccard"] == 1.0
    scaled = feature_agreement(latents, 3 * latents, top_k=10, min_firing=20)
    assert scaled["correlation"] == pytest.approx(1.0) and scaled["top_k_overlap"] == 1.0


def test_rows_paired_with_other_positions_agree_about_as_chance_does():
    latents = _sparse_latents(n=2000)
    shuffled = latents[torch.randperm(len(latents), generator=torch.Generator().manual_seed(1))]
    result = feature_agreement(latents, shuffled, top_k=20, min_firing=20)
    assert abs(result["correlation"]) < 0.1
    assert result["top_k_overlap"] < 0.1          # chance: about 0.3 * 20 / 2000 rows
    assert result["active_jaccard"] < 0.3         # chance for two 30% sets: 0.09 / 0.51


def test_a_feature_silent_in_the_other_run_counts_as_no_agreement_and_rare_features_are_not_compared():
    latents = _sparse_latents()
    other = latents.clone()
    other[:, 0] = 0                 # feature 0 never fires in the other run
    latents[:, 1] = 0
    latents[:5, 1] = 1.0            # feature 1 fires on 5 rows only: below min_firing
    result = feature_agreement(latents, other, top_k=10, min_firing=20)
    assert result["features_compared"] == 15
    assert result["correlation"] == pytest.approx(14 / 15)
    assert result["top_k_overlap"] == pytest.approx(14 / 15)
    with pytest.raises(ValueError, match="one .n, d_sae. shape"):
        feature_agreement(latents, other[:-1])


def test_position_vectors_pair_the_same_image_and_position_across_settings():
    updates = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)  # (n, C, H, W)
    vectors = position_vectors(updates)
    assert vectors.shape == (2 * 4 * 5, 3)
    assert torch.equal(vectors[1 * 20 + 2 * 5 + 3], updates[1, :, 2, 3])


def test_the_random_direction_floor_reconstructs_far_less_than_an_sae_that_holds_the_data_directions():
    from saes.sae import SAE, SAEConfig

    d_in, d_sae, k = 32, 64, 4
    generator = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(d_in, d_in, generator=generator))[0][:, :8].T  # 8 orthonormal directions
    codes = torch.rand(5000, 8, generator=generator) * (torch.rand(5000, 8, generator=generator) < 0.4)
    vectors = codes @ basis                                  # each vector: at most 8 non-negative parts
    fitted = SAE(SAEConfig("topk", d_in, d_sae, k=8))
    fitted.W_dec.data[:8] = basis
    fitted.W_enc.data[:, :8] = basis.T
    assert reconstruction_metrics(fitted, vectors)["explained_variance"] == pytest.approx(1.0, abs=1e-5)
    floor = random_direction_sae(d_in, d_sae, k, seed=0)
    assert torch.allclose(floor.W_dec.norm(dim=1), torch.ones(d_sae))
    assert torch.equal(floor.W_enc, floor.W_dec.T)
    measured = reconstruction_metrics(floor, vectors)
    assert measured["explained_variance"] < 0.6 and measured["l0"] <= k
    assert torch.equal(random_direction_sae(d_in, d_sae, k, seed=0).W_dec, floor.W_dec)  # reproducible by seed


def test_update_drift_is_zero_for_the_same_updates_and_about_two_for_unrelated_ones():
    from experiments.step_transfer import update_drift

    generator = torch.Generator().manual_seed(0)
    updates = torch.randn(4000, 8, generator=generator)
    assert update_drift(updates, updates.clone()) == 0.0
    assert update_drift(updates, torch.randn(4000, 8, generator=generator)) == pytest.approx(2.0, abs=0.1)
    assert update_drift(updates, 1.5 * updates) == pytest.approx(0.25, abs=0.01)


def test_preservation_of_a_painted_label_counts_what_the_edit_should_leave_alone():
    from saes.causal import Trial, preserved
    from zoo import shapes

    target = shapes.ShapeObject("circle", "red", position="left")
    other = shapes.ShapeObject("square", "blue", position="right")
    before = shapes.ProbeReading("white", [target, other])
    trial = Trial("", 0, shapes.Scene((target, other), "white"), target, None)
    recoloured = shapes.ProbeReading("white", [shapes.ShapeObject("circle", "green", position="left"), other])
    # background, the other object's four attributes, the target's shape, size and texture, nothing new: 9 checks
    assert preserved(before, recoloured, "colour=green", trial, shapes.WORLD) == (1.0, 9)
    spilled = shapes.ProbeReading("black", [recoloured.objects[0], shapes.ShapeObject("square", "green",
                                                                                      position="right"),
                                            shapes.ShapeObject("star", "green", position="top")])
    share, n = preserved(before, spilled, "colour=green", trial, shapes.WORLD)
    assert n == 9 and share == pytest.approx(6 / 9)  # the background, the other's colour, a new object


def test_painted_labels_run_at_each_step_count_resume_and_fold_into_the_report(tmp_path, monkeypatch, capsys,
                                                                               toy_t2i):
    """`paint` at tiny size: `saes causal`'s measurement at 1 and 2 steps, resumable, read back by the report;
    `causal_label_scores(steps=...)` generates the unedited and the edited images at those steps."""
    import experiments.step_transfer as st
    from saes.causal import causal_label_scores
    from saes.library import FeatureLibrary

    library = FeatureLibrary.for_model("toy")
    block = "up_blocks.1.attentions.1"
    if library is None or block not in library.blocks:
        pytest.skip("needs the SAEs shipped for the toy model")
    chosen = st.paint_features(library, [block])
    assert chosen and all(b == block and label.split("=")[0] in st.PAINT_ATTRIBUTES for b, _, label in chosen)
    assert [f for _, f, _ in chosen] == [library.search(block, label)[0] for _, _, label in chosen]

    argv = ["paint", "--block", block, "--scenes", "1", "--steps", "1", "2", "--strength", "3",
            "--out", str(tmp_path)]
    assert st.main(argv) == 0
    assert capsys.readouterr().out.count("painting ") == 2
    files = sorted(tmp_path.glob("paint/steps*/*.json"))
    assert [f.relative_to(tmp_path).as_posix() for f in files] == [f"paint/steps1/{block}-s3.json",
                                                                  f"paint/steps2/{block}-s3.json"]
    stamps = [f.stat().st_mtime_ns for f in files]
    assert st.main(argv) == 0  # resumed: nothing painted again
    assert "painting " not in capsys.readouterr().out and [f.stat().st_mtime_ns for f in files] == stamps

    results = st.paint_results(st.Study(run_root=tmp_path))
    assert results["config"] == {"scenes": 1, "seed": st.PAINT_SEED, "sae": "saes/pretrained/toy", "steps": [1, 2],
                                 "strengths": [3.0]}
    assert [(e["block"], e["feature"], e["label"]) for e in results["features"]] == chosen
    for steps in ("1", "2"):
        for entry in results["scores"][steps]["3"][block].values():
            assert entry["causal_label_n"] == 1 and entry["causal_label_before"] == 0.0
            assert 0.0 <= entry["causal_label"] <= 1.0 and 0.0 <= entry["preservation"] <= 1.0
    summary = st.paint_summary_table({"paint": results})
    assert f"| 3 | 2 steps | {len(chosen)} |" in summary
    assert st.paint_table({"paint": results}).count(f"| {block} |") == len(chosen)

    originals: dict = {}
    feature = chosen[0][1]
    unedited = causal_label_scores(library, toy_t2i, block, [feature], n_scenes=1, strength=0.0, steps=2,
                                   originals=originals, preservation=True)[feature]
    assert [key[-1] for key in originals] == [2]  # the unedited generations were made at 2 steps
    assert unedited["causal_label"] == unedited["causal_label_before"] and unedited["preservation"] == 1.0


def test_the_causal_side_runs_on_a_base_model_at_its_own_steps_and_guidance(tmp_path, monkeypatch, capsys,
                                                                             tiny_toy_base):
    """Issue 33's causal side on the base model: `causal --base` and `paint --base` run RIEBench's edits and the
    painted labels with the 1-step SAEs on the base model's generations, at the steps and guidance of its
    recipe.json (3 steps, CFG 2 here), resumable, and the report reads them as a column of their own."""
    import experiments.step_transfer as st
    from saes.library import FeatureLibrary

    library = FeatureLibrary.for_model("toy")
    block = "up_blocks.1.attentions.1"
    if library is None or block not in library.blocks:
        pytest.skip("needs the SAEs shipped for the toy model")
    study = st.Study(run_root=tmp_path)  # the commands' study: the toy's SAEs, this run directory
    base = str(tiny_toy_base / "pipeline")
    column = "base, 3 steps, CFG 2"
    assert st.base_column(base) == column

    assert st.main(["causal", "--base", base, "--limit", "1", "--out", str(tmp_path)]) == 0
    run = json.loads((tmp_path / "riebench" / "base" / "run.json").read_text())
    assert run["run"]["model"] == base and run["run"]["steps"] == 3
    causal = st.causal_results(study, base)
    assert list(causal) == ["1", "2", "4", column] and causal[column]["failed"] == 0
    for label, categories in causal[column].items():
        if label != "failed":
            assert set(categories) == {"change colour", "change texture", "change shape"}
            assert all(c["n"] == 1 and 0 <= c["success"] <= 1 for c in categories.values())
    assert list(st.causal_results(study)) == ["1", "2", "4"]  # without --base, the toy's columns only
    assert f"| {column}: success / preservation |" in st.causal_table({"causal": causal})

    argv = ["paint", "--base", base, "--block", block, "--scenes", "1", "--steps", "1", "--strength", "3",
            "--out", str(tmp_path)]
    assert st.main(argv) == 0
    assert capsys.readouterr().out.count("painting ") == 2  # the toy at 1 step, then the base model
    painted = json.loads((tmp_path / "paint" / "base" / f"{block}-s3.json").read_text())
    assert (painted["config"]["steps"], painted["config"]["column"]) == (3, column)
    assert st.main(argv) == 0 and "painting " not in capsys.readouterr().out  # resumed
    results = st.paint_results(study, base)
    assert list(results["scores"]) == ["1", column] and results["config"]["base"] == [column]
    assert f"| 3 | {column} |" in st.paint_summary_table({"paint": results})
    assert list(st.paint_results(study)["scores"]) == ["1"]
    assert column in st._on_base(results["scores"]) and st._on_base({"1": {}, "2": {}}) == ""


def test_a_one_step_model_or_a_directory_without_a_recipe_is_refused_as_the_base_in_one_line(tmp_path, capsys):
    import experiments.step_transfer as st
    from zoo import WEIGHTS_DIR

    for one_step in (str(WEIGHTS_DIR / "t2i"), "toy"):  # by directory or by its embedded name
        assert st.main(["causal", "--base", one_step, "--out", str(tmp_path)]) == 2
        assert "one-step objective" in capsys.readouterr().err
    assert st.main(["paint", "--base", str(tmp_path / "nowhere"), "--out", str(tmp_path)]) == 2
    assert "has no recipe.json" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_the_files_of_a_base_setting_are_named_by_its_model_given_by_name_or_by_the_recipes_run_directory(tmp_path):
    """The captures and ceilings of a base model's settings live under a short, stable name: the embedded name
    (`toy-base`), or the run's for a recipe's `<run>/pipeline`, never the name of a directory above it."""
    import experiments.step_transfer as st

    assert st.Setting(4, 5.0, "uncond").slug == "steps4-g5-uncond"
    assert st.Setting(30, 5.0, "cond", "toy-base").slug == "toy-base-steps30-g5-cond"
    assert st.Setting(30, 5.0, "cond", str(tmp_path / "t2i-base" / "pipeline")).slug == "t2i-base-steps30-g5-cond"
    assert st.Setting(30, 5.0, "cond", str(tmp_path / "my-base")).slug == "my-base-steps30-g5-cond"


def test_the_tables_average_the_base_models_every_step_and_show_eight_of_its_thirty():
    """On the toy, a setting's first call is the 1-step call itself (agreement 1 by construction), so the agreement
    columns leave it out; the base model's first call is its own weights', so it counts. A 30-step setting's per-step
    cells show 8 steps, spread evenly and named in the row."""
    import experiments.step_transfer as st

    def entry(steps, first):
        agreement = [{"correlation": first if s == 0 else 0.5, "top_k_overlap": 0.5, "active_jaccard": 0.5,
                      "features_compared": 10} for s in range(steps)]
        per_step = [{"explained_variance": 0.9 - 0.01 * s} for s in range(steps)]
        return {kind: {"per_step": per_step, "agreement_per_step": agreement}
                for kind in ("shipped", "random", "ceiling")}

    data = {"model": "toy",
            "settings": {"1 step": {"model": "toy"}, "4 steps": {"model": "toy"}, "base": {"model": "toy-base"}},
            "blocks": {"b": {"1 step": entry(1, 1.0), "4 steps": entry(4, 1.0), "base": entry(30, 0.1)}},
            "update_drift": {"b": {"1 step": [0.0], "4 steps": [0.0] * 4, "base": [1.0] * 30}}}
    rows = {line.split(" | ")[1]: line for line in st.agreement_table(data).splitlines()[2:]}
    assert rows["4 steps"].split(" | ")[3] == "0.500"  # its first step (1.0) left out
    assert rows["base"].split(" | ")[3] == f"{(0.1 + 29 * 0.5) / 30:.3f}"  # every step of the base model
    per_step = st.per_step_table(data).splitlines()
    base_row = next(line for line in per_step if "base" in line)
    assert "base (steps 1, 5, 9, 13, 18, 22, 26, 30)" in base_row
    assert base_row.split(" | ")[3] == " / ".join(f"{0.9 - 0.01 * s:.2f}" for s in (0, 4, 8, 12, 17, 21, 25, 29))
    assert "| b | 4 steps | 0.000 / 0.000 / 0.000 / 0.000 |" in per_step[2]


@pytest.mark.parametrize("stem, model", [("step_transfer", "toy"), ("step_transfer_toy_turbo", "toy-turbo")])
def test_the_committed_tables_are_what_the_report_renders_from_the_committed_figures(stem, model):
    """experiments/results/<stem>.md is `markdown()` of the JSON beside it: neither was edited by hand. One pair
    per one-step model whose SAEs were tested: the toy's and toy-turbo's, both on toy-base."""
    import experiments.step_transfer as st

    data = json.loads((st.RESULTS / f"{stem}.json").read_text())
    assert st.markdown(data) == (st.RESULTS / f"{stem}.md").read_text()
    assert data["model"] == model and data["sae_root"] == f"saes/pretrained/{model}"
    assert data["base"]["model"] == "toy-base" and "base, 30 steps, CFG 5, cond" in data["settings"]
    assert all(entry["model"] == model for name, entry in data["settings"].items() if not name.startswith("base"))


def test_another_one_step_models_saes_get_files_and_results_of_their_own_and_a_wrong_model_is_refused(tmp_path,
                                                                                                      monkeypatch,
                                                                                                      capsys):
    """`--model` tests another embedded one-step model's shipped SAEs (`toy-turbo`, of toy-base's lineage): what it
    generates is shared (the captures are named by the generating model), what depends on its SAEs (measured/,
    riebench/, paint/, the results and the docs tables) is its own, and the toy's names stay as they were."""
    import experiments.step_transfer as st

    for wrong, says in (("toy-base", "not an embedded one-step model"), ("sdxl-turbo", "not an embedded one-step"),
                        ("toy-v3", "not an embedded one-step model"), ("nope", "not an embedded one-step")):
        assert st.main(["report", "--model", wrong, "--out", str(tmp_path)]) == 2
        assert f"--model: {wrong!r} is not" in capsys.readouterr().err
    # a base model of other channels: the SAEs cannot read its blocks
    other = tmp_path.parent / f"{tmp_path.name}-other-base"
    (other / "unet").mkdir(parents=True)
    (other / "recipe.json").write_text(json.dumps({"objective": "v_prediction", "sampling_steps": 3, "guidance": 2}))
    (other / "unet" / "config.json").write_text(json.dumps({"block_out_channels": [8, 16, 32]}))
    assert st.main(["causal", "--model", "toy-v2", "--base", str(other), "--out", str(tmp_path)]) == 2
    assert "U-Net has other blocks or channels than toy-v2's" in capsys.readouterr().err
    assert st.main(["report", "--model", "toy-v2", "--out", str(tmp_path)]) == 1  # nothing run yet: one line
    err = capsys.readouterr().err
    assert "is missing: run `python -m experiments.step_transfer run --model toy-v2`" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())

    study = st.Study.of("toy-v2", tmp_path)  # what the commands above were given, passed explicitly
    assert study.model == "toy-v2" and study.sae_root == st.REPO / "saes" / "pretrained" / "toy-v2"
    assert study.settings["4 steps, CFG 5, uncond"].slug == "toy-v2-steps4-g5-uncond"
    assert study.sae_dir("measured") == tmp_path / "measured-toy-v2"
    assert study.results_stem() == "step_transfer_toy_v2"
    assert study.docs_markers() == ("<!-- step-transfer toy-v2 -->", "<!-- /step-transfer toy-v2 -->")
    study = st.Study.of("toy", tmp_path)
    assert study.settings["4 steps"].slug == "steps4-g0-cond" and study.sae_dir("paint") == tmp_path / "paint"
    assert (study.results_stem(), study.docs_markers()[0]) == ("step_transfer", "<!-- step-transfer -->")


def test_both_halves_of_a_guided_generation_are_captured_from_one_generation_as_from_two(toy_t2i):
    """The conditional and unconditional settings of one guided generation are captured together (half the
    generations), with the same updates and quality as capturing each half on its own."""
    import experiments.step_transfer as st
    from interp.ground_truth import ground_truth_for

    truth = ground_truth_for(toy_t2i)
    prompts, scenes = st.held_out_prompts(truth, 2, seed=5)
    blocks = ["mid_block.attentions.0", "up_blocks.1.attentions.2"]
    setting = st.Setting(2, 5.0, "cond")
    together, quality = st.capture_setting(toy_t2i, blocks, prompts, [0, 1], setting, truth, scenes,
                                           halves=("cond", "uncond"))
    for half in ("cond", "uncond"):
        captured, alone_quality = st.capture_setting(toy_t2i, blocks, prompts, [0, 1], st.Setting(2, 5.0, half),
                                                     truth, scenes)
        alone = captured[half]
        assert alone_quality == quality
        for b in blocks:
            assert together[half][b].shape == (2, 2, *alone[b].shape[2:]) and torch.equal(together[half][b], alone[b])
    assert not torch.equal(together["cond"][blocks[0]], together["uncond"][blocks[0]])
